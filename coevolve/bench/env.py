"""``coevolve bench env``: time replaying and scoring every entry's ground truth, the environment
alone and then through the policy + rollout engine.

    coevolve bench env                                  # all 800 BFCL-V3 entries, both ways
    coevolve bench env --category multi_turn_base --no-engine

    tasks, seconds = load_tasks(env, [])                # every entry of every category
    per_category, seconds = replay(env, tasks)          # env only: reference calls + scorer
    result = replay_through_engine(env, tasks)          # an EvalResult, as ``coevolve eval`` has it
"""

from __future__ import annotations

import time
from typing import Any

from coevolve.tasks import Task


def load_tasks(env: Any, categories: list[str]) -> tuple[list[Task], float]:
    """Every entry of ``categories`` (all of the environment's by default), and the seconds the
    loading took. An unknown category raises ``KeyError``."""
    t0 = time.perf_counter()
    cats: list[str | None] = [*categories] or list(getattr(env, "categories", [])) or [None]
    tasks = [t for c in cats for t in env.load_tasks(categories=[c] if c else None, limit=None)]
    return tasks, time.perf_counter() - t0


def replay(env: Any, tasks: list[Task]) -> tuple[dict[str, dict], float]:
    """The reference calls of ``tasks`` replayed and scored by the environment alone: accuracy
    per category (``coevolve.evaluate.summarize``'s) and the seconds the replay took."""
    from coevolve.evaluate import replay_reference, summarize

    t0 = time.perf_counter()
    scores = replay_reference(env, tasks)
    seconds = time.perf_counter() - t0
    return summarize(tasks, scores)[2], seconds


def replay_through_engine(env: Any, tasks: list[Task]):
    """The same replay as a policy through the rollout engine (``evaluate`` with ``ReplayPolicy``,
    the default config, no store): an ``EvalResult`` with ``per_category`` and ``seconds``."""
    from coevolve.config import RunConfig
    from coevolve.evaluate import evaluate
    from coevolve.policy.replay import ReplayPolicy

    return evaluate(None, RunConfig(), "bench", 0, ReplayPolicy(tasks), tasks, env=env)
