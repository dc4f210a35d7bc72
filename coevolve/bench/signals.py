"""Benchmark of the signal queries: a synthetic rollout log, a pandas reference, timings.

    coevolve bench signals --rows 10000000

1. ``coevolve.bench.signals_log.generate_log`` writes N step rows of a synthetic run as Parquet
   into a store (``tables/rollouts/round=<r>/bench-<k>.parquet``) with each kind of signal
   planted, and noise that must not leak.
2. The SQL side (``coevolve.signals.run_queries``) and ``coevolve.bench.signals_pandas``, a
   vectorized pandas implementation of the same definitions, each run in a fresh child
   process (``python -m coevolve.bench.signals SIDE ...``), so that the peak memory each
   reports (``ru_maxrss``, the child's resident high-water mark) is its own.
3. ``compare`` checks both found the same signals: same keys, same counts and evidence,
   numbers equal to a relative 1e-9.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from coevolve.bench.signals_log import RARE_NEAR_MISS, RUN_ID, generate_log
from coevolve.bench.signals_pandas import pandas_signals
from coevolve.config import SignalsConfig

# the built-in signals the pandas reference implements (a user's signal files have none)
KEY = {
    "forgetting": "task_id",
    "boundary": "task_id",
    "rare": "pattern",
    "uncertainty": "task_id",
    "reward_hacking": "task_id",
}


# --------------------------------------------------------------------------- comparison
def _plain(value: Any) -> Any:
    """One value in a form both sides agree on: None for nulls, floats for numbers, tuples for lists."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(_plain(v) for v in value)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float, np.integer, np.floating)) or type(value).__name__ == "Decimal":
        return float(value)
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal, numbers to 1e-9 (the two sides sum variances in different orders)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def canonical(found: dict[str, pa.Table | pd.DataFrame]) -> dict[str, list[dict]]:
    """Signals of each type as plain rows sorted by key, for comparison and for JSON."""
    out = {}
    for signal_type, rows in found.items():
        records = rows.to_pylist() if isinstance(rows, pa.Table) else rows.to_dict("records")
        plain = [{k: _plain(v) for k, v in r.items()} for r in records]
        key = KEY.get(signal_type, "task_id")
        out[signal_type] = sorted(plain, key=lambda r: (r[key] is None, r[key] or ""))
    return out


def compare(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> list[str]:
    """Differences between two canonical signal sets (empty when identical)."""
    problems = []
    for signal_type in [t for t in KEY if t in a or t in b]:
        left = {r[KEY[signal_type]]: r for r in a.get(signal_type, [])}
        right = {r[KEY[signal_type]]: r for r in b.get(signal_type, [])}
        only_l, only_r = sorted(set(left) - set(right)), sorted(set(right) - set(left))
        if only_l or only_r:
            problems.append(
                f"{signal_type}: only SQL {only_l[:5]} ({len(only_l)}), only pandas {only_r[:5]} ({len(only_r)})"
            )
        for key in sorted(set(left) & set(right)):
            diff = {c for c in left[key] if not _same(left[key][c], right[key].get(c))}
            if diff:
                problems.append(f"{signal_type} {key}: columns {sorted(diff)} differ: {left[key]} vs {right[key]}")
                break
    return problems


# --------------------------------------------------------------------------- the benchmark
def _measure(side: str, store_dir: str, cfg: SignalsConfig, round_no: int, out: str) -> None:
    """Child process: mine the signals one way, write them as JSON to ``out`` with the
    wall time and this process's peak resident memory."""
    start, cpu = time.perf_counter(), time.process_time()
    if side == "sql":
        from coevolve.signals import run_queries
        from coevolve.sql import connect
        from coevolve.store import Store

        con = connect(Store(store_dir), memory_limit=cfg.memory_limit, threads=cfg.threads or None)
        found = {t: v for t, v in run_queries(con, cfg, RUN_ID, round_no).items() if t in KEY}
    else:
        found = pandas_signals(store_dir, cfg, RUN_ID, round_no)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu  # cpu: all threads
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    result = {"seconds": seconds, "cpu_seconds": cpu, "peak_mb": peak_mb, "load": os.getloadavg()[0]}
    Path(out).write_text(json.dumps(result | {"signals": canonical(found)}))


def _child(side: str, store_dir: str, cfg: SignalsConfig, round_no: int, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "coevolve.bench.signals",
        side,
        store_dir,
        json.dumps(cfg.__dict__),
        str(round_no),
        str(out),
    ]
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def _timing(side: dict) -> str:
    # CPU seconds and the machine's load beside the wall time: on a shared machine the
    # wall time alone says more about the neighbours than about the queries
    return f"{side['seconds']:.2f} s wall ({side['cpu_seconds']:.2f} s CPU, load {side['load']:.1f} on {os.cpu_count()} cores)"


def bench(
    rows: int,
    store_dir: str,
    *,
    rounds: int = 4,
    cfg: SignalsConfig | None = None,
    pandas_max_rows: int = 30_000_000,
    echo: Any = print,
) -> dict:
    """Generate the log, mine it both ways in child processes, compare, print the figures.

    Returns ``{"sql": {...}, "pandas": {...} or None, "identical": bool | None, ...}``.
    """
    cfg = cfg or SignalsConfig()
    start = time.perf_counter()
    planted = generate_log(store_dir, rows, rounds=rounds)
    files = list((Path(store_dir) / "tables" / "rollouts").rglob("*.parquet"))
    written = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    size_mb = sum(f.stat().st_size for f in files) / 2**20
    echo(
        f"log: {written:,} step rows, {planted.tasks:,} tasks, rounds 1-{rounds}, {len(files)} files, "
        f"{size_mb:,.0f} MiB, generated in {time.perf_counter() - start:.1f} s ({store_dir})"
    )
    scratch = Path(store_dir) / "bench-results"
    scratch.mkdir(exist_ok=True)
    sql = _child("sql", store_dir, cfg, rounds, scratch / "sql.json")
    counts = ", ".join(f"{t} {len(v):,}" for t, v in sql["signals"].items())
    echo(
        f"SQL (DuckDB, threads={cfg.threads or os.cpu_count()}, memory_limit={cfg.memory_limit}): "
        f"{_timing(sql)}, peak RSS {sql['peak_mb']:,.0f} MiB; signals: {counts}"
    )
    found = {t: {r[KEY[t]] for r in v} for t, v in sql["signals"].items()}
    recovered = sum(t in found["forgetting"] for t in planted.forgetting)
    uncertain = sum(t in found["uncertainty"] for t in planted.uncertain)
    echo(
        f"planted: forgetting {recovered}/{len(planted.forgetting)} recovered; "
        f"uncertainty {uncertain}/{len(planted.uncertain)} recovered; "
        f"rare {planted.rare!r} {'recovered' if planted.rare in found['rare'] else 'MISSED'}; "
        f"near miss {' > '.join(RARE_NEAR_MISS)!r} {'LEAKED' if ' > '.join(RARE_NEAR_MISS) in found['rare'] else 'rejected'}"
    )
    result = {"rows": written, "sql": sql, "pandas": None, "identical": None}
    if written > pandas_max_rows:
        echo(
            f"pandas reference skipped: {written:,} rows > --pandas-max-rows {pandas_max_rows:,} (it would not fit in memory)"
        )
        return result
    ref = _child("pandas", store_dir, cfg, rounds, scratch / "pandas.json")
    problems = compare(sql["signals"], ref["signals"])
    result.update(pandas=ref, identical=not problems)
    echo(f"pandas reference: {_timing(ref)}, peak RSS {ref['peak_mb']:,.0f} MiB")
    echo(f"SQL is {ref['seconds'] / sql['seconds']:.1f}x faster; results {'identical' if not problems else 'DIFFER'}")
    for p in problems:
        echo(f"  {p}")
    return result


if __name__ == "__main__":  # the child processes of `bench`
    _side, _store, _cfg, _round, _out = sys.argv[1:]
    _measure(_side, _store, SignalsConfig(**json.loads(_cfg)), int(_round), _out)
