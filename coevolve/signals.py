"""Stage 2 of a round: mine the three feedback signals from the rollout logs with SQL.

    table = mine_signals(store, cfg.signals, run_id="default", round_no=2)

The definitions live in ``sql/signals/{forgetting,boundary,rare}.sql`` (one query each,
documented in its header); this module runs them with DuckDB over the store's
``rollouts`` view (local directory or S3, streaming from Parquet under
``SignalsConfig.memory_limit``), keeps the top ``budget_per_type`` of each type, marks
which signals are new to the run and writes them to the ``signals`` table.

A signal's key is (signal_type, task_id) for task signals and (signal_type, pattern) for
rare patterns. A signal emitted in an earlier round of the run is emitted again only if
it still holds now (every query reads the current round), and then has ``is_new=false``.

``evidence`` is the JSON object of every other column the query returns, e.g.
forgetting: success_drop, reward_drop, before_rate, before_reward, before_n, before_round,
before_epoch, before_step, now_rate, now_reward, now_n, now_epoch, now_step,
failing_episode_id; boundary: n, n_success, rate, n_reward, reward_var, failing_episode_id;
rare: actions (the pattern's tool names), n_occurrences, n_episodes, share, total, cutoff,
task_ids and episode_ids (sorted, at most ``evidence_limit``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from coevolve.config import SignalsConfig
from coevolve.schemas import to_table
from coevolve.sql import SQL_DIR, connect
from coevolve.store import Store

SIGNAL_TYPES = ("forgetting", "boundary", "rare")
# the column that names what a signal is about, per type
KEY_COLUMN = {"forgetting": "task_id", "boundary": "task_id", "rare": "pattern"}


def query_params(cfg: SignalsConfig, run_id: str, round_no: int) -> dict[str, dict[str, Any]]:
    """The DuckDB named parameters of each signal query (see the SQL headers)."""
    common = {"run_id": run_id, "round": int(round_no), "phases": list(cfg.phases)}
    return {
        "forgetting": {
            **common,
            "before_min": cfg.forget_before_min,
            "now_max": cfg.forget_now_max,
            "reward_drop": cfg.forget_reward_drop,
        },
        "boundary": {
            **common,
            "min_samples": cfg.boundary_min_samples,
            # the query compares variances: no square root per task, same verdicts
            "min_reward_var": cfg.boundary_reward_std**2,
        },
        "rare": {
            **common,
            "n": cfg.rare_n,
            "with_arg_keys": cfg.rare_with_arg_keys,
            "include_parse_errors": cfg.include_parse_errors,
            "min_episodes": cfg.rare_min_episodes,
            "quantile": cfg.rare_quantile,
            "min_total": cfg.rare_min_total,
            "evidence_limit": cfg.evidence_limit,
        },
    }


def run_queries(con: duckdb.DuckDBPyConnection, cfg: SignalsConfig, run_id: str, round_no: int) -> dict[str, pa.Table]:
    """Every signal that holds at ``round`` (no budget), per type, as the queries return them.

    ``con`` must have a ``rollouts`` view (``coevolve.sql.connect``). Rows come ordered by
    score descending, then task_id / pattern.
    """
    out = {}
    for signal_type, params in query_params(cfg, run_id, round_no).items():
        text = (SQL_DIR / "signals" / f"{signal_type}.sql").read_text()
        out[signal_type] = con.sql(text, params=params).to_arrow_table()
    return out


def signal_id(round_no: int, signal_type: str, key: str) -> str:
    """Stable id of a signal: the same key in the same round always gets the same id."""
    return f"{round_no}-{signal_type}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def emitted_before(store: Store, run_id: str, round_no: int) -> set[tuple[str, str]]:
    """Keys (signal_type, task_id or pattern) the run emitted in rounds before ``round``."""
    earlier = store.read(
        "signals",
        filter=(ds.field("run_id") == run_id) & (ds.field("round") < int(round_no)),
        columns=["signal_type", "task_id", "pattern"],
    )
    return {
        (t, task if task is not None else pattern)
        for t, task, pattern in zip(*(earlier.column(c).to_pylist() for c in ("signal_type", "task_id", "pattern")))
    }


def select_signals(
    found: dict[str, pa.Table], cfg: SignalsConfig, run_id: str, round_no: int, seen: set[tuple[str, str]]
) -> pa.Table:
    """Apply the per-type budget to the query results and build ``signals`` rows.

    Per type: top ``cfg.budget_per_type`` by score, ties broken by task_id / pattern, so
    the selection never depends on the order rows arrive in. Output order: forgetting,
    boundary, rare, each by rank.
    """
    rows = []
    for signal_type in SIGNAL_TYPES:
        key_col = KEY_COLUMN[signal_type]
        table = found[signal_type].sort_by([("score", "descending"), (key_col, "ascending")])
        for rank, rec in enumerate(table.slice(0, cfg.budget_per_type).to_pylist(), start=1):
            key = rec.pop(key_col)
            score = rec.pop("score")
            rows.append(
                {
                    "run_id": run_id,
                    "signal_id": signal_id(round_no, signal_type, key),
                    "signal_type": signal_type,
                    "task_id": key if key_col == "task_id" else None,
                    "pattern": key if key_col == "pattern" else None,
                    "score": score,
                    "evidence": json.dumps(rec, sort_keys=True),
                    "is_new": (signal_type, key) not in seen,
                    "rank": rank,
                }
            )
    return to_table("signals", rows)


def mine_signals(store: Store, cfg: SignalsConfig, run_id: str, round_no: int) -> pa.Table:
    """Mine, select and write the signals of ``run_id`` at ``round``; return the rows written.

    Output: a ``signals`` table (schema ``coevolve.schemas.SIGNALS``), also written to the
    store as part ``<run_id>-signals`` of partition ``round`` (a rerun replaces it).
    """
    con = connect(store, memory_limit=cfg.memory_limit, threads=cfg.threads or None)
    try:
        found = run_queries(con, cfg, run_id, round_no)
    finally:
        con.close()
    table = select_signals(found, cfg, run_id, round_no, emitted_before(store, run_id, round_no))
    store.write("signals", round_no, f"{run_id}-signals", table)
    return table
