"""Changes a task asks for and then reverses: a stock added to the watchlist and removed again,
a deposit and an equal withdrawal, a budget set and set back. Found by replay from the task's
start state (``Episode.state_fingerprint``); the template abstractor drops such changes
(``abstractors.template.drop_undone``) and the quality gate rejects a task that keeps one
(``quality``, rule ``undone``).

    reversed_calls(env, task, done, calls)   # indices of calls a later one of calls reverses
"""

from __future__ import annotations

import dataclasses
from typing import Any

from coevolve.envs.base import Environment
from coevolve.tasks import Task
from coevolve.types import ToolCall


def _start(env: Environment, task: Task) -> Any:
    """A fresh episode of ``task``'s start state (one turn, nothing checked)."""
    return env.episode(dataclasses.replace(task, turns=[""], reference_actions=[[]]))


def _replay(
    env: Environment, task: Task, calls: list[dict[str, Any]], steps: bool = True, episode: Any = None
) -> tuple[list[tuple[bool, bool]], str]:
    """``calls`` replayed from ``task``'s start (in ``episode``, a fresh one by default): per
    call (failed, changed the state) when ``steps`` (else no flags: a fingerprint costs about
    as much as a call), and the end state's fingerprint."""
    episode = episode if episode is not None else _start(env, task)
    judge = getattr(env, "observation_error", None)
    flags = []
    before = episode.state_fingerprint() if steps else ""
    for call in calls:
        obs = episode.step(ToolCall(call.get("name", ""), call.get("arguments") or {}))
        if steps:
            after = episode.state_fingerprint()
            flags.append((bool(judge(obs) if judge is not None else obs.error), after != before))
            before = after
    return flags, before if steps else episode.state_fingerprint()


def reversed_calls(env: Environment, task: Task, done: list[dict[str, Any]], calls: list[dict[str, Any]]) -> list[int]:
    """Indices of the changes among ``calls`` (made after ``done``) that later ones reverse:

    - a change without which the later calls end where they ended, one of them now failing
      or changing nothing (a stock added to the watchlist, then removed: without the add, the
      removal changes nothing);
    - two changes that together leave the end state as it would be without both (a deposit
      and an equal withdrawal; a budget set, then set back);
    - a change without which the calls end where they ended, when the same function is called
      again later with one of its values (a price of NVDA set twice: the second overrides it).

    A change a later call of another function includes (``touch`` a file, then ``echo`` into
    it, which would also create it) is no reversal. Nothing for an environment without
    ``state_fingerprint``."""
    first = _start(env, task)
    if not calls or not hasattr(first, "state_fingerprint"):
        return []
    flags, end = _replay(env, task, done + calls, episode=first)
    k = len(done)
    changed = [i for i in range(len(calls)) if flags[k + i][1]]
    out: set[int] = set()
    matters = set()  # changes without which the calls end elsewhere
    for i in changed:
        without, end_without = _replay(env, task, done + calls[:i] + calls[i + 1 :])
        later = zip(range(i + 1, len(calls)), without[k + i :])
        if end_without != end:
            matters.add(i)
        elif any(flags[k + j][1] and (failed or not change) for j, (failed, change) in later):
            out.add(i)
        elif any(_same_target(calls[i], c) for c in calls[i + 1 :]):
            out.add(i)  # the same function again, on the same thing, overrides it: a price set twice
    for n, i in enumerate(changed):
        for j in changed[n + 1 :]:
            if i not in matters or j not in matters:  # one a later call includes: no pair of opposites
                continue
            if _replay(env, task, done + [c for m, c in enumerate(calls) if m not in (i, j)], steps=False)[1] == end:
                out |= {i, j}
    return sorted(out)


def _same_target(first: dict[str, Any], later: dict[str, Any]) -> bool:
    """Is ``later`` the same function as ``first``, sharing one of its argument values?"""
    if first.get("name") != later.get("name"):
        return False
    values = {repr(v) for v in (first.get("arguments") or {}).values()}
    return any(repr(v) in values for v in (later.get("arguments") or {}).values())
