"""Signal files: the contract of a ``*.sql`` file of ``sql/signals/`` or of a folder in
``SignalsConfig.dirs`` (its header: signal, grain, key, params, columns), how the files are found,
the parameters each query gets, and ``check_signal_files``, which ``SignalsConfig.validate``
runs at preflight (every header parses, every query runs on empty tables).

    specs = check_signal_files(cfg.signals)     # [SignalSpec(name, key, params, columns, ...)]

The signals stage that runs them is ``coevolve.signals``. This module imports no config, so that
``coevolve.config`` can check the files without an import cycle.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import duckdb
import yaml

from coevolve.config_yaml import ConfigError
from coevolve.sql import SQL_DIR, connect
from coevolve.store import Store

if TYPE_CHECKING:  # only a type here: coevolve.config imports this module to check its files
    from coevolve.config import SignalsConfig

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
