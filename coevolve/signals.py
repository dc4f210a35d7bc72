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

import dataclasses
import hashlib
import json
import re
import tempfile
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import yaml

from coevolve.config import ConfigError, SignalsConfig
from coevolve.schemas import to_table
from coevolve.sql import SQL_DIR, connect
from coevolve.store import Store

BUILTIN_DIR = SQL_DIR / "signals"
# the built-in signals, in the order their rows are written; user signals follow by name
BUILTIN_TYPES = ("forgetting", "boundary", "rare", "uncertainty", "reward_hacking")
# kept for callers that name the paper's three
SIGNAL_TYPES = BUILTIN_TYPES[:3]
# names other stages give their contexts: a signal file may not take them
RESERVED_NAMES = frozenset({"fallback", "random", "static", "heldout", "seed"})
# parameters the stage gives every query that uses them
STAGE_PARAMS = ("run_id", "round", "phases")
KEYS = ("task_id", "pattern")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_PARAM = re.compile(r"([a-z_][a-z0-9_]*)\s+([a-z]+(?:\[\])?)\s*=\s*(.+)", re.IGNORECASE)

# the built-in signals' parameters that SignalsConfig fields set (the header default otherwise)
CONFIG_PARAMS: dict[str, dict[str, Callable[[SignalsConfig], Any]]] = {
    "forgetting": {
        "before_min": lambda c: c.forget_before_min,
        "now_max": lambda c: c.forget_now_max,
        "reward_drop": lambda c: c.forget_reward_drop,
    },
    "boundary": {
        "min_samples": lambda c: c.boundary_min_samples,
        # the query compares variances: no square root per task, same verdicts
        "min_reward_var": lambda c: c.boundary_reward_std**2,
    },
    "rare": {
        "n": lambda c: c.rare_n,
        "with_arg_keys": lambda c: c.rare_with_arg_keys,
        "include_parse_errors": lambda c: c.include_parse_errors,
        "min_episodes": lambda c: c.rare_min_episodes,
        "quantile": lambda c: c.rare_quantile,
        "min_total": lambda c: c.rare_min_total,
        "evidence_limit": lambda c: c.evidence_limit,
    },
}


@dataclass(frozen=True)
class SignalSpec:
    """One signal file: its header's declarations and its query text."""

    name: str
    path: Path
    grain: str
    key: str  # task_id | pattern
    params: dict[str, Any]  # declared parameters and their header defaults
    columns: tuple[str, ...]
    text: str
    builtin: bool

    def uses(self, param: str) -> bool:
        return re.search(rf"\${param}\b", self.text) is not None


def parse_header(path: Path, builtin: bool = False) -> SignalSpec:
    """The ``SignalSpec`` of the SQL file at ``path``; ``ConfigError`` naming the file and the
    missing or malformed declaration otherwise."""
    text = path.read_text()
    decl: dict[str, list[str]] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("--"):
            break  # the header is the leading block of comment lines
        m = re.match(r"--\s*(signal|grain|key|param|columns):\s*(.*)", stripped)
        if m:
            decl.setdefault(m.group(1), []).append(m.group(2).strip())

    def fail(what: str) -> ConfigError:
        return ConfigError(f"signal file {path}: {what} (see sql/signals/README.md for the header)")

    for required in ("signal", "grain", "key", "columns"):
        if not decl.get(required) or not decl[required][0]:
            raise fail(f"its header declares no '-- {required}: ...'")
    name = decl["signal"][0]
    if not _NAME.fullmatch(name) or name in RESERVED_NAMES:
        raise fail(
            f"signal name {name!r} must be lowercase letters, digits and _, and not one of {sorted(RESERVED_NAMES)}"
        )
    key = decl["key"][0]
    if key not in KEYS:
        raise fail(f"key {key!r} must be one of {', '.join(KEYS)}")
    params: dict[str, Any] = {}
    for p in decl.get("param", []):
        m = _PARAM.fullmatch(p)
        if not m:
            raise fail(f"'-- param: {p}' must read '-- param: NAME TYPE = DEFAULT'")
        if m.group(1) in STAGE_PARAMS:
            raise fail(f"${m.group(1)} is given by the stage: do not declare it")
        try:
            params[m.group(1)] = yaml.safe_load(m.group(3))
        except yaml.YAMLError as exc:
            raise fail(f"the default of {m.group(1)} is not a value: {exc}") from None
    columns = tuple(c.strip() for line in decl["columns"] for c in line.split(",") if c.strip())
    if columns[:2] != (key, "score"):
        raise fail(f"its columns must start with {key}, score (got {', '.join(columns[:2])})")
    return SignalSpec(name, path, decl["grain"][0], key, params, columns, text, builtin)


def signal_files(cfg: SignalsConfig) -> list[SignalSpec]:
    """Every signal file the stage runs: the built-ins, then each of ``cfg.dirs`` (by file name).
    ``ConfigError`` for a folder that does not exist or two files that name the same signal."""
    specs = [parse_header(p, builtin=True) for p in sorted(BUILTIN_DIR.glob("*.sql"))]
    for folder in cfg.dirs:
        d = Path(folder).expanduser()
        if not d.is_dir():
            raise ConfigError(f"signals.dirs: {folder} is not a folder of signal .sql files")
        specs += [parse_header(p) for p in sorted(d.glob("*.sql"))]
    seen: dict[str, Path] = {}
    for s in specs:
        if s.name in seen:
            raise ConfigError(f"signal file {s.path}: signal {s.name!r} is already defined by {seen[s.name]}")
        seen[s.name] = s.path
    order = {t: i for i, t in enumerate(BUILTIN_TYPES)}
    return sorted(specs, key=lambda s: (order.get(s.name, len(order)), s.name))


def signal_types(cfg: SignalsConfig) -> list[str]:
    """The signal types the stage mines, in the order their rows are written."""
    return [s.name for s in signal_files(cfg)]


def spec_params(spec: SignalSpec, cfg: SignalsConfig, run_id: str, round_no: int) -> dict[str, Any]:
    """The DuckDB named parameters of one signal query: the stage's, then the declared ones
    (header default < built-in config field < ``signals.params.<signal>``)."""
    stage = {"run_id": run_id, "round": int(round_no), "phases": list(cfg.phases)}
    out = {k: v for k, v in stage.items() if spec.uses(k)}
    values = dict(spec.params)
    for param, get in CONFIG_PARAMS.get(spec.name, {}).items() if spec.builtin else ():
        values[param] = get(cfg)
    values.update(cfg.params.get(spec.name, {}))
    return out | values


def query_params(cfg: SignalsConfig, run_id: str, round_no: int) -> dict[str, dict[str, Any]]:
    """The DuckDB named parameters of each signal query (see the SQL headers)."""
    return {s.name: spec_params(s, cfg, run_id, round_no) for s in signal_files(cfg)}


def check_signal_files(cfg: SignalsConfig) -> list[SignalSpec]:
    """Parse every signal file and run its query on an empty store; ``ConfigError`` with the
    file's path and DuckDB's message when one does not run or returns other columns than its
    header declares, or when ``signals.params`` names an unknown signal or parameter."""
    specs = signal_files(cfg)
    # a config is loaded many times per run (and per test): the same files and settings pass once
    key = json.dumps([[str(s.path), s.text] for s in specs] + [dataclasses.asdict(cfg)], sort_keys=True, default=str)
    if key in _CHECKED:
        return specs
    by_name = {s.name: s for s in specs}
    for name, values in cfg.params.items():
        if name not in by_name:
            raise ConfigError(f"signals.params.{name}: no signal file defines {name!r} (known: {', '.join(by_name)})")
        if not isinstance(values, dict):
            raise ConfigError(f"signals.params.{name}: expected a mapping of parameter -> value")
        unknown = set(values) - set(by_name[name].params)
        if unknown:
            raise ConfigError(
                f"signals.params.{name}.{sorted(unknown)[0]}: {by_name[name].path.name} declares no such parameter "
                f"(declared: {', '.join(by_name[name].params) or 'none'})"
            )
    with tempfile.TemporaryDirectory(prefix="coevolve-signals-check-") as empty:
        con = connect(Store(empty))
        try:
            for s in specs:
                try:
                    got = tuple(con.sql(s.text, params=spec_params(s, cfg, "check", 1)).columns)
                except duckdb.Error as exc:
                    raise ConfigError(f"signal file {s.path}: {str(exc).splitlines()[0]}") from None
                if got != s.columns:
                    raise ConfigError(
                        f"signal file {s.path}: the query returns columns {', '.join(got)} but its header "
                        f"declares {', '.join(s.columns)}"
                    )
        finally:
            con.close()
    _CHECKED.add(key)
    return specs


_CHECKED: set[str] = set()  # check_signal_files: settings and files that passed


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
