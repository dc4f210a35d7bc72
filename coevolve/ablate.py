"""The ablation ladder: zero-shot, static, random and signal-guided, with equal budgets and seeds.

    runs = plan(cfg, seeds=2, rounds=1, store="/tmp/abl")   # one AblationRun per condition x seed
    rows = run_ablation(runs)                                # runs (or resumes) them all
    summary(store_at("/tmp/abl"))                            # polars: condition, round, seeds, mean, std, ...

Conditions (``CONDITIONS``) differ only in config overrides; everything else (training steps,
exploration and validation budgets, held-out set, seed) comes from the same base config:

- ``zero-shot``      the base policy evaluated on the held-out set (round 0), no training;
- ``static``         R rounds trained on the round-0 pool alone (``explore.enabled: false``);
- ``random``         R rounds with the random explorer (same contexts budget, ignores signals);
- ``signal-guided``  R rounds of the full loop with the config's (signal-guided) explorer.

Store layout. A store holds one pool lineage, and every run needs its own, so each run
(``run_id = <condition>-s<seed>``) gets a sub-store ``<store>/conditions/<run_id>`` with its
own pool, rollouts, signals, candidates and rounds. The ablation store itself holds the
``ablations`` table (one row per run x round, with the sub-store's URI) and a completion
marker per run (``runs/<run_id>/round=0/ablation.json``): rerunning an ablation skips the
finished runs, and a run interrupted half-way resumes from its own stage markers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

import polars as pl

from coevolve.config import ConfigError, RunConfig
from coevolve.registry import resolve
from coevolve.round import run_rounds, run_stage, seed_pool, signal_counts_of
from coevolve.store import Store
from coevolve.store_open import open_run_store, store_at

FEEDBACK_STAGES = ("signals", "explore", "abstract", "validate")


@dataclass(frozen=True)
class Condition:
    name: str
    description: str
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted config keys -> values
    trains: bool = True  # False: evaluate the base policy only
    signal_guided: bool | None = None  # the explorer must (True) / must not (False) follow signals


CONDITIONS: tuple[Condition, ...] = (
    Condition("zero-shot", "the base policy on the held-out set, no training", trains=False),
    Condition("static", "R rounds on the round-0 pool only: no signals, no exploration", {"explore.enabled": False}),
    Condition(
        "random",
        "R rounds with the random explorer",
        {"explore.enabled": True, "explore.explorer": "random"},
        signal_guided=False,
    ),
    Condition("signal-guided", "R rounds of the full loop", {"explore.enabled": True}, signal_guided=True),
)
CONDITION_ORDER = {c.name: i for i, c in enumerate(CONDITIONS)}


@dataclass(frozen=True)
class AblationRun:
    condition: Condition
    seed: int
    cfg: RunConfig  # the run's own config (run_name, store, seed, rounds, overrides applied)
    ablation_store: str  # URI of the store holding the `ablations` table

    @property
    def run_id(self) -> str:
        return self.cfg.run_name


def run_id(condition: str, seed: int) -> str:
    return f"{condition}-s{seed}"


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        data = data[p]
    data[leaf] = value


def plan(
    base: RunConfig, seeds: int, rounds: int, store: str | None = None, conditions: tuple[Condition, ...] = CONDITIONS
) -> list[AblationRun]:
    """One run per condition x seed (seeds ``base.seed .. base.seed + seeds - 1``), in
    condition order, each with its own sub-store ``<store>/conditions/<run_id>``."""
    if seeds < 1 or rounds < 1:
        raise ConfigError("ablate: --seeds and --rounds must be >= 1")
    root = (store or base.store).rstrip("/")
    out = []
    for seed in range(base.seed, base.seed + seeds):
        for cond in conditions:
            data = copy.deepcopy(base.to_dict())
            rid = run_id(cond.name, seed)
            data.update(run_name=rid, store=f"{root}/conditions/{rid}", seed=seed, rounds=rounds)
            for key, value in cond.overrides.items():
                _set(data, key, value)
            cfg = RunConfig.from_dict(data)
            if cond.signal_guided is not None:
                guided = bool(getattr(resolve("explorer", cfg.explore.explorer), "signal_guided", False))
                if guided != cond.signal_guided:
                    raise ConfigError(
                        f"ablate: condition {cond.name!r} needs a {'signal-guided' if cond.signal_guided else 'random'} "
                        f"explorer, but explore.explorer is {cfg.explore.explorer!r}; set explore.explorer to 'rule' or 'llm'"
                    )
            out.append(AblationRun(cond, seed, cfg, root))
    out.sort(key=lambda r: (CONDITION_ORDER.get(r.condition.name, len(CONDITIONS)), r.seed))
    return out


# ----------------------------------------------------------------------------- one run
def run_condition(run: AblationRun) -> list[dict]:
    """Run (or resume) one condition x seed in its sub-store; returns its ``rounds``-like
    rows (zero-shot: a single row for round 0 with the base policy's evaluation)."""
    sub = open_run_store(run.cfg)
    if run.condition.trains:
        # round 0 synthesizes the pool and evaluates nothing: the ladder's round 0 is zero-shot's
        return [row for row in run_rounds(run.cfg, sub) if row["round"] > 0]
    seed_pool(sub, run.cfg)  # round 0: the run's synthesized pool, as every condition starts from
    return [zero_shot_row(run.cfg, run_stage(sub, run.cfg, 0, "evaluate"))]


def zero_shot_row(cfg: RunConfig, evaluation: dict) -> dict:
    """The round-0 row of a run that only evaluates the base policy."""
    return {
        "round": 0,
        "run_id": cfg.run_name,
        "eval_score": evaluation.get("eval_score"),
        "eval_reward": evaluation.get("eval_reward"),
        "synth_score": evaluation.get("synth_score"),
        "synth_reward": evaluation.get("synth_reward"),
        "t_evaluate": evaluation.get("seconds"),
        "t_total": evaluation.get("seconds"),
    }


def ablation_rows(run: AblationRun, rounds_rows: list[dict]) -> list[dict]:
    """``ablations`` rows of a finished run from its ``rounds`` rows (read by name; absent
    columns stay null)."""
    out = []
    now = datetime.now(timezone.utc)
    for r in rounds_rows:
        signals = signal_counts_of(r)
        feedback = [r.get(f"t_{s}") for s in FEEDBACK_STAGES]
        out.append(
            {
                "round": r["round"],
                "run_id": run.run_id,
                "condition": run.condition.name,
                "seed": run.seed,
                "store": run.cfg.store,
                "eval_score": r.get("eval_score"),
                "eval_reward": r.get("eval_reward"),
                "synth_score": r.get("synth_score"),
                "synth_reward": r.get("synth_reward"),
                "pool_size": r.get("pool_size"),
                "n_accepted": r.get("n_accepted"),
                "pass_rate": r.get("pass_rate"),
                "n_signals": sum(signals.values()) if signals else None,
                "t_total": r.get("t_total"),
                "t_feedback": sum(v for v in feedback if v is not None)
                if any(v is not None for v in feedback)
                else None,
                "finished_at": now,
            }
        )
    return out


def record_run(store: Store, run: AblationRun, rounds_rows: list[dict]) -> list[dict]:
    """Write the run's ``ablations`` rows into the ablation store, then its completion marker."""
    rows = ablation_rows(run, rounds_rows)
    for r in rows:
        store.write("ablations", r["round"], run.run_id, [r])
    store.mark_stage(run.run_id, 0, "ablation", {"rounds": [r["round"] for r in rows], "store": run.cfg.store})
    return rows


def find_run(runs: list[AblationRun], run_id: str) -> AblationRun:
    for run in runs:
        if run.run_id == run_id:
            return run
    raise KeyError(f"no run {run_id!r} in the plan; runs: {', '.join(r.run_id for r in runs)}")


def is_done(store: Store, run: AblationRun) -> bool:
    return store.stage_done(run.run_id, 0, "ablation") is not None


def ablation_store(run: AblationRun) -> Store:
    """The store that holds the ``ablations`` table (with the run config's S3 settings: endpoint,
    region, retries and timeouts)."""
    return store_at(run.ablation_store, run.cfg.s3)


# ----------------------------------------------------------------------------- the ladder
def run_ablation(runs: list[AblationRun], on_run: Callable[[str, AblationRun], None] | None = None) -> pl.DataFrame:
    """Run every run of ``runs`` that has no completion marker; returns ``summary``.

    ``on_run(event, run)`` is told "skip" for finished runs, "start" and "done" otherwise.
    """
    if not runs:
        raise ConfigError("ablate: nothing to run")
    store = ablation_store(runs[0])
    store.check_reachable()
    for run in runs:
        if is_done(store, run):
            if on_run:
                on_run("skip", run)
            continue
        if on_run:
            on_run("start", run)
        record_run(store, run, run_condition(run))
        if on_run:
            on_run("done", run)
    return summary(store)


def summary(store: Store) -> pl.DataFrame:
    """Held-out score per condition and round over seeds (``sql/ablations/summary.sql``), as
    polars: condition, round, seeds, mean, std, min, max, mean_reward, min_reward, max_reward; in ladder order."""
    from coevolve.sql import query_file

    df = query_file(store, "ablations/summary.sql")
    order = pl.col("condition").replace_strict(CONDITION_ORDER, default=len(CONDITIONS), return_dtype=pl.Int32)
    return df.with_columns(order.alias("_order")).sort("_order", "condition", "round").drop("_order")
