"""Prefect flow of ``coevolve ablate``: the ladder as one flow, each condition x seed a subflow.

    coevolve ablate --config configs/tiny.yaml --seeds 2 --rounds 1 --store /tmp/abl
    python -m flows.ablate configs/tiny.yaml 2 1 /tmp/abl

A trained condition's subflow is ``round_flow`` of ``flows.evolve`` for round 0 (the
synthesized seed pool) and each round (so its rounds publish their artifacts as any run
does); zero-shot is round 0 and one evaluation. The ablation publishes a Markdown artifact with the summary table and
the report's pictures (written into ``<store>/report``; S3 stores: ``./coevolve-report``).
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from coevolve.ablate import ablation_store, find_run, is_done, plan, record_run, summary, zero_shot_row
from coevolve.config import RunConfig, load_config
from coevolve.report import ablation_markdown
from coevolve.round import run_stage
from coevolve.store_open import open_run_store
from flows.artifacts import artifact_key
from flows.evolve import round_flow


@task(name="zero-shot-evaluate", retries=1, retry_delay_seconds=2)
def zero_shot_task(config: dict[str, Any]) -> dict:
    cfg = RunConfig.from_dict(config)
    return zero_shot_row(cfg, run_stage(open_run_store(cfg), cfg, 0, "evaluate"))


@task(name="record-ablation-run", retries=2, retry_delay_seconds=2)
def record_task(plan_args: dict[str, Any], run_id: str, rows: list[dict]) -> list[dict]:
    run = find_run(plan(**_plan_kwargs(plan_args)), run_id)
    return record_run(ablation_store(run), run, rows)


@flow(name="coevolve-ablation-run", log_prints=True)
def condition_flow(plan_args: dict[str, Any], run_id: str) -> list[dict]:
    """One condition x seed (``run_id``) of the plan, in its own sub-store."""
    run = find_run(plan(**_plan_kwargs(plan_args)), run_id)
    config = run.cfg.to_dict()
    round_flow(config, 0)  # round 0: the run's synthesized seed pool (skipped when its store has one)
    if run.condition.trains:
        rows = [round_flow(config, r) for r in range(1, run.cfg.rounds + 1)]
    else:
        rows = [zero_shot_task(config)]
    return record_task(plan_args, run_id, rows)


def _plan_kwargs(plan_args: dict[str, Any]) -> dict[str, Any]:
    """``plan`` arguments from the flow's JSON-able parameters (the base config as a dict)."""
    return {**plan_args, "base": RunConfig.from_dict(plan_args["base"])}


@flow(name="coevolve-ablate", log_prints=True)
def ablate_flow(
    config: str | None = None,
    seeds: int | None = None,
    rounds: int | None = None,
    store: str | None = None,
    overrides: dict[str, Any] | None = None,
):
    """Run (or resume) the ladder; returns the summary (polars) and publishes it as an artifact.

    ``config`` is a YAML file (default: the embedded default); ``store`` and ``overrides``
    (dotted keys, ``{"train.steps": 4}``) apply to every condition.
    """
    cfg = load_config(config, {"store": store, **(overrides or {})})
    plan_args = {
        "base": cfg.to_dict(),
        "seeds": seeds or cfg.ablate.seeds,
        "rounds": rounds or cfg.rounds,
        "store": cfg.store,
    }
    runs = plan(**_plan_kwargs(plan_args))
    st = ablation_store(runs[0])
    st.check_reachable()
    for run in runs:
        if is_done(st, run):
            print(f"{run.run_id}: finished earlier, skipped")
            continue
        condition_flow.with_options(name=f"coevolve-{run.run_id}")(plan_args, run.run_id)
    df = summary(st)
    publish_ablation(st, df, cfg.s3)
    return df


def publish_ablation(store, df, s3=None) -> None:
    """The ablation's Markdown artifact: the summary table and the report's pictures (``s3``:
    the S3 settings its runs' sub-stores are read with)."""
    markdown = ablation_markdown(store, df, s3=s3)
    create_markdown_artifact(
        key=artifact_key("ablation", store.uri), markdown=markdown, description="coevolve ablation summary"
    )


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    ablate_flow(
        config=args[0] if args else None,
        seeds=int(args[1]) if len(args) > 1 else None,
        rounds=int(args[2]) if len(args) > 2 else None,
        store=args[3] if len(args) > 3 else None,
    )
