"""Prefect flows of coevolve: one round as its stage tasks, and round 0 + N rounds.

    python -m flows.evolve                      # run the embedded default under Prefect
    coevolve run --config configs/tiny.yaml    # the same, from the CLI

Round 0 (the seed pool's synthesis: explore -> abstract -> validate -> commit) runs as its
stages when the store has no pool. Each task is a few lines that call one library function
in ``coevolve.round``; stage
outputs live in the store, so a retried or resumed task skips what is already committed.
The deployment in ``deployments/prefect.yaml`` serves ``evolve`` with a nightly schedule.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from coevolve.config import RunConfig, load_config
from coevolve.round import open_run_store, record_round, round_stages, run_stage

# Training is long and restarts from the round's start; the other stages are cheap to retry.
_RETRIES = {"train": 0}


@task(name="plan-round", retries=2, retry_delay_seconds=2)
def plan_task(config: dict[str, Any], round: int) -> list[str]:
    cfg = RunConfig.from_dict(config)
    return list(round_stages(open_run_store(cfg), cfg, round))


@task(retries=1, retry_delay_seconds=2)
def stage_task(config: dict[str, Any], round: int, stage: str) -> dict:
    cfg = RunConfig.from_dict(config)
    summary = run_stage(open_run_store(cfg), cfg, round, stage)
    get_run_logger().info("round %d %s: %s", round, stage, summary)
    return summary


@task(name="record-round", retries=2, retry_delay_seconds=2)
def record_task(config: dict[str, Any], round: int) -> dict:
    cfg = RunConfig.from_dict(config)
    return record_round(open_run_store(cfg), cfg, round)


@flow(name="coevolve-round", log_prints=True)
def round_flow(config: dict[str, Any], round: int) -> dict | None:
    """train -> signals -> explore -> abstract -> validate -> commit -> evaluate
    (round 0: explore -> abstract -> validate -> commit; None when it is skipped)."""
    stages = plan_task(config, round)
    if not stages:
        return None
    for stage in stages:
        stage_task.with_options(name=stage, retries=_RETRIES.get(stage, 1))(config, round, stage)
    row = record_task(config, round)
    publish_round_task(config, round)
    return row


@task(name="publish-round")
def publish_round_task(config: dict[str, Any], round: int) -> None:
    """The round's Markdown artifact: its metrics and the run's report pictures so far.
    A picture that cannot be drawn is logged, never fails the round."""
    import re

    from coevolve.report import round_markdown

    cfg = RunConfig.from_dict(config)
    try:
        markdown = round_markdown(open_run_store(cfg), cfg.run_name, round)
    except Exception as exc:  # the artifact is a view; the round's data is already committed
        get_run_logger().warning("round %d: no report artifact: %s", round, exc)
        return
    key = re.sub(r"[^a-z0-9-]+", "-", f"coevolve-{cfg.run_name}-round-{round}".lower()).strip("-")
    create_markdown_artifact(key=key[:100], markdown=markdown, description=f"coevolve {cfg.run_name}: round {round}")


@flow(name="coevolve-evolve", log_prints=True)
def evolve(
    config: str | None = None,
    rounds: int | None = None,
    store: str | None = None,
    run_name: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> list[dict]:
    """Run (or resume) round 0 (when the store has no pool) and ``rounds`` co-evolution rounds.

    ``config`` is a YAML file (default: the embedded default); ``rounds``, ``store`` and
    ``run_name`` override it, and ``overrides`` sets any other field by dotted key
    (``{"train.steps": 4}``) — all of them settable from the Prefect UI.
    """
    cfg = load_config(config, {"rounds": rounds, "store": store, "run_name": run_name, **(overrides or {})})
    config_dict = cfg.to_dict()
    rows = [row for r in range(0, cfg.rounds + 1) if (row := round_flow(config_dict, r)) is not None]
    create_table_artifact(
        key=f"coevolve-{cfg.run_name}".lower().replace("_", "-"),
        table=[{k: v for k, v in row.items() if not k.startswith("t_") and k != "finished_at"} for row in rows],
        description=f"coevolve run {cfg.run_name}: per-round summary",
    )
    return rows


if __name__ == "__main__":
    evolve()
