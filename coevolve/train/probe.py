"""Synthesized BFCL tasks for learning tests and training benchmarks.

Round 0 of a run config (``coevolve.round.run_round(.., 0)``: coverage exploration of
training-scenario states, abstraction, mechanical validation) in a scratch store: the same
tasks a real run's seed pool starts from, built in about a second, and deterministic for a
seed. BFCL's questions and ground-truth calls are never read.

    tasks = synthesized_tasks(seed=0, max_turns=1)   # e.g. "List my tickets." -> get_user_tickets()
    train, other = split_by_scenario(tasks, 0.5)     # disjoint scenarios, for a held-out measure
"""

from __future__ import annotations

import tempfile
from typing import Any

from coevolve.tasks import Task


def synthesized_tasks(seed: int = 0, *, max_turns: int | None = None, overrides: dict[str, Any] | None = None
                      ) -> list[Task]:
    """The seed pool round 0 synthesizes for the embedded default with ``seed`` (plus
    ``overrides``), as tasks sorted by id; ``max_turns`` keeps tasks of at most that many turns."""
    from coevolve.config import load_config
    from coevolve.round import pool_tasks, run_round
    from coevolve.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, {"store": tmp, "run_name": "probe", "seed": seed, **(overrides or {})})
        store = Store(tmp)
        run_round(store, cfg, 0)
        tasks = pool_tasks(store, "train")
    if max_turns is not None:
        tasks = [t for t in tasks if len(t.turns) <= max_turns]
    return sorted(tasks, key=lambda t: t.task_id)


def split_by_scenario(tasks: list[Task], share: float) -> tuple[list[Task], list[Task]]:
    """``(first, rest)``: the tasks of the first ``share`` of their scenarios (in id order) and
    the others, so that no scenario state is in both."""
    from coevolve.envs.bfcl_data import scenario_of

    def scenario(task: Task) -> int:  # a synthesized task's id extends its state's: <state id>~<suffix>
        return scenario_of(task.task_id.split("~", 1)[0])

    scenarios = sorted({scenario(t) for t in tasks})
    first = set(scenarios[: max(1, round(share * len(scenarios)))])
    return [t for t in tasks if scenario(t) in first], [t for t in tasks if scenario(t) not in first]
