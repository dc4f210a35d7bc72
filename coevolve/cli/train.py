"""``coevolve train``: train the policy on the store's task pool once, outside the round flow
(``coevolve bench train`` / ``bench sft``, local training throughput and the SFT warm start's
effect, are in ``coevolve/cli/bench.py``).

    coevolve train --config configs/tiny.yaml --store /tmp/cv-train       # local trainer
    coevolve train --config configs/bfcl_qwen_gpu.yaml --backend verl --dry-run

``--dry-run`` (verl) writes the round's dataset and agent-loop files, composes and validates
verl's config, and prints it with the exact launch command, without launching anything.
The pool's train split is used; a store without a pool first runs round 0 (synthesizes and
commits the seed pool), dry run or not. The files go beside the round's checkpoint
(``train.checkpoint_dir``, default the store's ``checkpoints/``)."""

from __future__ import annotations

import time

import typer

from coevolve.cli.app import app
from coevolve.cli.common import console, err_console, fail


@app.command("train")
def train(
    config: str = typer.Option(None, "--config", "-c", help="YAML run config."),
    backend: str = typer.Option(None, "--backend", help="Trainer: local | verl (default: train.backend)."),
    store: str = typer.Option(None, "--store", help="Store URI (default: from the config)."),
    round_no: int = typer.Option(1, "--round", help="Round number the rollouts and checkpoint are filed under."),
    policy: str = typer.Option(None, "--policy", help="Starting policy (default: policy.model)."),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="verl: write the round's dataset (from the store's pool) and config files, print the config and "
        "launch command; launches nothing.",
    ),
    set_: list[str] = typer.Option([], "--set", help="Config override KEY=VALUE (repeatable)."),
) -> None:
    """Train the policy on the store's pool once (local or verl); --dry-run shows verl's config."""
    from coevolve.cli.common import parse_sets, preflight

    overrides = {**parse_sets(set_), "train.backend": backend, "store": store}
    cfg = preflight(config, overrides)
    from coevolve.round import open_run_store, pool_tasks, seed_pool

    run_store = open_run_store(cfg)
    if run_store.latest_pool() is None:  # both trainers (and the dry run's dataset) read the pool's train split
        from coevolve.config import ConfigError

        err_console.print(f"{cfg.store} has no task pool: running round 0 first to synthesize one", style="dim")
        try:
            seed_pool(run_store, cfg)
        except ConfigError as exc:
            fail(str(exc))
    tasks = pool_tasks(run_store, "train")
    if not tasks:
        fail(f"the pool in {cfg.store} has no train tasks")
    policy_in = policy or cfg.policy.model
    if dry_run:
        if cfg.train.backend != "verl":
            fail("--dry-run shows verl's launch; use it with --backend verl")
        from coevolve.train.verl_config import format_command
        from coevolve.train.verl_launch import prepare

        plan = prepare(cfg, cfg.run_name, round_no, policy_in, tasks)
        # plain echo: the command must stay one pasteable line, unwrapped
        typer.echo(plan.yaml)
        typer.echo(f"# files: {plan.workdir}")
        for note in plan.notes:  # choices made at launch (attention kernel, copies to shared storage)
            typer.echo(f"# {note}")
        typer.echo(f"# launch command:\n{format_command(plan.command)}")
        return
    from coevolve.train import train_round

    started = time.monotonic()
    result = train_round(run_store, cfg, cfg.run_name, round_no, policy_in, tasks)
    console.print(
        f"trained {len(tasks)} tasks in {time.monotonic() - started:.0f}s: {result.n_rollouts} rollouts, "
        f"mean reward {result.mean_reward:.3f}, success {result.success_rate:.3f}\ncheckpoint: {result.checkpoint}"
    )
