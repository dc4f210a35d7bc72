"""What ``coevolve report`` reads: the report's frames from a store, through DuckDB SQL
(``sql/report/*.sql``), aggregated with polars.

    data = collect(store)                      # every run; an ablation store: per condition and seed
    data.rounds, data.signals, data.pool       # polars frames, each with run_id, condition, seed
    feedback_overhead(data.rounds)             # signals + explore + abstract + validate share of time

A plain store holds runs side by side (condition = run_id, seed 0); an ablation store
(``coevolve ablate``) lists its runs in ``ablations``, each with its own sub-store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from coevolve.store import Store
from coevolve.store_open import store_at

STAGE_COLUMNS = ("t_train", "t_signals", "t_explore", "t_abstract", "t_validate", "t_commit", "t_evaluate")
FEEDBACK_COLUMNS = ("t_signals", "t_explore", "t_abstract", "t_validate")
LABELS = ("run_id", "condition", "seed")


@dataclass
class ReportData:
    """Every frame carries run_id, condition and seed (plain runs: condition = run_id, seed 0)."""

    ablation: bool
    rounds: pl.DataFrame
    signals: pl.DataFrame
    validation: pl.DataFrame
    pool: pl.DataFrame
    turns: pl.DataFrame
    ablations: pl.DataFrame  # the `ablations` rows (empty for a plain store)


def _frames(store: Store, runs: list[str], labels: dict[str, tuple[str, int]] | None) -> dict[str, pl.DataFrame]:
    from coevolve.sql import connect, query_file

    con = connect(store)
    out = {
        "rounds": query_file(con, "report/rounds.sql", runs=runs),
        "signals": query_file(con, "report/signals.sql", runs=runs),
        "validation": query_file(con, "report/validation.sql", runs=runs),
        "pool": query_file(con, "report/pool_origins.sql", runs=runs),
        "turns": query_file(con, "report/task_turns.sql"),
    }
    for name, df in out.items():
        if name == "turns":  # store-wide: one run per sub-store in an ablation
            rid = runs[0] if len(runs) == 1 else "all"
            df = df.with_columns(pl.lit(rid).alias("run_id"))
        mapping = labels or {}
        df = df.with_columns(
            pl.col("run_id")
            .replace_strict({k: v[0] for k, v in mapping.items()}, default=pl.col("run_id"), return_dtype=pl.String)
            .alias("condition"),
            pl.col("run_id")
            .replace_strict({k: v[1] for k, v in mapping.items()}, default=0, return_dtype=pl.Int64)
            .alias("seed"),
        )
        out[name] = df
    return out


def collect(store: Store, runs: list[str] | None = None, s3: Any = None) -> ReportData:
    """Read the report's frames from ``store`` (and, for an ablation, from its runs' sub-stores,
    opened with ``s3``: the ablation config's ``S3Config``; None: see ``_sub_store``)."""
    from coevolve.sql import query

    runs = list(runs or [])
    ablations = query(store, "select * from ablations")
    if runs:
        ablations = ablations.filter(pl.col("run_id").is_in(runs))
    parts: list[dict[str, pl.DataFrame]] = []
    if ablations.height:
        subs = ablations.select("run_id", "condition", "seed", "store").unique().sort("run_id")
        for row in subs.filter(pl.col("store").is_not_null()).iter_rows(named=True):
            sub = _sub_store(store, row["store"], s3)
            parts.append(_frames(sub, [row["run_id"]], {row["run_id"]: (row["condition"], row["seed"])}))
    else:
        parts.append(_frames(store, runs, None))
    if not parts:  # an ablation whose rows name no sub-store: its own table is all there is
        parts.append(_frames(store, ["-"], None))
    merged = {k: pl.concat([p[k] for p in parts], how="diagonal_relaxed") for k in parts[0]}
    return ReportData(ablation=bool(ablations.height), ablations=ablations, **merged)


def _sub_store(store: Store, uri: str, s3: Any) -> Store:
    """An ablation run's sub-store: with the S3 settings ``s3``, else with the endpoint and region
    ``store`` was opened with (and the default retries and timeouts)."""
    if s3 is None:
        from coevolve.config import S3Config

        settings = store.s3_settings
        s3 = S3Config(endpoint_url=settings.get("endpoint_url", ""), region=settings.get("region", ""))
    return store_at(uri, s3)


def feedback_overhead(rounds: pl.DataFrame) -> float:
    """signals + explore + abstract + validate seconds over all stage seconds (0 if none)."""
    cols = [c for c in STAGE_COLUMNS if c in rounds.columns]
    if not cols or not rounds.height:
        return 0.0
    total = sum(float(rounds[c].fill_null(0).sum()) for c in cols)
    feedback = sum(float(rounds[c].fill_null(0).sum()) for c in FEEDBACK_COLUMNS if c in rounds.columns)
    return feedback / total if total else 0.0
