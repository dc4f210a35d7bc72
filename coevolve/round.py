"""One co-evolution round as seven resumable stages over the store; round 0 synthesizes the pool.

    round 0 (the store has no pool):       explore -> abstract -> validate -> commit
    rounds 1..N: train -> signals -> explore -> abstract -> validate -> commit -> evaluate

Round 0 explores coverage contexts on training-scenario states (``coevolve.synth``), not
signals, and validates with mechanical checks only (no policy is trained yet); it commits
pool v1 (``origin = 'static'``). It has stage markers, live status and a ``rounds`` row like
any round.

Each stage is one call into the library (``coevolve.train``, ``coevolve.signals``, ...);
this module only decides what each stage reads, records a completion marker in the store
once the stage's outputs are written (``runs/<run>/round=<r>/<stage>.json``), and skips a
stage whose marker exists. Stage outputs are written to deterministically named parts,
so a stage interrupted half-way simply runs again and overwrites: a rerun never
duplicates rows. The marker is written only after the stage's parts are written and recorded
in their manifests, each fsynced first on a local store (``coevolve.store``), so a durable
marker never sits beside a part that is not. Prefect flows (``flows/``) call ``round_stages``, ``run_stage`` and ``record_round``.
Stages announce themselves ("start", "done", "skip") on the event bus of ``coevolve.events``.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

import pyarrow.dataset as ds

from coevolve.config import RunConfig
from coevolve.events import emit
from coevolve.store import ConcurrentCommitError, Store
from coevolve.store_open import open_run_store
from coevolve.tasks import Task
from coevolve.timing import SPLIT_COLUMNS, Splits

log = logging.getLogger("coevolve.round")

STAGES = ("train", "signals", "explore", "abstract", "validate", "commit", "evaluate")
SYNTH_STAGES = ("explore", "abstract", "validate", "commit")  # round 0


@dataclass
class RoundContext:
    store: Store
    cfg: RunConfig
    round: int

    @property
    def run_id(self) -> str:
        return self.cfg.run_name

    def marker(self, stage: str) -> dict | None:
        return self.store.stage_done(self.run_id, self.round, stage)

    def policy_in_ref(self) -> str:
        """The policy this round starts from, as recorded: the latest earlier round's checkpoint
        reference (``coevolve.checkpoints``), or the base model's name."""
        for r in range(self.round - 1, 0, -1):
            done = self.store.stage_done(self.run_id, r, "train")
            if done:
                return done["checkpoint"]
        return self.cfg.policy.model

    def policy_in(self) -> str:
        """The policy this round starts from, loadable here: the previous round's checkpoint
        (downloaded from the store's lineage if remote), or the base model."""
        return self._local(self.policy_in_ref())

    def policy_out(self) -> str:
        done = self.marker("train")
        return self._local(done["checkpoint"]) if done else self.policy_in()

    def _local(self, ref: str) -> str:
        from coevolve.checkpoints import materialize

        return ref if ref == self.cfg.policy.model else materialize(self.store, self.cfg, ref)


# ----------------------------------------------------------------------------- seeding
def round_stages(store: Store, cfg: RunConfig, round_no: int) -> tuple[str, ...]:
    """The stages of ``round``. Round 0 synthesizes the seed pool; it is skipped (no stages)
    when the store already holds a pool that this run's round 0 did not start (a pool
    committed by hand or by another run of the lineage)."""
    if round_no > 0:
        return STAGES
    started = any(store.stage_done(cfg.run_name, 0, stage) for stage in SYNTH_STAGES)
    if store.latest_pool() is not None and not started:
        return ()
    return SYNTH_STAGES


def run_round(store: Store, cfg: RunConfig, round_no: int) -> dict | None:
    """Run (or resume) every stage of ``round``; return its ``rounds`` row (None: skipped round 0)."""
    stages = round_stages(store, cfg, round_no)
    if not stages:
        return None
    for stage in stages:
        run_stage(store, cfg, round_no, stage)
    return record_round(store, cfg, round_no)


def seed_pool(store: Store, cfg: RunConfig) -> dict:
    """Round 0: synthesize and commit pool v1 unless the store already has a pool; returns
    ``{"version", "size", ...}`` of the pool."""
    row = run_round(store, cfg, 0)
    latest = store.latest_pool()
    if latest is None:
        raise RuntimeError("round 0 committed no pool")
    return {"version": latest.version, "size": _train_size(store), "skipped": row is None}


def pool_tasks(store: Store, split: str) -> list[Task]:
    table = store.pool_tasks()
    return [Task.from_row(r) for r in table.to_pylist() if r["split"] == split]


# ----------------------------------------------------------------------------- stages
def _feedback_off(ctx: RoundContext) -> bool:
    """``explore.enabled: false``: rounds 1..N train on the round-0 pool alone."""
    return not ctx.cfg.explore.enabled and ctx.round > 0


def _train(ctx: RoundContext) -> dict:
    from coevolve.train import train_round

    from coevolve.checkpoints import publish

    result = train_round(ctx.store, ctx.cfg, ctx.run_id, ctx.round, ctx.policy_in(), pool_tasks(ctx.store, "train"))
    return {
        "checkpoint": publish(ctx.store, ctx.cfg, ctx.run_id, ctx.round, result.checkpoint),
        "n_rollouts": result.n_rollouts,
        "train_reward": result.mean_reward,
        "train_success": result.success_rate,
        "split": result.timings,
    }


def _signals(ctx: RoundContext) -> dict:
    from coevolve.signals import count_by_type, mine_signals, signal_types

    types = signal_types(ctx.cfg.signals)
    if _feedback_off(ctx):
        counts = dict.fromkeys(types, 0)
    else:
        counts = count_by_type(mine_signals(ctx.store, ctx.cfg.signals, ctx.run_id, ctx.round), types)
    # the paper's three keep their own columns; every type (user files too) is in signal_counts
    return {**{f"signals_{t}": counts.get(t, 0) for t in PAPER_SIGNALS}, "signal_counts": counts}


PAPER_SIGNALS = ("forgetting", "boundary", "rare")


def signal_counts_of(row: dict) -> dict[str, int]:
    """Signals per type of a ``rounds`` row (or a signals stage marker): its ``signal_counts``
    (every signal file, user ones included; JSON in a row), else the paper's three columns
    (rows written before ``signal_counts`` existed)."""
    counts = row.get("signal_counts")
    if isinstance(counts, str):
        counts = json.loads(counts)
    if counts:
        return {str(t): int(n or 0) for t, n in counts.items()}
    return {t: int(row.get(f"signals_{t}") or 0) for t in PAPER_SIGNALS if row.get(f"signals_{t}") is not None}


def round_warnings(signal_counts: dict[str, int], store: Store, run_id: str, round_no: int) -> list[str]:
    """Warnings for the round summary: reward hacking (the ``reward_hacking`` signal fired)."""
    n = signal_counts.get("reward_hacking", 0)
    if not n:
        return []
    rows = store.read(
        "signals",
        filter=(ds.field("run_id") == run_id)
        & (ds.field("round") == round_no)
        & (ds.field("signal_type") == "reward_hacking"),
        columns=["task_id", "evidence"],
    ).to_pylist()
    kinds = sorted({json.loads(r["evidence"] or "{}").get("kind", "?") for r in rows})
    return [
        f"reward hacking: {n} task(s) earn training reward without the success it stands for "
        f"({', '.join(kinds)}; e.g. {rows[0]['task_id'] if rows else '?'}): "
        f"coevolve signals --round {round_no} --run {run_id}"
    ]


def _explore(ctx: RoundContext) -> dict:
    if _feedback_off(ctx):
        return {"n_explorations": 0}
    from coevolve.explore import explore
    from coevolve.synth import explore_static

    if ctx.round == 0:  # the seed pool: coverage of training-scenario states, no signals
        return {"n_explorations": explore_static(ctx.store, ctx.cfg, ctx.run_id)}
    return {"n_explorations": explore(ctx.store, ctx.cfg, ctx.run_id, ctx.round)}


def _abstract(ctx: RoundContext) -> dict:
    if _feedback_off(ctx):
        return {"n_candidates": 0}
    from coevolve.abstract import abstract

    return {"n_candidates": abstract(ctx.store, ctx.cfg, ctx.run_id, ctx.round)}


def _validate(ctx: RoundContext) -> dict:
    if _feedback_off(ctx):
        return {"candidates": 0, "accepted": 0, "pass_rate": None}
    from coevolve.validate import summarize_candidates, validate

    # round 0 has no trained policy: mechanical checks only (policy_path=None)
    policy_path = ctx.policy_out() if ctx.round > 0 else None
    splits = Splits()
    table = validate(ctx.store, ctx.cfg, ctx.run_id, ctx.round, policy_path, splits=splits)
    return {**summarize_candidates(table), "split": splits.seconds}


COMMIT_ATTEMPTS = 8  # pool commits retried on ConcurrentCommitError before the stage fails


def _commit(ctx: RoundContext) -> dict:
    done = ctx.store.committed_version(ctx.run_id, ctx.round)
    if done is not None:
        # committed before a crash that came ahead of the marker: only its row may be missing
        ctx.store.finish_commit(done)
        return {"pool_version": done.version, "pool_size": _train_size(ctx.store), "added": len(done.added)}
    cands = ctx.store.read(
        "candidates",
        filter=(ds.field("run_id") == ctx.run_id)
        & (ds.field("round") == ctx.round)
        & (ds.field("verdict") == "accepted"),
    )
    if ctx.round == 0 and cands.num_rows == 0:
        raise RuntimeError(
            "round 0 accepted no synthesized task, so there is no seed pool: explore more "
            "(synth.scenarios, synth.runs_per_context, synth.steps_per_run) or look at the reasons: "
            'coevolve sql "select reason, count(*) from candidates where round = 0 group by all"'
        )
    rows = []
    for spec in cands.column("spec").to_pylist():
        task = Task.from_json(spec)
        task.run_id, task.created_round, task.split = ctx.run_id, ctx.round, "train"
        rows.append(task.to_row())
    heldout = []
    if ctx.round == 0:  # pool v1 also freezes the held-out synthesized split (evaluation only)
        from coevolve.heldout import synthesize_heldout

        heldout = [t.to_row() for t in synthesize_heldout(ctx.cfg)]
    for attempt in range(COMMIT_ATTEMPTS):  # other runs may commit to the same store meanwhile
        latest = ctx.store.latest_pool()
        try:
            version = ctx.store.commit_pool(
                run_id=ctx.run_id,
                round_no=ctx.round,
                new_tasks=rows + heldout,
                expected_parent=latest.version if latest else None,
            )
            break
        except ConcurrentCommitError:
            if attempt == COMMIT_ATTEMPTS - 1:
                raise
            time.sleep(random.uniform(0.05, 0.5) * (attempt + 1))
    summary = {"pool_version": version.version, "pool_size": _train_size(ctx.store), "added": len(rows)}
    return {**summary, "heldout_synth": len(heldout)} if ctx.round == 0 else summary


def _train_size(store: Store) -> int:
    return len(pool_tasks(store, "train"))


def _evaluate(ctx: RoundContext) -> dict:
    from coevolve.evaluate import eval_tasks, evaluate_parts
    from coevolve.policy import load_policy
    from coevolve.registry import resolve

    # held-out entries come from the environment (eval_tasks), never from the pool
    started, splits = time.perf_counter(), Splits()
    with splits.part("load"):
        policy = load_policy(ctx.cfg.policy, ctx.policy_out())
    stats = getattr(policy, "stats", None)  # the local backend's DecodeStats (cumulative)
    before = (stats.prefill_s, stats.decode_s) if stats is not None else None
    # the benchmark's held-out entries and the pool's held-out synthesized split (none in a store
    # committed before it existed), run together
    env = resolve("environment", ctx.cfg.env.name)()
    parts = {"eval": eval_tasks(ctx.cfg, env), "eval-synth": pool_tasks(ctx.store, "heldout")}
    results = evaluate_parts(ctx.store, ctx.cfg, ctx.run_id, ctx.round, policy, parts, env=env)
    result = results["eval"]
    summary = {
        "eval_score": result.score,
        "eval_overall": result.overall,
        "eval_reward": result.reward,
        "n_eval": result.n_episodes,
        "per_category": result.per_category,
    }
    if parts["eval-synth"]:
        held = results["eval-synth"]
        summary.update(synth_score=held.score, synth_reward=held.reward, n_synth=held.n_episodes)
    if stats is not None and before is not None:
        splits.add("prefill", stats.prefill_s - before[0])
        splits.add("decode", stats.decode_s - before[1])
    # the rest: the environment's steps and scoring, rendering prompts, parsing answers, writing rows
    splits.add("rest", time.perf_counter() - started - sum(splits.seconds.values()))
    return {**summary, "split": splits.seconds}


_STAGE_FUNCS: dict[str, Callable[[RoundContext], dict]] = {
    "train": _train,
    "signals": _signals,
    "explore": _explore,
    "abstract": _abstract,
    "validate": _validate,
    "commit": _commit,
    "evaluate": _evaluate,
}


def last_finished_round(store: Store, run_name: str) -> int:
    """The highest round ``r >= 1`` of ``run_name`` whose every round up to it has finished
    (its last stage's marker exists); 0 when none has (round 0 may or may not be done)."""
    r = 0
    while store.stage_done(run_name, r + 1, STAGES[-1]) is not None:
        r += 1
    return r


# A stage implementation: the context in, the stage's summary out (as in _STAGE_FUNCS).
StageImpl = Callable[[RoundContext], dict]


def run_stage(store: Store, cfg: RunConfig, round_no: int, stage: str, impl: StageImpl | None = None) -> dict:
    """Run one stage of ``round`` unless its marker says it is done; return its summary.

    ``impl`` replaces the library's implementation of the stage (the flows' fan-out of
    exploration and validation over a task runner); the marker and events are the same."""
    ctx = RoundContext(store, cfg, round_no)
    done = ctx.marker(stage)
    if done is not None:
        emit("skip", round_no, stage, done)
        return done
    emit("start", round_no, stage, {})
    t0 = time.perf_counter()
    summary = (impl or _STAGE_FUNCS[stage])(ctx)
    summary["seconds"] = round_seconds(time.perf_counter() - t0)
    store.mark_stage(ctx.run_id, round_no, stage, summary)
    emit("done", round_no, stage, summary)
    log.info("round %d %s: %s", round_no, stage, summary)
    return summary


def round_seconds(x: float) -> float:
    return float(f"{x:.3f}")


def record_round(store: Store, cfg: RunConfig, round_no: int) -> dict:
    """Write the ``rounds`` row of a finished round from its stage markers."""
    m = {stage: store.stage_done(cfg.run_name, round_no, stage) or {} for stage in STAGES}
    row: dict[str, Any] = {
        "run_id": cfg.run_name,
        "policy_in": RoundContext(store, cfg, round_no).policy_in_ref(),
        "policy_out": m["train"].get("checkpoint"),
        "pool_version": m["commit"].get("pool_version"),
        "pool_size": m["commit"].get("pool_size"),
        "n_rollouts": m["train"].get("n_rollouts"),
        "train_reward": m["train"].get("train_reward"),
        "train_success": m["train"].get("train_success"),
        "n_explorations": m["explore"].get("n_explorations"),
        "n_candidates": m["abstract"].get("n_candidates"),
        "n_accepted": m["validate"].get("accepted"),
        "pass_rate": m["validate"].get("pass_rate"),
        "eval_score": m["evaluate"].get("eval_score"),
        "eval_reward": m["evaluate"].get("eval_reward"),
        "synth_score": m["evaluate"].get("synth_score"),
        "synth_reward": m["evaluate"].get("synth_reward"),
        "finished_at": datetime.now(timezone.utc),
    }
    for t in PAPER_SIGNALS:
        row[f"signals_{t}"] = m["signals"].get(f"signals_{t}")
    counts = m["signals"].get("signal_counts")
    row["signal_counts"] = json.dumps(counts) if counts is not None else None  # in the stage's order
    row["partial_share"] = m["validate"].get("partial_share")
    warnings = round_warnings(counts or {}, store, cfg.run_name, round_no)
    for w in warnings:
        log.warning("round %d: %s", round_no, w)
    row["warnings"] = json.dumps(warnings) if warnings else None
    for stage in STAGES:
        row[f"t_{stage}"] = m[stage].get("seconds")
    for stage, parts in SPLIT_COLUMNS.items():
        split = m[stage].get("split") or {}
        for part in parts:
            row[f"t_{stage}_{part}"] = split.get(part)
    row["t_total"] = round_seconds(sum(m[s].get("seconds", 0.0) for s in STAGES))
    store.write("rounds", round_no, cfg.run_name, [row])
    return {"round": round_no, **row}


def run_rounds(cfg: RunConfig, store: Store | None = None) -> list[dict]:
    """Run (or resume) round 0 and every round of ``cfg`` without Prefect; returns the
    ``rounds`` rows (round 0's only when this run synthesized the pool)."""
    store = store or open_run_store(cfg)
    rows = [run_round(store, cfg, r) for r in range(0, cfg.rounds + 1)]
    return [r for r in rows if r is not None]
