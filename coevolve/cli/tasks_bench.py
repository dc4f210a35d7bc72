"""``coevolve bench tasks``: quality-gate verdicts and shape figures of a store's latest pool.

coevolve bench tasks --store .coevolve/store              # per round, with BFCL-V3's own entries beside
coevolve bench tasks --store S --no-yardstick --json f.json
coevolve bench tasks --store S --yardstick-limit 50        # a cheaper yardstick
coevolve bench tasks --store S --samples 10                # and 10 pool tasks, whole, drawn reproducibly

The figures are ``coevolve.tasks_bench.pool_report``'s (its docstring defines each one). The
yardstick column (default on for a BFCL-V3 pool) is printed, never written: ``--json`` holds
the pool's figures only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from coevolve.cli.app import bench_app
from coevolve.cli.common import console, fail, open_store_or_fail


@bench_app.command("tasks")
def bench_tasks(
    store: str = typer.Option(".coevolve/store", "--store", "-s", help="Local directory or s3://bucket/prefix."),
    env_name: str = typer.Option("", "--env", help="Only this environment's tasks (default: every task of the pool)."),
    yardstick: Optional[bool] = typer.Option(
        None,
        "--yardstick/--no-yardstick",
        help="Print BFCL-V3 multi_turn_base's own figures beside the pool's (default: on for a bfcl-v3 pool).",
    ),
    yardstick_limit: int = typer.Option(200, help="BFCL entries the yardstick reads (0 = all 200)."),
    json_path: str = typer.Option("", "--json", help="Also write the pool's figures to this JSON file."),
    samples: int = typer.Option(0, help="Also print this many pool tasks whole, drawn with order by random()."),
    sample_seed: float = typer.Option(0.24, help="DuckDB setseed() of the draw, in [0, 1] (same seed, same tasks)."),
) -> None:
    """Share of the pool's training tasks passing the quality gate, per rule; turns, calls,
    state changes, reused results and function coverage, overall and per created round."""
    from coevolve.tasks_bench import bfcl_yardstick, pool_report, render, render_tasks, sample_tasks

    st = open_store_or_fail(store)
    if st.latest_pool() is None:
        fail(f"no committed pool in {store}")
    report = pool_report(st, env_name or None)
    if yardstick is None:
        yardstick = (env_name or "") == "bfcl-v3" or report["envs"] == ["bfcl-v3"]
    ys = bfcl_yardstick(yardstick_limit) if yardstick else None
    out = console if console.is_terminal else Console(width=240)  # pipes and logs get every cell
    render(report, ys, out)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1))  # the pool's figures only, never the yardstick's
        out.print(f"figures written to {json_path}", markup=False)
    if samples:
        out.print(f"\n{samples} tasks drawn with setseed({sample_seed}) and order by random():", markup=False)
        render_tasks(sample_tasks(st, samples, sample_seed), out)
