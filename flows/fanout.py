"""Fan-out of exploration contexts and validation candidates over a Prefect task runner.

    fanout: {engine: dask}                               # a local Dask cluster per stage
    fanout: {engine: ray, address: ray://head:10001}      # the Ray cluster verl trains on

With ``fanout.engine: none`` (the default) every stage runs in its task's process, exactly as
without Prefect. With ``ray`` (prefect-ray) or ``dask`` (prefect-dask), the explore stage of
rounds 1..N cuts the round's contexts into chunks and the validate stage cuts pass 2 (the
solver's attempts, the expensive part) into chunks of candidates; each chunk is a Prefect task
on the engine, calling the same library functions the in-process stage calls
(``coevolve.explore``: ``round_contexts``, ``run_sessions``, ``session_rows``;
``coevolve.validate``: ``validate(..., pass2=...)`` with ``pass2_specs`` on each chunk). Results
are joined in the original order and written once by the stage, so the store holds the same rows
as in-process; pass 1 (safety, duplicates, replay) stays in order in the stage, since each
candidate is deduplicated against the ones before it. Round 0 (mechanical checks only) stays in-process.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from prefect import flow, task

from coevolve.config import RunConfig
from coevolve.registry import resolve
from coevolve.events import report_progress
from coevolve.round import RoundContext


# ----------------------------------------------------------------------------- engines
def _ray_runner(cfg: RunConfig) -> Any:
    from prefect_ray import RayTaskRunner

    if cfg.fanout.address:
        return RayTaskRunner(address=cfg.fanout.address)
    return RayTaskRunner(init_kwargs={"num_cpus": cfg.fanout.workers or os.cpu_count(), "include_dashboard": False})


def _dask_runner(cfg: RunConfig) -> Any:
    from prefect_dask import DaskTaskRunner

    if cfg.fanout.address:
        return DaskTaskRunner(address=cfg.fanout.address)
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": cfg.fanout.workers or os.cpu_count(),
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": None,
        }
    )


ENGINES: dict[str, Callable[[RunConfig], Any]] = {"ray": _ray_runner, "dask": _dask_runner}


def n_chunks(cfg: RunConfig, n_items: int) -> int:
    return max(1, min(n_items, cfg.fanout.chunks or cfg.fanout.workers or os.cpu_count() or 1))


def split(items: list[Any], k: int) -> list[list[Any]]:
    """``items`` in ``k`` contiguous chunks of near-equal size (joined back in order)."""
    size, extra = divmod(len(items), k)
    out, start = [], 0
    for i in range(k):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return [c for c in out if c]


def stage_impl(cfg: RunConfig, round_no: int, stage: str) -> Callable[[RoundContext], dict] | None:
    """The fanned-out implementation of ``stage``, or None: the library's, in-process (always
    for round 0, and when rounds 1..N do not explore: ``explore.enabled: false``)."""
    if cfg.fanout.engine == "none" or round_no == 0 or not cfg.explore.enabled:
        return None
    return {"explore": explore_fanout, "validate": validate_fanout}.get(stage)


def _gather(futures: list[Any], round_no: int, stage: str, what: str) -> list[Any]:
    out = []
    for i, future in enumerate(futures, 1):
        out.append(future.result())
        report_progress(round_no, stage, i, len(futures), f"chunks of {what}")
    return out


# ----------------------------------------------------------------------------- explore
@task(name="explore-chunk", retries=1)
def explore_chunk(config: dict[str, Any], run_id: str, contexts: list[Any]) -> list[dict[str, Any]]:
    """Explore ``contexts`` (a chunk of the round's, in order); return their ``explorations`` rows."""
    from coevolve.explore import make_explorer, run_sessions, session_rows

    cfg = RunConfig.from_dict(config)
    env = resolve("environment", cfg.env.name)()
    sessions = run_sessions(
        make_explorer(cfg), contexts, env, cfg.explore.runs_per_context, cfg.explore.steps_per_run, cfg.seed
    )
    return session_rows(run_id, sessions)


@flow(name="coevolve-explore-fanout", flow_run_name="explore fan-out, round {round_no}")
def explore_fanout_flow(config: dict[str, Any], run_id: str, round_no: int, chunks: list[list[Any]]) -> list[dict]:
    futures = [
        explore_chunk.with_options(task_run_name=f"contexts {i + 1} of {len(chunks)}").submit(config, run_id, c)
        for i, c in enumerate(chunks)
    ]
    return [row for rows in _gather(futures, round_no, "explore", "contexts") for row in rows]


def explore_fanout(ctx: RoundContext) -> dict:
    """The explore stage of rounds 1..N with its contexts in chunks on the engine."""
    from coevolve.explore import make_explorer, round_contexts

    cfg = ctx.cfg
    contexts = round_contexts(ctx.store, cfg, ctx.run_id, ctx.round, make_explorer(cfg).signal_guided)
    chunks = split(contexts, n_chunks(cfg, len(contexts)))
    runner = ENGINES[cfg.fanout.engine](cfg)
    rows = (
        explore_fanout_flow.with_options(task_runner=runner)(cfg.to_dict(), ctx.run_id, ctx.round, chunks)
        if chunks
        else []
    )
    return {"n_explorations": ctx.store.write("explorations", ctx.round, f"{ctx.run_id}-explore", rows)}


# ----------------------------------------------------------------------------- validate
@task(name="validate-chunk", retries=1)
def validate_chunk(
    config: dict[str, Any], run_id: str, round_no: int, policy_path: str | None, specs: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pass 2 on a chunk of the candidates that passed pass 1 (``coevolve.validate.pass2_specs``)."""
    from coevolve.validate import pass2_specs

    return pass2_specs(RunConfig.from_dict(config), run_id, round_no, policy_path, specs)


@flow(name="coevolve-validate-fanout", flow_run_name="validate fan-out, round {round_no}")
def validate_fanout_flow(
    config: dict[str, Any], run_id: str, round_no: int, policy_path: str | None, chunks: list[list[str]]
) -> list[tuple[list[dict], list[dict]]]:
    futures = [
        validate_chunk.with_options(task_run_name=f"candidates {i + 1} of {len(chunks)}").submit(
            config, run_id, round_no, policy_path, c
        )
        for i, c in enumerate(chunks)
    ]
    return _gather(futures, round_no, "validate", "candidates")


def validate_fanout(ctx: RoundContext) -> dict:
    """The validate stage of rounds 1..N: pass 1 in order in the stage, pass 2 in chunks on the engine."""
    from coevolve.timing import Splits
    from coevolve.validate import summarize_candidates, validate

    cfg = ctx.cfg
    policy_path = ctx.policy_out()

    def pass2(specs: list[str]) -> tuple[list[dict], list[dict]]:
        chunks = split(specs, n_chunks(cfg, len(specs)))
        runner = ENGINES[cfg.fanout.engine](cfg)
        results = validate_fanout_flow.with_options(task_runner=runner)(
            cfg.to_dict(), ctx.run_id, ctx.round, policy_path, chunks
        )
        return [v for verdicts, _ in results for v in verdicts], [r for _, rows in results for r in rows]

    splits = Splits()
    table = validate(ctx.store, cfg, ctx.run_id, ctx.round, policy_path, pass2=pass2, splits=splits)
    return {**summarize_candidates(table), "split": splits.seconds}
