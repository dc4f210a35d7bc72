"""Scale-out (issue 15): exploration contexts and validation candidates fan out as Prefect tasks on
a local Dask cluster (prefect-dask) and give the same rows as the in-process stages."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")
# pass 2 on (the policy attempts each candidate), greedy so that chunking cannot change an attempt
ROUND = {
    "rounds": 1,
    "train.steps": 0,
    "train.sft_steps": 0,
    "explore.contexts": 4,
    "explore.min_contexts": 4,
    "explore.runs_per_context": 2,
    "validate.solver": "policy",  # the tiny config turns pass 2 off
    "validate.attempts": 1,
    "policy.temperature": 0.0,
    "eval.categories": ["multi_turn_base"],
    "eval.step_limit": 1,
    "eval.max_new_tokens": 8,
}

pytestmark = pytest.mark.slow


def test_split_keeps_order_and_sizes():
    from flows.fanout import split

    assert split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split([1], 4) == [[1]] and split([], 2) == []


def _rows(store: str) -> dict[str, list]:
    from coevolve.sql import connect
    from coevolve.store import Store

    con = connect(Store(store))
    return {
        "explorations": con.sql(
            "select signal_id, run_idx, step, action_name, action_args, observation "
            "from explorations where round = 1 order by all"
        ).fetchall(),
        "candidates": con.sql(
            "select candidate_id, verdict, reason, reward from candidates where round = 1 order by candidate_id"
        ).fetchall(),
        "validate_rollouts": con.sql("select count(*) from rollouts where phase = 'validate'").fetchall(),
        "tasks": con.sql("select content_hash from tasks order by all").fetchall(),
    }


def test_dask_fanout_gives_the_in_process_rows(prefect_harness, tmp_path):
    from flows.evolve import evolve

    ckpt = str(tmp_path / "ckpt")
    evolve(config=TINY, store=str(tmp_path / "in-process"), overrides={**ROUND, "train.checkpoint_dir": ckpt})
    evolve(
        config=TINY,
        store=str(tmp_path / "dask"),
        overrides={**ROUND, "train.checkpoint_dir": ckpt, "fanout.engine": "dask", "fanout.workers": 2},
    )
    local, fanned = _rows(str(tmp_path / "in-process")), _rows(str(tmp_path / "dask"))
    assert local["explorations"] and local["candidates"]
    assert any(r[2].startswith("accepted: pass 2") or r[2].startswith("pass 2") for r in local["candidates"]), (
        "pass 2 did not run: the test would not cover the validation fan-out"
    )
    assert local["validate_rollouts"][0][0] > 0
    for key in local:
        assert fanned[key] == local[key], key

    import anyio
    from prefect import get_client

    async def names():
        async with get_client() as client:
            runs = await client.read_flow_runs()
            tasks = await client.read_task_runs()
            return {r.name for r in runs}, {t.name for t in tasks}

    flows, tasks = anyio.run(names)
    assert {"explore fan-out, round 1", "validate fan-out, round 1"} <= flows  # it did fan out
    assert {"contexts 1 of 2", "contexts 2 of 2", "candidates 1 of 2"} <= tasks
