"""``coevolve bench validate``: how fast candidate validation is, on BFCL.

    coevolve bench validate                                  # 1,000 candidates vs a pool of 10,000
    coevolve bench validate --set policy.model=tiny --policy tiny --solver-tasks 8
    bench(load_config(None), candidates=100, pool=1000, echo=print)   # the same, from Python

It builds a pool of ``--pool`` BFCL tasks (every contiguous window of turns of the 800
multi-turn entries, then renamed copies until the size is reached) and ``--candidates``
candidates the way a round makes them (rule explorer + template abstractor from BFCL
entries of all four categories), plus planted duplicates, unsafe tasks and tasks whose calls
have no effect. It times the mechanical part (spec decoding, safety rules, exact and
near-duplicate removal against the pool, pass 1: replay, scoring and the no-effect probe
in fresh environments), then, with ``--policy``, pass 2: the configured solver's attempts
per second on ``--solver-tasks`` of the candidates that passed.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import Any, Callable

from coevolve.config import RunConfig


def _pool_rows(env, size: int) -> list[dict]:
    tasks = env.load_tasks()
    rows: list[dict] = []
    copy = 0
    while len(rows) < size:
        for t in tasks:
            for i in range(len(t.turns)):
                for j in range(i + 1, len(t.turns) + 1):
                    turns = [f"{s} (variant {copy})" if copy else s for s in t.turns[i:j]]
                    w = dataclasses.replace(
                        t,
                        task_id=f"{t.task_id}[{i}:{j}]#{copy}",
                        turns=turns,
                        reference_actions=t.reference_actions[i:j],
                        split="train",
                    )
                    rows.append(w.to_row())
                    if len(rows) == size:
                        return rows
        copy += 1
    return rows


def _candidates(env, cfg, n: int, pool_rows: list[dict]) -> list[dict]:
    from coevolve.abstract import Run, TemplateAbstractor, candidate_row, make_task
    from coevolve.explore import ExploreContext, run_sessions, session_rows, start_task
    from coevolve.explorers.rule import RuleExplorer
    from coevolve.tasks import Task

    tasks = env.load_tasks()
    runs = cfg.explore.runs_per_context
    n_ctx = -(-n // runs)
    contexts = []
    for i in range(n_ctx):
        t = tasks[(i * 7) % len(tasks)]
        focus = list(dict.fromkeys(c["name"] for turn in t.reference_actions for c in turn))
        kind = ("forgetting", "boundary", "rare")[i % 3]
        contexts.append(
            ExploreContext(
                f"b{i:05d}",
                kind,
                t,
                focus[:3],
                sequence=kind == "rare",
                avoid=frozenset(cfg.validate.blocked_functions),
            )
        )
    sessions = run_sessions(RuleExplorer(cfg), contexts, env, runs, cfg.explore.steps_per_run, cfg.seed)
    rows = session_rows("bench", sessions)
    by_run: dict = {}
    for r in rows:
        by_run.setdefault((r["signal_id"], r["run_idx"]), []).append(r)
    docs: dict[str, dict[str, dict[str, Any]]] = {}
    run_objs = []
    for s in sessions:
        start = start_task(s.context.task)
        docs.setdefault(start.task_id, {d["name"]: d for d in env.function_docs(start)})
        run_objs.append(
            Run(
                s.context.signal_id,
                s.context.signal_type,
                s.run_idx,
                start,
                by_run[(s.context.signal_id, s.run_idx)],
                docs[start.task_id],
            )
        )
    out = []
    for run, result in zip(run_objs, TemplateAbstractor(cfg).abstract(run_objs)):
        spec = make_task(run, *result, "bench", 1) if isinstance(result, tuple) else result
        out.append(candidate_row(run, "bench", 1, spec))
    out = out[:n]
    # plant known rejections: 5% copies of pool tasks, 5% destructive calls, 5% read-only repeats
    for k in range(0, len(out), 20):
        planted = Task.from_row(pool_rows[(k * 37) % len(pool_rows)])
        out[k] = {**out[k], "spec": planted.to_json(), "verdict": None, "reason": None}
    for k in range(10, len(out), 20):
        t = Task.from_row(pool_rows[(k * 11) % len(pool_rows)])
        t.reference_actions[0] = t.reference_actions[0] + [{"name": "rm", "arguments": {"file_name": "x"}}]
        out[k] = {**out[k], "spec": t.to_json(), "verdict": None, "reason": None}
    for k in range(5, len(out), 20):
        if out[k].get("verdict") or not out[k].get("spec"):  # the abstractor rejected this run: no spec
            continue
        t = Task.from_json(out[k]["spec"])
        if t.reference_actions and t.reference_actions[-1]:
            # a last turn that repeats the turn before it (same calls): no new state, no new answer
            t = dataclasses.replace(
                t,
                turns=t.turns + ["Again."],
                reference_actions=t.reference_actions + [list(t.reference_actions[-1])],
                task_id=t.task_id + "~again",
            )
            out[k] = {**out[k], "spec": t.to_json(), "verdict": None, "reason": None}
    return out


def bench(
    cfg: RunConfig,
    *,
    candidates: int = 1000,
    pool: int = 10_000,
    policy: str | None = None,
    solver_tasks: int = 16,
    echo: Callable[[str], Any] = print,
) -> None:
    """Time the mechanical part of validation (dedup, safety, pass 1) of ``candidates`` BFCL
    candidates against a pool of ``pool`` tasks and, with ``policy``, pass 2's attempts per second
    on ``solver_tasks`` of those that passed; print the figures through ``echo``."""
    from coevolve.envs.bfcl import BfclEnvironment
    from coevolve.registry import resolve
    from coevolve.tasks import Task
    from coevolve.duplicates import pool_index
    from coevolve.validate import reason_kind, validate_rows

    env = BfclEnvironment()
    t0 = time.perf_counter()
    pool_rows = _pool_rows(env, pool)
    cands = _candidates(env, cfg, candidates, pool_rows)
    t_setup = time.perf_counter() - t0
    echo(f"setup: pool of {len(pool_rows):,} tasks, {len(cands):,} candidates built in {t_setup:.1f} s")

    t0 = time.perf_counter()
    pool_index(pool_rows, cfg.validate.near_duplicate_threshold)
    t_index = time.perf_counter() - t0
    t0 = time.perf_counter()
    judged = validate_rows(cands, pool_rows, env, cfg, None)
    t_mech = time.perf_counter() - t0
    verdicts = Counter(r["verdict"] for r in judged)
    reasons = Counter(reason_kind(r["reason"]) for r in judged if r["verdict"] == "rejected")
    echo(
        f"mechanical part (dedup, safety, pass 1): {len(cands):,} candidates vs {len(pool_rows):,} pool tasks in "
        f"{t_mech:.2f} s ({1000 * t_mech / max(1, len(cands)):.2f} ms per candidate; pool index {t_index:.2f} s of it) "
        f"[{'OK' if t_mech < 10 else 'SLOW'}: goal < 10 s]"
    )
    echo(f"verdicts: {dict(verdicts)}; rejections: {dict(reasons.most_common())}")

    passed = [Task.from_json(r["spec"]) for r in judged if r["verdict"] == "accepted"][:solver_tasks]
    solver = resolve("solver", cfg.validate.solver)(cfg, None, "bench", 1, policy)
    if not passed or solver is None:
        echo(f"pass 2 not timed: {'no candidate passed' if not passed else 'no --policy (or validate.solver none)'}")
        return
    t0 = time.perf_counter()
    attempts = solver(passed)
    dt = time.perf_counter() - t0
    n = sum(len(a.successes) for a in attempts)
    solved = sum(any(a.successes) for a in attempts)
    mean_best = sum(max(a.progress, default=0.0) for a in attempts) / len(passed)
    echo(
        f"pass 2, solver {cfg.validate.solver!r}: {n} attempts on {len(passed)} tasks in {dt:.2f} s "
        f"= {n / dt:.1f} attempts/s; solved {solved}/{len(passed)}, mean best progress {mean_best:.2f}"
    )
