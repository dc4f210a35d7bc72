"""Synthesized BFCL tasks for learning tests and training benchmarks.

Round 0 of a run config (``coevolve.round.run_round(.., 0)``: coverage exploration of
training-scenario states, abstraction, mechanical validation) in a scratch store: the same
tasks a real run's seed pool starts from, built in about a second, and deterministic for a
seed. BFCL's questions and ground-truth calls are never read.

    tasks = synthesized_tasks(seed=0, max_turns=1)   # e.g. "List my tickets." -> get_user_tickets()
    train, other = split_by_scenario(tasks, 0.5)     # disjoint scenarios, for a held-out measure
    small = narrow_tools(tasks)                      # tool blocks cut to the set's functions (tiny-model tests)
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from typing import Any

from coevolve.tasks import Task


def synthesized_tasks(
    seed: int = 0, *, max_turns: int | None = None, overrides: dict[str, Any] | None = None
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


def narrow_tools(tasks: list[Task], extra: int = 2) -> list[Task]:
    """Copies of ``tasks`` whose tool block holds only functions that some task of the set calls
    (per task: those of its own classes), plus the first ``extra`` others of its classes as
    distractors. Hidden functions go to the state's ``excluded_function``, the mechanism BFCL
    uses, so the environment neither shows nor dispatches them. A BFCL class documents 10-30
    functions: the full block is 2-5k tokens of the tiny test model's small vocabulary, which a
    CPU learning test cannot afford; the instructions and reference calls stay as synthesized."""
    from coevolve.envs import bfcl_data

    called = {a["name"] for t in tasks for turn in t.reference_actions for a in turn}
    narrowed = []
    for task in tasks:
        names = [d["name"] for c in task.initial_state["involved_classes"] for d in bfcl_data._class_docs(c)]
        keep = [n for n in names if n in called]
        keep += [n for n in names if n not in keep][:extra]
        initial = copy.deepcopy(task.initial_state)
        initial["excluded_function"] = sorted(set(initial.get("excluded_function", [])) | (set(names) - set(keep)))
        narrowed.append(
            dataclasses.replace(task, initial_state=initial, tools=[f for f in task.tools if f in keep] or keep)
        )
    return narrowed
