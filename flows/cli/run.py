"""``coevolve run``: run (or resume) co-evolution rounds as a Prefect flow.

    coevolve run                                   # embedded default: 2 rounds, SmolLM2, BFCL-V3
    coevolve run --config configs/tiny.yaml --rounds 2 --store /tmp/cv
    coevolve run --set train.steps=4 --set explore.explorer=random

When the store has no pool, round 0 first synthesizes the seed pool from training-scenario
states (explore -> abstract -> validate -> commit, no model); it shows as round 0 in the live
status and the summary.

With no PREFECT_API_URL set, the run starts Prefect's API itself for its duration, as a
child process that dies with it even when the run is killed with SIGKILL (the kernel's
parent-death signal; Prefect's own ephemeral server would outlive a killed run); with one
set (``prefect server start``), the run shows up in the UI. ``prefect_api`` (that private API)
and ``StageStatus`` (the live table) serve the other flow-driving commands too (``flows/cli``).
"""

from __future__ import annotations

import contextlib
import json
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import typer

from coevolve.cli.app import app
from coevolve.cli.common import console, parse_sets, preflight, print_table
from coevolve.processes import free_port, stop
from coevolve.timing import machine_line


class StageStatus:
    """A live table of stages, fed by the stage events (``coevolve.events`` listeners).

    ``log``: also print one line per stage event (progress at most every ``log_every_s``), for
    output that is not a terminal (a log file, CI), where a live table shows nothing until the end.
    """

    def __init__(self, log: Callable[[str], None] | None = None, log_every_s: float = 30.0) -> None:
        self.rows: dict[tuple[int, str], tuple[str, str]] = {}
        self.started: dict[tuple[int, str], float] = {}
        self.log = log
        self.log_every_s = log_every_s
        self._last_logged: dict[tuple[int, str], float] = {}

    def __call__(self, event: str, round_no: int, stage: str, info: dict) -> None:
        key = (round_no, stage)
        if event == "start":
            self.started[key] = time.perf_counter()
            self.rows[key] = ("running", "")
        elif event == "progress":
            self.rows[key] = ("running", f"{info['done']}/{info['total']} {info.get('note', '')}"[:100])
        elif event == "skip":
            self.rows[key] = ("skipped (done)", _brief(info))
        else:
            self.rows[key] = (f"done {info.get('seconds', 0):.1f}s", _brief(info))
        if self.log is not None:
            now = time.perf_counter()
            if event == "progress" and now - self._last_logged.get(key, 0.0) < self.log_every_s:
                return
            self._last_logged[key] = now
            status, brief = self.rows[key]
            self.log(f"round {round_no} {stage}: {status} {brief}".rstrip())

    def __rich__(self):
        from rich.spinner import Spinner
        from rich.table import Table

        table = Table("round", "stage", "status", "summary", box=None, padding=(0, 1))
        for (r, stage), (status, brief) in self.rows.items():
            if status == "running":
                elapsed = time.perf_counter() - self.started[(r, stage)]
                status_cell = Spinner("dots", text=f"running {elapsed:.0f}s")
            else:
                status_cell = status
            table.add_row(str(r), stage, status_cell, brief)
        return table


def _brief(info: dict) -> str:
    parts = []
    for k, v in info.items():
        if k in ("seconds", "per_category", "checkpoint") or isinstance(v, (dict, list)):
            continue
        parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)[:100]


_METRICS = [
    ("round", "round"),
    ("pool", "pool_size"),
    ("signals", "n_signals"),  # every type; the per-type counts have their own table
    ("cands", "n_candidates"),
    ("kept", "n_accepted"),
    ("pass", "pass_rate"),
    ("partial", "partial_share"),  # accepted by failure with positive reward
    ("trainR", "train_reward"),
    ("eval", "eval_score"),
    ("evalR", "eval_reward"),
    ("synth", "synth_score"),
    ("synthR", "synth_reward"),
]
_TIMINGS = [
    ("round", "round"),
    ("train", "t_train"),
    ("signals", "t_signals"),
    ("explore", "t_explore"),
    ("abstract", "t_abstract"),
    ("validate", "t_validate"),
    ("commit", "t_commit"),
    ("eval", "t_evaluate"),
    ("total", "t_total"),
]
# where the time went inside train, validate and evaluate (coevolve.timing.SPLIT_COLUMNS)
_SPLITS = [
    ("round", "round"),
    ("load", "t_train_load"),
    ("sft", "t_train_sft"),
    ("rollout", "t_train_rollouts"),
    ("update", "t_train_update"),
    ("ckpt", "t_train_checkpoint"),
    ("pass1", "t_validate_pass1"),
    ("pass2", "t_validate_pass2"),
    ("prefill", "t_evaluate_prefill"),
    ("decode", "t_evaluate_decode"),
    ("rest", "t_evaluate_rest"),
]


def _signal_counts(row: dict) -> dict[str, int]:
    """The round's signals per type: ``signal_counts`` (JSON, every signal file), else the paper's three."""
    raw = row.get("signal_counts")
    if raw:
        return json.loads(raw) if isinstance(raw, str) else dict(raw)
    return {t: row[f"signals_{t}"] for t in ("forgetting", "boundary", "rare") if row.get(f"signals_{t}") is not None}


def summary_tables(rows: list[dict]):
    """Up to four tables (metrics; signals per type; stage seconds; the split inside train,
    validate and evaluate), about 80 columns wide; the signals table only for rounds that mined
    signals, the split only for rounds that recorded one."""
    from rich import box
    from rich.table import Table

    out = []
    counts = {id(r): _signal_counts(r) for r in rows}
    rows = [{**r, "n_signals": sum(counts[id(r)].values()) if counts[id(r)] else None} for r in rows]
    types = list(dict.fromkeys(t for c in counts.values() for t in c))
    signal_rows = [{"round": r["round"], **_signal_counts(r)} for r in rows if _signal_counts(r)]
    # headers cut to 14 characters (a user's signal may have a long name); the order is the stage's
    signal_cols = [("round", "round")] + [(t[:14], t) for t in types]
    split_rows = [r for r in rows if any(r.get(key) is not None for _, key in _SPLITS[1:])]
    tables = [("per-round summary", _METRICS, rows)]
    if signal_rows:
        tables.append(("signals per type", signal_cols, signal_rows))
    tables.append(("stage timings (seconds)", _TIMINGS, rows))
    if split_rows:
        tables.append(("inside train | validate | evaluate (seconds)", _SPLITS, split_rows))
    for title, cols, table_rows in tables:
        table = Table(
            title=f"coevolve: {title}", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True
        )
        if cols is _METRICS and any(row.get("round") == 0 for row in rows):
            table.caption = "round 0: the seed pool, synthesized from training-scenario states"
        for head, _ in cols:
            table.add_column(head, justify="right", no_wrap=True, min_width=len(head))
        for row in table_rows:
            cells = []
            for _, key in cols:
                v = row.get(key)
                cells.append("-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v))
            table.add_row(*cells)
        out.append(table)
    return out


def round_warnings(rows: list[dict]) -> list[str]:
    """The rounds' warnings (``rounds.warnings``: reward hacking), one line each."""
    out = []
    for r in rows:
        for w in json.loads(r.get("warnings") or "[]"):
            out.append(f"warning: round {r['round']}: {w}")
    return out


def print_summary(rows: list[dict]) -> None:
    """The summary tables on stdout, then the rounds' warnings; a log file or a pipe gets every
    column (print_table)."""
    for table in summary_tables(rows):
        print_table(table)
    for line in round_warnings(rows):
        console.print(line, style="bold yellow", highlight=False)


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the forked child, before exec: SIGKILL me when my parent dies (Linux prctl)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the atexit stop below still covers clean exits
        pass


@contextlib.contextmanager
def prefect_api(timeout_s: float = 120.0) -> Iterator[str | None]:
    """Prefect's API for one run: the configured one, or a private server that lives exactly
    as long as this process (stopped on exit, SIGKILLed by the kernel if we are killed).
    Yields the API URL (None when PREFECT_API_URL is already set)."""
    if os.environ.get("PREFECT_API_URL"):
        yield None
        return
    import httpx
    import prefect
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    # its own database, gone with it: a run killed earlier must not stay "Running" there, where a
    # resumed run would take it for another run of its lineage still in progress
    db_dir = tempfile.mkdtemp(prefix="coevolve-prefect-")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--app-dir",
            str(prefect.__module_path__.parent),
            "--factory",
            "prefect.server.api.server:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "error",
            "--lifespan",
            "on",
        ],
        env={
            **os.environ,
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{db_dir}/prefect.db",
        },
        preexec_fn=_die_with_parent,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"the Prefect API server exited with code {server.returncode} while starting")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Prefect API server did not answer on {url} within {timeout_s:.0f}s")
            time.sleep(0.2)
        with temporary_settings({PREFECT_API_URL: url}):
            os.environ["PREFECT_API_URL"] = url  # for any child process of the run
            try:
                yield url
            finally:
                os.environ.pop("PREFECT_API_URL", None)
    finally:
        stop(server)
        shutil.rmtree(db_dir, ignore_errors=True)


@app.command()
def run(
    config: str = typer.Option(None, "--config", "-c", help="YAML run config (default: the embedded default)."),
    rounds: int = typer.Option(None, help="Rounds to run (overrides the config)."),
    store: str = typer.Option(None, help="Store: local directory or s3://bucket/prefix (overrides the config)."),
    run_name: str = typer.Option(None, help="Run name (overrides the config); same name + store = resume."),
    set_: list[str] = typer.Option([], "--set", help="Override any field: --set train.steps=4 (repeatable)."),
) -> None:
    """Run, or resume, co-evolution rounds (Prefect flow); ends with a per-round summary."""
    overrides = {"rounds": rounds, "store": store, "run_name": run_name, **parse_sets(set_)}
    cfg = preflight(config, overrides)
    if config:  # the flow reads configs only from allowed folders; the CLI's user chose this one
        from coevolve.config import CONFIG_DIRS_ENV

        folders = [str(Path(config).expanduser().resolve().parent), os.environ.get(CONFIG_DIRS_ENV, "")]
        os.environ[CONFIG_DIRS_ENV] = os.pathsep.join(f for f in folders if f)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    from rich.live import Live

    from coevolve.events import add_listener
    from flows.evolve import evolve

    console.print(
        f"[bold]coevolve[/bold] run [cyan]{cfg.run_name}[/cyan]: {cfg.rounds} round(s), "
        f"env {cfg.env.name}, model {cfg.policy.model}, explorer {cfg.explore.explorer}, store {cfg.store}"
    )
    # a terminal gets a live table; a log file gets a line per stage event
    status = StageStatus(log=None if console.is_terminal else lambda line: console.print(line, highlight=False))
    remove = add_listener(status)
    try:
        with prefect_api(), Live(status, console=console, refresh_per_second=4, transient=False):
            rows = evolve(config=config or "", overrides={k: v for k, v in overrides.items() if v is not None})
    finally:
        remove()
    print_summary(rows)
    console.print(machine_line(), highlight=False)
    console.print(f'Query the results: coevolve sql --store {cfg.store} "select * from rounds"')
