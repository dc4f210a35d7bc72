"""Stage 2c of a round: abstract exploration runs into candidate task specs.

The steps of one run (one ``(signal_id, run_idx)`` group of the ``explorations`` table)
become one ``Task``: instruction turns, the start state the run explored from, and the
reference calls per turn. An abstractor (registry kind ``"abstractor"``) writes the turns:

- ``template`` (``coevolve.abstractors.template``): no LLM; instructions that state goals
  ("Go into document, create a folder named temp and move final_report.pdf to temp."), from
  per-function goal templates; calls that change nothing and answer nothing are dropped,
  repeats collapse, and turns split at goal boundaries (at most ``max_turns``);
- ``llm`` (``coevolve.abstractors.llm``): an OpenAI-compatible model returns the turns and calls as JSON, checked against
  a schema (``check_spec``); the start state is the run's, never the model's.

Every run yields a ``candidates`` row (part ``<run_id>-candidates``): pending (verdict
NULL) with its spec, or already ``rejected`` with the reason (a useless run, malformed LLM
output). ``coevolve.validate`` decides the rest.

    n = abstract(store, cfg, run_id, round)
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pyarrow.dataset as ds

from coevolve.abstractors.base import Abstractor, Call, Run, describe, split_turns  # noqa: F401  (the stage's types)
from coevolve.abstractors.llm import LLMAbstractor, check_spec  # noqa: F401  (re-exported for callers)
from coevolve.abstractors.template import TemplateAbstractor  # noqa: F401  (re-exported for callers)
from coevolve.config import RunConfig
from coevolve.envs.base import Environment
from coevolve.explore import start_task
from coevolve.registry import resolve
from coevolve.store import Store
from coevolve.synth import STATIC, synthesis_states
from coevolve.tasks import Task


def make_task(run: Run, turns: list[str], reference: list[list[Call]], run_id: str, round_no: int) -> Task:
    """The candidate task of ``run``: the seed's state, env and category, the new turns
    (origin ``static`` for round 0's runs, ``explored`` otherwise)."""
    seed = run.seed
    task = dataclasses.replace(
        seed,
        task_id="",
        turns=list(turns),
        reference_actions=reference,
        split="train",
        origin=STATIC if run.signal_type == STATIC else "explored",
        signal_type=run.signal_type,
        seed_task_id=seed.task_id,
        created_round=round_no,
        run_id=run_id,
    )
    # ids name the seed and the round; the content hash keeps them unique
    task.task_id = f"{seed.task_id.split('~')[0]}~x{round_no}.{task.content_hash[:10]}"
    return task


# ----------------------------------------------------------------------------- the stage
def load_runs(store: Store, cfg: RunConfig, run_id: str, round_no: int) -> list[Run]:
    """This round's exploration runs, grouped per (signal_id, run_idx), with their start tasks
    (the pool's training tasks; in round 0 the synthesis states)."""
    rows = store.read(
        "explorations", filter=(ds.field("run_id") == run_id) & (ds.field("round") == round_no)
    ).to_pylist()
    pool = {r["task_id"]: Task.from_row(r) for r in store.pool_tasks().to_pylist() if r["split"] == "train"}
    env = resolve("environment", cfg.env.name)()
    if round_no == 0:  # round 0 explored training-scenario states, not pool tasks
        pool.update({t.task_id: t for t in synthesis_states(cfg, env)})
    return group_runs(rows, pool, env)


def group_runs(rows: list[dict[str, Any]], starts: dict[str, Task], env: Environment) -> list[Run]:
    """``explorations`` rows grouped into runs per (signal_id, run_idx), in that order, each
    with its start task (``starts[context_task_id]``; runs whose start is unknown are dropped:
    the pool moved on without it)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["signal_id"], r["run_idx"]), []).append(r)
    docs_cache: dict[str, dict[str, dict[str, Any]]] = {}
    runs = []
    for (signal_id, run_idx), steps in sorted(groups.items()):
        steps.sort(key=lambda r: r["step"])
        seed = starts.get(steps[0]["context_task_id"])
        if seed is None:
            continue
        seed = start_task(seed, env)
        if seed.task_id not in docs_cache:
            docs_cache[seed.task_id] = {d["name"]: d for d in env.function_docs(seed)}
        runs.append(Run(signal_id, steps[0]["signal_type"], run_idx, seed, steps, docs_cache[seed.task_id]))
    return runs


def candidate_row(run: Run, run_id: str, round_no: int, result: Task | str) -> dict[str, Any]:
    """A ``candidates`` row: pending with a spec, or rejected with the reason."""
    row = {
        "run_id": run_id,
        "candidate_id": f"{run_id}-r{round_no}-{run.signal_id}-{run.run_idx}",
        "signal_id": run.signal_id,
        "signal_type": run.signal_type,
        "context_task_id": run.seed.task_id,
        "source_run": run.run_idx,
    }
    if isinstance(result, Task):
        row.update(spec=result.to_json(), n_turns=len(result.turns), content_hash=result.content_hash)
    else:
        row.update(spec=json.dumps({"error": result}), n_turns=0, verdict="rejected", reason=result)
    return row


def candidate_rows(cfg: RunConfig, runs: list[Run], run_id: str, round_no: int) -> list[dict[str, Any]]:
    """The ``candidates`` rows of ``runs``, abstracted by ``abstract.abstractor``."""
    abstractor = resolve("abstractor", cfg.abstract.abstractor)(cfg)
    rows = []
    for run, result in zip(runs, abstractor.abstract(runs)):
        if isinstance(result, tuple):
            turns, reference = result
            result = make_task(run, turns, reference, run_id, round_no)
        rows.append(candidate_row(run, run_id, round_no, result))
    return rows


def abstract(store: Store, cfg: RunConfig, run_id: str, round_no: int) -> int:
    """Turn this round's explorations into ``candidates`` rows; return the row count."""
    rows = candidate_rows(cfg, load_runs(store, cfg, run_id, round_no), run_id, round_no)
    return store.write("candidates", round_no, f"{run_id}-candidates", rows)
