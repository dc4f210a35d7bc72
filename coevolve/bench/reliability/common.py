"""What the fault campaign's scenarios share: its config, a scenario's result, the store checks
(rows lost, duplicated, corrupt pool versions against a reference run) and child runs.

A child run is ``python -m coevolve.bench.reliability child ...`` (``__main__.py``): one
``run_rounds`` of a run config in a process of its own, from the repository root.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]  # children run from the repository root

# Key columns of each table: a row is lost when the reference run has its key and the
# chaos run does not; duplicated when a key occurs twice. Tables the schema lacks are skipped.
KEYS: dict[str, tuple[str, ...]] = {
    "rollouts": ("run_id", "round", "phase", "episode_id", "turn", "step"),
    "signals": ("run_id", "round", "signal_id"),
    "explorations": ("run_id", "round", "signal_id", "run_idx", "step"),
    "candidates": ("run_id", "round", "candidate_id"),
    "tasks": ("task_id",),
    "pool_versions": ("run_id", "round"),
    "rounds": ("run_id", "round"),
}

# A small run: seconds per stage with the tiny model on 2 cores.
SMALL_RUN: dict[str, Any] = {
    "train.sft_steps": 4,
    "train.steps": 1,
    "train.group_size": 2,
    "train.tasks_per_step": 1,
    "synth.scenarios": 2,
    "synth.contexts_per_scenario": 1,
    "eval.scenarios": 1,
    "eval.categories": ["multi_turn_base"],
    "eval.step_limit": 2,
    "eval.max_new_tokens": 24,
    "env.step_limit": 2,
    "policy.max_new_tokens": 24,
    "explore.runs_per_context": 1,
    "explore.steps_per_run": 2,
}


@dataclass
class CampaignConfig:
    scenarios: list[str] = field(
        default_factory=lambda: [
            "kill",
            "torn-writes",
            "damaged-parts",
            "damaged-parts-s3",
            "concurrent-local",
            "concurrent-s3",
            "s3-faults",
            "fuzz",
        ]
    )
    config: str | None = "configs/tiny.yaml"  # run config of the kill and fault runs
    overrides: dict[str, Any] = field(default_factory=lambda: dict(SMALL_RUN))
    rounds: int = 2  # rounds of the kill, torn-writes and damaged-parts scenarios' runs
    kills: int = 20  # SIGKILL points of the kill and torn-writes scenarios
    procs: int = 4  # concurrent committing processes
    commits: int = 5  # commits per process
    fault_rate: float = 0.1  # share of S3 requests the proxy breaks
    fault_rounds: int = 1  # rounds of the run through the faulty proxy (0 = commits only)
    fuzz: int = 1_000_000  # fuzzed model outputs
    seed: int = 0
    workdir: str = ""  # where stores live ('' = a temporary directory)
    run_timeout_s: float = 1800.0  # one child run's wall-clock limit


@dataclass
class ScenarioResult:
    scenario: str
    tried: int = 0
    survived: int = 0
    rows_lost: int = 0
    rows_duplicated: int = 0
    corrupt_versions: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.tried > 0
            and self.survived == self.tried
            and self.rows_lost == 0
            and self.rows_duplicated == 0
            and self.corrupt_versions == 0
        )


def table_keys(store: Any, max_round: int | None = None) -> dict[str, list[tuple]]:
    """Per table, the key tuples of its rows (duplicates kept), rows of rounds <= max_round."""
    import pyarrow.dataset as ds

    from coevolve.schemas import TABLES

    out: dict[str, list[tuple]] = {}
    for table, cols in KEYS.items():
        if table not in TABLES or not set(cols) <= set(TABLES[table].names) | {"round"}:
            continue
        filt = (ds.field("round") <= max_round) if max_round is not None else None
        t = store.read(table, filter=filt, columns=list(cols))
        out[table] = list(zip(*(t.column(c).to_pylist() for c in cols))) if t.num_rows else []
    return out


def compare_keys(reference: dict[str, list[tuple]], got: dict[str, list[tuple]]) -> tuple[int, int, list[str]]:
    """(rows lost, rows duplicated, notes) of ``got`` against ``reference``."""
    lost = dup = 0
    notes = []
    for table, ref in reference.items():
        have = got.get(table, [])
        missing = set(ref) - set(have)
        extra = set(have) - set(ref)
        lost += len(missing)
        dup += len(have) - len(set(have))
        if missing:
            notes.append(f"{table}: {len(missing)} keys missing, e.g. {sorted(missing, key=str)[0]}")
        if extra:
            notes.append(f"{table}: {len(extra)} keys the reference lacks, e.g. {sorted(extra, key=str)[0]}")
    return lost, dup, notes


def corrupt_versions(store: Any) -> tuple[int, list[str]]:
    """Committed pool versions that do not read back exactly (rows = manifest ids)."""
    bad, notes = 0, []
    try:
        versions = store.committed()
    except Exception as exc:  # a broken chain is itself corruption
        return 1, [f"pool chain unreadable: {type(exc).__name__}: {exc}"]
    for v in versions:
        try:
            ids = store.pool_tasks(v).column("task_id").to_pylist()
            if ids != v.task_ids:
                raise ValueError(f"{len(ids)} rows for {len(v.task_ids)} ids")
        except Exception as exc:
            bad += 1
            notes.append(f"v{v.version}: {type(exc).__name__}: {str(exc)[:120]}")
    return bad, notes


def _child(args: list[str], timeout_s: float, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "coevolve.bench.reliability", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=REPO)


def run_child(
    config: str | None,
    overrides: dict,
    target: dict | None,
    trace: str | None,
    timeout_s: float,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """One run in a child process: ``config`` + ``overrides``; ``target``, a kill point; ``trace``,
    a file for its store operations per stage (``coevolve.bench.reliability.kill``)."""
    args = ["child", "--overrides", json.dumps(overrides)]
    if config:
        args += ["--config", config]
    if target:
        args += ["--target", json.dumps(target)]
    if trace:
        args += ["--trace", trace]
    return _child(args, timeout_s, env)


def last_line(proc: subprocess.CompletedProcess) -> str:
    """The last line a child wrote to stderr (its error), or its exit code."""
    lines = [x for x in (proc.stderr or "").strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else f"exit code {proc.returncode}"
