"""What every abstractor works on: an exploration run, and the shape of its answer.

``coevolve.abstract`` (the stage) groups ``explorations`` rows into ``Run``s; an abstractor
(registry kind ``"abstractor"``) answers, per run, ``(turns, reference calls per turn)`` or
the reason the run yields no task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from coevolve.tasks import Task

Call = dict[str, Any]  # {"name": str, "arguments": dict}


@dataclass
class Run:
    """The explored steps of one run, with the task it started from."""

    signal_id: str
    signal_type: str
    run_idx: int
    seed: Task  # the context task, as exploration started from it (see explore.start_task)
    steps: list[dict[str, Any]]  # explorations rows of the run, in step order
    docs: dict[str, dict[str, Any]]  # function name -> function doc (Environment.function_docs)

    def successful_calls(self) -> list[Call]:
        """The calls that ran without error, in order. Failed calls leave the state
        unchanged, so these replay the same from the start state (repeats stay: ``cd a``
        twice is two moves)."""
        return [
            {"name": s["action_name"], "arguments": json.loads(s["action_args"] or "{}")}
            for s in self.steps
            if s["action_name"] is not None and s["error"] is None
        ]


class Abstractor(Protocol):
    def abstract(self, runs: list[Run]) -> list[tuple[list[str], list[list[Call]]] | str]:
        """Per run: ``(turns, reference calls per turn)``, or the reason it yields no task."""
        ...


def describe(doc: dict[str, Any]) -> str:
    """The function's own one-sentence description (BFCL prefixes the class blurb)."""
    text = doc.get("description", "") or doc.get("name", "")
    text = text.split("Tool description:", 1)[-1].strip()
    sentence = text.split(". ")[0].strip().rstrip(".")
    return sentence or doc.get("name", "call the function")


def split_turns(items: list[Any], max_turns: int) -> list[list[Any]]:
    """Contiguous, as-even-as-possible groups of ``items`` (earlier groups take the remainder)."""
    n = max(1, min(max_turns, len(items)))
    size, extra = divmod(len(items), n)
    out, i = [], 0
    for t in range(n):
        k = size + (1 if t < extra else 0)
        out.append(items[i : i + k])
        i += k
    return out
