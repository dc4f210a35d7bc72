"""Parse Hermes / Qwen tool calls out of raw assistant text.

    <tool_call>
    {"name": "cd", "arguments": {"folder": "document"}}
    </tool_call>

A message may hold several blocks; text outside them is the message content. Anything
malformed (bad JSON, missing name, non-object arguments, unclosed or stray tags) makes the
whole message a parse error: no call of it is executed, and the error text, which says how
to write a call correctly, is shown to the agent as its observation. ``parse_tool_calls``
never raises; model output is read with ``json`` only, never evaluated.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from coevolve.types import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")
FORMAT_HINT = 'Write each call as <tool_call>{"name": "<function>", "arguments": {...}}</tool_call>.'


@dataclass
class ParseResult:
    calls: list[ToolCall] = field(default_factory=list)  # empty when error is set
    content: str = ""  # the text outside <tool_call> blocks, stripped
    error: str | None = None  # what was wrong, phrased for the agent


def _parse_block(body: str, index: int) -> ToolCall | str:
    """One block body -> a ToolCall, or an error message naming the block."""
    where = f"tool call {index}"
    text = body.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    if not text:
        return f"{where} is empty"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except (ValueError, RecursionError) as exc:  # e.g. integers too long, nesting too deep
        return f"{where} is not valid JSON ({type(exc).__name__})"
    if not isinstance(obj, dict):
        return f"{where} must be a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        return f"{where} needs a 'name' that is a function name, got {json.dumps(name)[:80]}"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        # Some models double-encode the arguments as a JSON string.
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return f"{where} ({name}): 'arguments' is a string that is not a JSON object"
    if not isinstance(args, dict):
        return f"{where} ({name}): 'arguments' must be a JSON object, got {type(args).__name__}"
    extra = sorted(set(obj) - {"name", "arguments", "parameters"})
    if extra:
        return f"{where} ({name}) has unexpected keys {extra}; only 'name' and 'arguments' are allowed"
    return ToolCall(name=name, arguments=args)


def parse_tool_calls(text: str) -> ParseResult:
    """Split assistant ``text`` into tool calls and content; never raises.

    Returns ``ParseResult(calls, content, error)``: on success ``error`` is None and ``calls``
    holds every block in order; on any malformed block ``calls`` is empty and ``error`` says
    what was wrong and how to fix it.
    """
    try:
        return _parse(text if isinstance(text, str) else str(text))
    except Exception as exc:  # a parser bug must not kill a rollout: report it as a parse error
        return ParseResult(error=f"the message could not be parsed ({type(exc).__name__}). {FORMAT_HINT}")


def _parse(text: str) -> ParseResult:
    bodies = [m.group(1) for m in _BLOCK.finditer(text)]
    content = _BLOCK.sub("", text).strip()
    if OPEN in content:
        return ParseResult(content=content, error=f"a {OPEN} block is not closed with {CLOSE}. {FORMAT_HINT}")
    if CLOSE in content:
        return ParseResult(content=content, error=f"{CLOSE} appears without an opening {OPEN}. {FORMAT_HINT}")
    calls: list[ToolCall] = []
    for i, body in enumerate(bodies, start=1):
        parsed = _parse_block(body, i)
        if isinstance(parsed, str):
            return ParseResult(content=content, error=f"{parsed}. {FORMAT_HINT}")
        calls.append(parsed)
    return ParseResult(calls=calls, content=content)
