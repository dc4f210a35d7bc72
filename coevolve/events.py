"""The stage event bus: what a running round tells whoever listens (the CLI's live status,
the flows' Prefect logs and progress artifacts, the reliability benchmark's fault hooks).

    remove = add_listener(lambda event, round, stage, info: print(event, round, stage, info))
    report_progress(1, "train", 3, 8, "GRPO steps")     # -> ("progress", 1, "train", {"done": 3, ...})
    remove()

A ground-floor module: it imports nothing of coevolve, so every layer (``coevolve.round``,
the trainers, ``flows/``) can emit and listen without importing the layer above it.

Listeners get ``(event, round, stage, info)`` with event in {"start", "progress", "done", "skip"};
"progress" carries ``{"done", "total", "note"}``, "done" and "skip" the stage's summary.
"""

from __future__ import annotations

from typing import Callable

Listener = Callable[[str, int, str, dict], None]
_listeners: list[Listener] = []


def add_listener(fn: Listener) -> Callable[[], None]:
    """Register ``fn`` for every stage event; returns the function that removes it."""
    _listeners.append(fn)
    return lambda: _listeners.remove(fn)


def emit(event: str, round_no: int, stage: str, info: dict) -> None:
    """Tell every listener (in the order they were added) of one stage event."""
    for fn in list(_listeners):
        fn(event, round_no, stage, info)


def report_progress(round_no: int, stage: str, done: int, total: int, note: str = "") -> None:
    """Tell the listeners that ``done`` of ``total`` units of a running stage are finished
    (training steps, exploration contexts, validation candidates)."""
    emit("progress", round_no, stage, {"done": done, "total": total, "note": note})
