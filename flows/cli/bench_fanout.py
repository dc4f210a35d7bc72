"""``coevolve bench fanout``: explore + validate of one round, in-process and fanned out.

    coevolve bench fanout                                  # tiny config, a local Dask cluster of 2
    coevolve bench fanout --engine ray --workers 4 --contexts 16

Prepares one store up to round 1's signals (round 0's pool, an untrained policy), copies it,
then times round 1's explore, abstract and validate stages on each copy: in the stage's
process (``fanout.engine: none``) and on the engine (``flows/fanout.py``); the fanned-out
time includes starting the local cluster, as a round pays it. It checks that both copies
accepted the same candidates and prints the figures side by side.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import typer

from coevolve.cli.app import bench_app
from coevolve.cli.common import console, load_config_or_fail, parse_sets, print_table


@bench_app.command("fanout")
def bench_fanout(
    config: str = typer.Option("configs/tiny.yaml", "--config", "-c", help="Run config the round uses."),
    engine: str = typer.Option("dask", help="Fan-out engine: dask or ray."),
    workers: int = typer.Option(2, help="Workers of the local cluster."),
    contexts: int = typer.Option(8, help="Exploration contexts of the round (explore.contexts)."),
    attempts: int = typer.Option(2, help="Solver attempts per candidate in validation pass 2 (validate.attempts)."),
    set_: list[str] = typer.Option([], "--set", help="Override any field: --set explore.steps_per_run=4."),
) -> None:
    """Time exploration and validation in-process and fanned out over a task runner."""
    import os

    # the bench's private Prefect API goes away with it: keep run logs on the console only
    os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    from rich.table import Table

    from flows.cli.run import prefect_api
    from coevolve.round import run_round, run_stage
    from coevolve.sql import connect
    from coevolve.store_open import open_run_store
    from flows.fanout import stage_impl

    base = {
        "rounds": 1,
        "train.steps": 0,
        "train.sft_steps": 0,
        "explore.contexts": contexts,
        "explore.min_contexts": contexts,
        "validate.attempts": attempts,
        "policy.temperature": 0.0,
        **parse_sets(set_),
    }
    with tempfile.TemporaryDirectory(prefix="coevolve-bench-fanout-") as tmp:
        root = Path(tmp)
        cfg = load_config_or_fail(config, {**base, "store": str(root / "prepared")})
        console.print(f"preparing round 1 of {cfg.run_name} ({config}): round 0, then train and signals")
        store = open_run_store(cfg)
        run_round(store, cfg, 0)
        for stage in ("train", "signals"):
            run_stage(store, cfg, 1, stage)
        modes = [("in-process", "none"), (f"{engine} x{workers}", engine)]
        figures, accepted = [], []
        with prefect_api():
            for label, eng in modes:
                shutil.copytree(root / "prepared", root / eng)
                mode_cfg = load_config_or_fail(
                    config, {**base, "store": str(root / eng), "fanout.engine": eng, "fanout.workers": workers}
                )
                mode_store = open_run_store(mode_cfg)
                seconds = {}
                for stage in ("explore", "abstract", "validate"):
                    t0 = time.perf_counter()
                    run_stage(mode_store, mode_cfg, 1, stage, impl=stage_impl(mode_cfg, 1, stage))
                    seconds[stage] = time.perf_counter() - t0
                figures.append((label, seconds))
                accepted.append(
                    connect(mode_store)
                    .sql("select candidate_id from candidates where round = 1 and verdict = 'accepted' order by all")
                    .fetchall()
                )
    table = Table(title=f"coevolve bench fanout: round 1, {contexts} contexts, {attempts} attempts per candidate")
    for head in ("mode", "explore s", "abstract s", "validate s", "total s", "speedup"):
        table.add_column(head, justify="right")
    reference = sum(figures[0][1].values())
    for label, s in figures:
        total = sum(s.values())
        table.add_row(
            label,
            f"{s['explore']:.1f}",
            f"{s['abstract']:.1f}",
            f"{s['validate']:.1f}",
            f"{total:.1f}",
            f"{reference / total:.2f}x",
        )
    print_table(table)
    same = accepted[0] == accepted[1]
    console.print(
        f"accepted candidates: {len(accepted[0])} in-process, {len(accepted[1])} fanned out, "
        f"{'the same' if same else 'DIFFERENT'}"
    )
    if not same:
        raise typer.Exit(1)
