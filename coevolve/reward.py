"""The training reward, defined here and nowhere else.

Success is the benchmark's verdict (BFCL: every turn passes its state and response checks)
and stays what evaluation reports. Training needs a reward with a gradient, so an episode
is scored in two parts, both in [0, 1]:

- ``progress``: the mean over the episode's turns of

      1                                   if the turn passes the benchmark's checks
      PARTIAL_SCALE * reproduced / n_ref  otherwise

  where ``n_ref`` is the number of the turn's reference calls and ``reproduced`` how many of
  them the agent's calls *in that turn* reproduce: same function, same arguments once the
  function's defaults are filled in, and a call that did not fail (unless the reference call
  failed too). Each agent call reproduces at most one reference call. A failed turn whose
  reference is empty scores 0 (the agent should not have called anything). Turns the episode
  never reached score 0. ``PARTIAL_SCALE < 1`` keeps a pass worth more than any partial
  reproduction. ``progress`` has no format term: it is what validation calls a positive
  reward ("the policy made progress on the task").
- ``format``: the share of the agent's call attempts that were well formed (parsed, named a
  known function, passed an object of arguments within the environment's bounds, and did not
  overrun the step's time limit); 0 when the agent attempted no call.

    reward = clip(progress + FORMAT_WEIGHT * format, 0, 1)

so an episode that passes every turn earns 1, and between two failures the one that reproduced more of
the reference earns more; well-formed calls add a small bonus (at most ``FORMAT_WEIGHT``).
``EpisodeScore.reward`` is this value; ``rollouts.reward_progress`` / ``reward_format`` keep
the parts, ``rollouts.success`` the verdict.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from coevolve.types import EpisodeScore

PARTIAL_SCALE = 0.5  # most a failed turn can earn, reproducing all of its reference calls
FORMAT_WEIGHT = 0.1  # weight of the well-formed-call share in the training reward

Call = dict[str, Any]  # {"name", "arguments", "error" (None when it ran without failing)}


def _canonical(value: Any) -> str:
    """A comparison key that treats 1 and 1.0 alike and ignores dict key order."""

    def norm(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, int):
            return float(v) if abs(v) < 2**53 else str(v)  # exact as a float, else compared as text
        if isinstance(v, float):
            return v if math.isfinite(v) else str(v)
        if isinstance(v, (list, tuple)):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {str(k): norm(x) for k, x in v.items()}
        return repr(v)

    return json.dumps(norm(value), sort_keys=True)


def reproduced(
    reference: Sequence[Call],
    agent: Sequence[Call],
    normalize: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
) -> int:
    """How many of ``reference`` calls the ``agent`` calls reproduce (a one-to-one matching).

    A reference call is reproduced by an agent call of the same name whose arguments are equal
    after ``normalize(name, arguments)`` (e.g. filling in the function's defaults) and that did
    not fail, unless the reference call failed as well (its ``error`` is set).
    """
    normalize = normalize or (lambda name, args: dict(args))
    unused = [
        (c["name"], _canonical(normalize(c["name"], c["arguments"])), bool(c.get("error")))
        for c in agent
        if isinstance(c.get("name"), str) and isinstance(c.get("arguments"), dict)
    ]
    count = 0
    for ref in reference:
        key = (ref["name"], _canonical(normalize(ref["name"], ref.get("arguments", {}))))
        ref_failed = bool(ref.get("error"))
        for i, (name, args, failed) in enumerate(unused):
            if (name, args) == key and (not failed or ref_failed):
                del unused[i]
                count += 1
                break
    return count


def turn_progress(passed: bool, n_reference: int, n_reproduced: int) -> float:
    """Progress of one turn: 1 if it passes, else ``PARTIAL_SCALE`` x the reproduced share."""
    if passed:
        return 1.0
    if n_reference <= 0:
        return 0.0
    return PARTIAL_SCALE * min(n_reproduced, n_reference) / n_reference


def episode_progress(turns: Sequence[float], n_turns: int) -> float:
    """Mean turn progress over all ``n_turns`` turns (turns never reached count 0)."""
    if n_turns <= 0:
        return 0.0
    return sum(turns[:n_turns]) / n_turns


def format_share(n_attempts: int, n_malformed: int) -> float:
    """Share of well-formed call attempts; 0 without any attempt."""
    if n_attempts <= 0:
        return 0.0
    return max(0, n_attempts - n_malformed) / n_attempts


def training_reward(progress: float, format: float) -> float:
    """``clip(progress + FORMAT_WEIGHT * format, 0, 1)``: the reward GRPO optimizes."""
    return min(1.0, max(0.0, progress + FORMAT_WEIGHT * format))


def episode_score(
    turn_passed: Sequence[bool],
    turn_progress: Sequence[float],
    n_turns: int,
    failure: str,
    n_calls: int,
    n_malformed: int,
) -> EpisodeScore:
    """The ``EpisodeScore`` of an episode scored turn by turn: ``turn_passed`` / ``turn_progress``
    of the turns that ended, ``failure`` the first failed check ("" if none). It succeeds when
    every one of the ``n_turns`` turns ended and passed; turns never reached count as failed."""
    reason = failure
    if len(turn_passed) < n_turns and not reason:
        reason = f"episode ended at turn {len(turn_passed)} of {n_turns}"
    progress = episode_progress(turn_progress, n_turns) if n_turns else float(not reason)
    fmt = format_share(n_calls, n_malformed)
    return EpisodeScore(
        success=not reason,
        reward=training_reward(progress, fmt),
        turn_passed=list(turn_passed) + [False] * (n_turns - len(turn_passed)),
        reason=reason,
        progress=progress,
        format=fmt,
        n_calls=n_calls,
        n_malformed=n_malformed,
    )


def with_parse_errors(score: Any, n_parse_errors: int) -> Any:
    """``score`` (an ``EpisodeScore``) with ``n_parse_errors`` more malformed call attempts:
    messages the rollout engine could not parse, which never reached the environment.
    A score without parts (``progress is None``: an environment that scores only ``reward``)
    is returned unchanged."""
    if n_parse_errors <= 0 or score.progress is None:
        return score
    attempts, malformed = score.n_calls + n_parse_errors, score.n_malformed + n_parse_errors
    fmt = format_share(attempts, malformed)
    return dataclasses.replace(
        score, n_calls=attempts, n_malformed=malformed, format=fmt, reward=training_reward(score.progress, fmt)
    )
