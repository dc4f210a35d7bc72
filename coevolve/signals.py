"""Stage 2 of a round: mine the feedback signals from the rollout logs with SQL.

    table = mine_signals(store, cfg.signals, run_id="default", round_no=2)

**A signal is a SQL file.** The stage runs every ``*.sql`` file of ``sql/signals/`` (the
built-in signals: forgetting, boundary, rare, uncertainty, reward_hacking) and of every
folder in ``SignalsConfig.dirs`` (the user's), with DuckDB over the store's views (local
directory or S3, streaming from Parquet under ``SignalsConfig.memory_limit``). Each file
opens with a header of ``--`` comment lines that declares, besides its prose:

    -- signal: step_limit                 the signal type (lowercase, letters, digits, _)
    -- grain: one row per task whose ...  what one returned row is
    -- key: task_id                       task_id (a task signal) or pattern (an action pattern)
    -- param: min_hits integer = 2        a parameter ($min_hits) with its type and default
    -- columns: task_id, score, n_hits    the columns returned, in order (key and score first)

``$run_id``, ``$round`` and ``$phases`` are given by the stage to every query that uses them;
a declared parameter takes its header default, then the built-in config field that maps to
it (``CONFIG_PARAMS``), then ``signals.params.<signal>.<param>``. ``check_signal_files``
(called by ``SignalsConfig.validate``, so at preflight) parses every header and runs every
query on empty tables: a broken file fails with its path and DuckDB's message.

The queries return every signal that holds; this module keeps the top ``budget_per_type``
of each type, marks which signals are new to the run and writes them to the ``signals``
table. A signal's key is (signal_type, task_id) for task signals and (signal_type, pattern)
for patterns. A signal emitted in an earlier round of the run is emitted again only if it
still holds now (every query reads the current round), and then has ``is_new=false``.
``evidence`` is the JSON object of every other column the query returns (see each file's
header).
"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from coevolve.config import SignalsConfig
from coevolve.signal_files import (  # noqa: F401  (the file contract, re-exported for the stage's callers)
    BUILTIN_DIR,
    BUILTIN_TYPES,
    SIGNAL_TYPES,
    RESERVED_NAMES,
    STAGE_PARAMS,
    KEYS,
    CONFIG_PARAMS,
    SignalSpec,
    parse_header,
    signal_files,
    signal_types,
    spec_params,
    query_params,
    check_signal_files,
)
from coevolve.schemas import to_table
from coevolve.sql import connect
from coevolve.store import Store


def run_queries(con: duckdb.DuckDBPyConnection, cfg: SignalsConfig, run_id: str, round_no: int) -> dict[str, pa.Table]:
    """Every signal that holds at ``round`` (no budget), per type, as the queries return them.

    ``con`` must have the store's views (``coevolve.sql.connect``). Rows come ordered by
    score descending, then task_id / pattern.
    """
    out = {}
    for spec in signal_files(cfg):
        try:
            out[spec.name] = con.sql(spec.text, params=spec_params(spec, cfg, run_id, round_no)).to_arrow_table()
        except duckdb.Error as exc:
            raise RuntimeError(f"signal file {spec.path}: {str(exc).splitlines()[0]}") from None
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


def _key_column(table: pa.Table) -> str:
    """The key of a query's rows: its first column (the header contract), task_id or pattern."""
    key = table.column_names[0] if table.column_names else ""
    return key if key in KEYS else "task_id"


def select_signals(
    found: dict[str, pa.Table], cfg: SignalsConfig, run_id: str, round_no: int, seen: set[tuple[str, str]]
) -> pa.Table:
    """Apply the per-type budget to the query results and build ``signals`` rows.

    Per type: top ``cfg.budget_per_type`` by score, ties broken by task_id / pattern, so
    the selection never depends on the order rows arrive in. Output order: the types in the
    order of ``found`` (``signal_files``), each by rank.
    """
    rows = []
    for signal_type, table in found.items():
        key_col = _key_column(table)
        table = table.sort_by([("score", "descending"), (key_col, "ascending")])
        for rank, rec in enumerate(table.slice(0, cfg.budget_per_type).to_pylist(), start=1):
            key = rec.pop(key_col)
            score = rec.pop("score")
            if key is None:
                continue  # a signal must name what it is about
            rows.append(
                {
                    "run_id": run_id,
                    "signal_id": signal_id(round_no, signal_type, str(key)),
                    "signal_type": signal_type,
                    "task_id": key if key_col == "task_id" else None,
                    "pattern": key if key_col == "pattern" else None,
                    "score": None if score is None else float(score),
                    "evidence": json.dumps(rec, sort_keys=True, default=_json_value),
                    "is_new": (signal_type, key) not in seen,
                    "rank": rank,
                }
            )
    return to_table("signals", rows)


def _json_value(value: Any) -> Any:
    """Evidence values JSON has no type for: DuckDB's HUGEINT / DECIMAL (``count_if``, ``sum`` of
    integers) arrive as Decimal and become numbers; anything else (dates, ...) its text."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return str(value)


def count_by_type(table: pa.Table, types: list[str]) -> dict[str, int]:
    """Signals per type (every type in ``types``, 0 when none fired), for the ``rounds`` row."""
    found = table.column("signal_type").to_pylist() if table.num_rows else []
    return {t: found.count(t) for t in types}


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
