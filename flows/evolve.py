"""Prefect flows of coevolve: one round as its stage tasks, and a run that continues a lineage.

    python -m flows.evolve                      # run the embedded default under Prefect
    coevolve run --config configs/tiny.yaml    # the same, from the CLI

A lineage is a run name in a store. ``evolve`` with ``rounds_per_run = 0`` runs (or resumes)
rounds 1..``rounds`` of the config, as ``coevolve run`` does; with ``rounds_per_run = n`` it
continues the lineage: the n rounds after the last finished one (the nightly deployment in
``deployments/prefect.yaml``: night 1 runs rounds 1-2, night 2 rounds 3-4), as planned by
``coevolve.lineage.plan_lineage``. Round 0 (the seed pool's synthesis: explore -> abstract ->
validate -> commit) runs first when the store has no pool. A run finds another run of the same lineage still in progress (Prefect flow runs
tagged ``lineage:<run>:<store hash>``) and then does nothing but say so in its log.

Each round is a subflow run named ``<run> round <r>``; each stage is a task that calls
``coevolve.round.run_stage``, logs progress and a summary sentence, and keeps a progress
artifact (``flows/progress.py``); stage outputs live in the store, so a retried or resumed
task skips what is already committed. Each round publishes its Markdown summary artifact
when it ends. Exploration and validation fan out over Prefect tasks on Ray or Dask when
``fanout.engine`` says so (``flows/fanout.py``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from coevolve.config import RunConfig, check_config_path
from coevolve.lineage import plan_lineage
from coevolve.round import record_round, round_stages, run_stage
from coevolve.store_open import open_run_store
from flows.artifacts import artifact_key
from flows.progress import FIRST_LOOK, StageProgress, round_summary_markdown

# Training is long and restarts from the round's start; the other stages are cheap to retry.
_RETRIES = {"train": 0}


@task(name="plan-round", retries=2, retry_delay_seconds=2)
def plan_task(config: dict[str, Any], round_no: int) -> list[str]:
    cfg = RunConfig.from_dict(config)
    return list(round_stages(open_run_store(cfg), cfg, round_no))


@task(retries=1, retry_delay_seconds=2)
def stage_task(config: dict[str, Any], round_no: int, stage: str) -> dict:
    from flows.fanout import stage_impl

    cfg = RunConfig.from_dict(config)
    store = open_run_store(cfg)
    with StageProgress(store, cfg, round_no, stage):
        return run_stage(store, cfg, round_no, stage, impl=stage_impl(cfg, round_no, stage))


@task(name="record-round", retries=2, retry_delay_seconds=2)
def record_task(config: dict[str, Any], round_no: int) -> dict:
    cfg = RunConfig.from_dict(config)
    return record_round(open_run_store(cfg), cfg, round_no)


def _round_run_name() -> str:
    from prefect.runtime import flow_run

    p = flow_run.parameters
    return f"{p['config'].get('run_name', 'run')} round {p['round_no']}"


@flow(name="coevolve-round", flow_run_name=_round_run_name, log_prints=True)
def round_flow(config: dict[str, Any], round_no: int) -> dict | None:
    """train -> signals -> explore -> abstract -> validate -> commit -> evaluate
    (round 0: explore -> abstract -> validate -> commit; None when it is skipped)."""
    stages = plan_task(config, round_no)
    if not stages:
        get_run_logger().info("round %d: the store already has a pool this run did not synthesize: skipped", round_no)
        return None
    for stage in stages:
        stage_task.with_options(
            name=stage, task_run_name=f"{stage} (round {round_no})", retries=_RETRIES.get(stage, 1)
        )(config, round_no, stage)
    row = record_task(config, round_no)
    publish_round_task(config, round_no, row)
    return row


@task(name="publish-round")
def publish_round_task(config: dict[str, Any], round_no: int, row: dict) -> None:
    """The round's Markdown artifact: a sentence and the first-look table, then the run's
    report pictures so far. A picture that cannot be drawn is logged, never fails the round."""
    from coevolve.report import round_markdown

    cfg = RunConfig.from_dict(config)
    summary = round_summary_markdown(row)
    get_run_logger().info("round %d finished. %s", round_no, summary.splitlines()[0])
    try:
        details = round_markdown(open_run_store(cfg), cfg.run_name, round_no)
    except Exception as exc:  # the artifact is a view; the round's data is already committed
        get_run_logger().warning("round %d: no report pictures: %s", round_no, exc)
        details = ""
    create_markdown_artifact(
        key=artifact_key("coevolve", cfg.run_name, "round", round_no),
        markdown=f"# {cfg.run_name}: round {round_no} summary\n\n{summary}\n{details}",
        description=f"coevolve {cfg.run_name}: round {round_no} summary",
    )


# ----------------------------------------------------------------------------- the lineage
def lineage_tag(cfg: RunConfig) -> str:
    """The Prefect tag of a lineage: its run name and a hash of its store's location."""
    where = cfg.store if cfg.store.startswith("s3://") else str(Path(cfg.store).resolve())
    return f"lineage:{cfg.run_name}:{hashlib.sha1(where.encode()).hexdigest()[:10]}"


def lineage_in_progress(cfg: RunConfig) -> Any:
    """Tag this flow run with its lineage; return another Running flow run of the lineage that
    started before this one (None if there is none, or outside a flow run)."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.runtime import flow_run

    me = flow_run.id
    if not me:
        return None
    tag = lineage_tag(cfg)
    with get_client(sync_client=True) as client:
        mine = client.read_flow_run(me)
        client.update_flow_run(me, tags=sorted({*mine.tags, tag}))
        running = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[tag]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING])),
            )
        )

    def order(r: Any) -> tuple:
        return (r.start_time or r.expected_start_time, str(r.id))

    earlier = sorted((r for r in running if str(r.id) != str(me) and order(r) < order(mine)), key=order)
    return earlier[0] if earlier else None


@flow(name="coevolve-evolve", log_prints=True)
def evolve(
    config: str = "",
    rounds_per_run: Annotated[int, Field(ge=0, le=10_000)] = 0,
    store: str = "",
    run_name: Annotated[str, Field(pattern=r"^$|^\s*[A-Za-z0-9][A-Za-z0-9._-]{0,127}\s*$")] = "",
    overrides: Annotated[dict[str, Any], Field(examples=[{"train.steps": 4, "explore.explorer": "random"}])] = {},  # noqa: B006
) -> list[dict]:
    """Co-evolution rounds of one lineage (a run name in a store); round 0 first when the store has no pool.

    Args:
        config: Run config YAML, relative to the repository root the worker runs in
            (e.g. configs/tiny.yaml); only files in configs/ or a folder of the worker's
            $COEVOLVE_CONFIG_DIRS are read. Empty = the embedded default (SmolLM2-135M on BFCL-V3,
            2 rounds, store .coevolve/store, run name "default"; several minutes a round on
            2 CPU cores).
        rounds_per_run: Rounds this run adds after the lineage's last finished round
            (2 = night 1 runs rounds 1-2, night 2 rounds 3-4). 0 = run the config's `rounds`
            from round 1, resuming what is done (what `coevolve run` does).
        store: Store location, a local directory or s3://bucket/prefix. Empty = the config's
            `store`.
        run_name: Name of the lineage in the store (letters, digits, '.', '_', '-').
            Empty = the config's `run_name`.
        overrides: Any other config field by dotted key, e.g. {"train.steps": 4,
            "explore.explorer": "random"}. Empty = the config file as it is. Data, never
            code: a 'module:attr' plug-in must be trusted by the config file (trust.plugins),
            `trust` cannot be overridden, and an overridden endpoint (base_url) gets no API key.
    """
    if config.strip():  # a form field: only a config of an allowed folder, named, never quoted
        check_config_path(config.strip())
    log = get_run_logger()
    cfg, rounds = plan_lineage(config, rounds_per_run, store, run_name, overrides)
    busy = lineage_in_progress(cfg)
    if busy is not None:
        log.warning(
            "lineage %r on %s is in progress in flow run %r (%s, started %s): this run does nothing",
            cfg.run_name,
            cfg.store,
            busy.name,
            busy.id,
            busy.start_time,
        )
        return []
    todo = [r for r in rounds if r > 0]
    log.info(
        "lineage %r on %s: %s%s",
        cfg.run_name,
        cfg.store,
        f"rounds {todo[0]}-{todo[-1]}" if len(todo) > 1 else f"round {todo[0]}" if todo else "no rounds",
        " (round 0 first: the seed pool)" if 0 in rounds else "",
    )
    config_dict = cfg.to_dict()
    rows = [row for r in rounds if (row := round_flow(config_dict, r)) is not None]
    if rows:
        create_table_artifact(
            key=artifact_key("coevolve", cfg.run_name),
            table=[{"round": row["round"], **{h: row.get(k) for h, k in FIRST_LOOK if k}} for row in rows],
            description=f"coevolve run {cfg.run_name}: the rounds of this run",
        )
    return rows


if __name__ == "__main__":
    evolve()
