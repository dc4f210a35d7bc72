"""AgentDojo's tool results as text and back: how a result is rendered for a model, read
back as data, told apart from a failure, and compared without its wall-clock stamps.

AgentDojo renders a tool's result as it shows it to a model (pydantic models and lists as
YAML, dicts and plain values with ``str``); a created file's ``last_modified`` or a sent
email's ``timestamp`` carries the time of the run, so states and results are compared with
those stamps masked (``@clock``).

    text = render_result(result)                    # what the agent sees
    data = parse_result(text)                       # JSON data again, or None for nothing/an error
    returned_failure("404 Not Found")               # "404 Not Found": a failure the tool returned
    clock_free_text(text, opened)                   # datetimes at or after ``opened`` as @clock
    clock_free(env.model_dump(), opened)            # the same for a state
"""

from __future__ import annotations

import ast
import datetime
import re
from typing import Any


def clock_free(obj: Any, opened: datetime.datetime) -> Any:
    """``obj`` (a model dump) with clock stamps (datetimes at or after ``opened``: a sent
    email's timestamp, a file's last_modified) replaced by a marker, so two runs of the same
    calls compare equal."""
    if isinstance(obj, dict):
        return {k: clock_free(v, opened) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clock_free(v, opened) for v in obj]
    if isinstance(obj, datetime.datetime) and obj.replace(tzinfo=None) >= opened:
        return "@clock"
    return obj


_DATETIME_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?")


def clock_free_text(text: str, opened: datetime.datetime) -> str:
    """A rendered result with clock stamps (datetimes at or after ``opened``) masked."""
    cut = opened.isoformat(sep=" ")[:19]
    return _DATETIME_TEXT.sub(lambda m: "@clock" if m.group(0).replace("T", " ")[:19] >= cut else m.group(0), text)


def render_result(result: Any) -> str:
    """A tool's result as AgentDojo shows it to a model (what ``parse_result`` reads back)."""
    from agentdojo.agent_pipeline.tool_execution import tool_result_to_str

    return tool_result_to_str(result)


# A clock-masked datetime that opens a YAML scalar ("timestamp: @clock"): '@' cannot start one
_CLOCK_SCALAR = re.compile(r"(?m)^([ \t]*(?:- )*(?:[^\s'\"#-][^:\n]*: )?)@clock[ \t]*$")


def _plain(obj: Any) -> Any:
    """Parsed YAML or Python literals as JSON data: dates and datetimes as text, tuples as lists."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_plain(v) for v in obj]
    if isinstance(obj, datetime.datetime):
        return obj.isoformat(sep=" ")
    if isinstance(obj, datetime.date):
        return obj.isoformat()
    return obj


def parse_result(content: str) -> Any:
    """A rendered result (``render_result``) read back as JSON data, or None for nothing or an error.

    ``render_result`` writes pydantic models and lists as YAML, dicts and plain values with ``str``
    (``{'message': 'Transaction to ... sent.'}``, ``1810.0``, ``None``); text that is neither
    YAML nor a Python literal comes back as the text."""
    text = content.strip() if isinstance(content, str) else ""
    if not text or text == "None" or text.startswith("Error: "):
        return None
    if text[0] in "{[(":
        try:
            return _plain(ast.literal_eval(text))  # literals only: nothing is evaluated
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    import yaml

    try:
        return _plain(yaml.safe_load(_CLOCK_SCALAR.sub(r"\1'@clock'", text)))
    except yaml.YAMLError:
        return text


_NOTHING = {"": "nothing found", "[]": "nothing found", "{}": "nothing found", "404 Not Found": "404 Not Found"}
_EMPTY_LISTING = re.compile(r"(Hotel Names|Restaurant in .*|Car Rental Companies in .*):")


def returned_failure(content: str) -> str | None:
    """The failure an AgentDojo tool *returned* instead of raising, or None: an empty result
    (a file path ``read_file`` does not have, a city pair without flights, a filename no file
    has, a day without events, names no hotel has: ``""``, ``[]``, ``{}``), a web page that is
    not there (``404 Not Found``), a city without the places asked for (``Hotel Names: ``)."""
    text = content.strip() if isinstance(content, str) else ""
    if text in _NOTHING:
        return _NOTHING[text]
    if _EMPTY_LISTING.fullmatch(text):
        return f"{text} nothing found"
    return None
