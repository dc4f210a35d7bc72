"""Nightly runs continue their lineage (issue 15): two consecutive runs of the deployment on one
store run rounds 1-2, then 3-4, without repeating work; a run finding its lineage in progress does
nothing; empty parameters keep the config file's values; bad values are refused before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from prefect_helpers import FAST

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TINY = str(ROOT / "configs" / "tiny.yaml")

pytestmark = pytest.mark.slow


def _prefect_env() -> dict[str, str]:
    from prefect.settings import PREFECT_API_URL

    return {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }


def _prefect(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "prefect"), *args], cwd=ROOT, env=_prefect_env(), capture_output=True, text=True, timeout=timeout
    )


def _markers(store: Path) -> dict[str, float]:
    """Every stage marker of the store and its modification time (rewritten = repeated work)."""
    return {str(p.relative_to(store)): p.stat().st_mtime_ns for p in store.glob("runs/*/round=*/*.json")}


def test_the_deployment_asks_for_rounds_per_run_and_leaves_the_rest_to_the_config():
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    (dep,) = spec["deployments"]
    params = dep["parameters"]
    assert params["rounds_per_run"] == 2
    # an empty parameter never overrides the config file (the old default run_name: nightly did)
    assert all(params[k] in ("", {}) for k in ("config", "store", "run_name", "overrides"))


def test_two_nightly_runs_continue_the_lineage(prefect_harness, tmp_path):
    from prefect import get_client
    from prefect.deployments import run_deployment
    import anyio

    made = _prefect("work-pool", "create", "coevolve-process", "--type", "process", "--overwrite")
    assert made.returncode == 0, made.stderr
    deployed = _prefect("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    store = tmp_path / "store"
    params = {
        "config": "configs/tiny.yaml",
        "rounds_per_run": 2,
        "store": str(store),
        "run_name": "",
        "overrides": {**FAST, "train.checkpoint_dir": str(tmp_path / "ckpt")},
    }
    # a bad value is refused when the run is created, before anything runs (the UI shows the message)
    with pytest.raises(Exception, match="rounds_per_run|minimum|greater"):
        run_deployment("coevolve-evolve/nightly", parameters={**params, "rounds_per_run": -1}, timeout=0)

    async def final(flow_run_id):
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
            subflows = await client.read_flow_runs()
            return run, sorted(r.name for r in subflows if r.parent_task_run_id is not None)

    seen: list[dict] = []
    names: list[str] = []
    for _night in (1, 2):
        before = _markers(store)
        flow_run = run_deployment("coevolve-evolve/nightly", parameters=params, timeout=0)
        worker = _prefect("worker", "start", "--pool", "coevolve-process", "--run-once")
        assert worker.returncode == 0, worker.stdout[-3000:] + worker.stderr[-3000:]
        run, names = anyio.run(final, flow_run.id)
        assert run.state.is_completed(), run.state
        after = _markers(store)
        # nothing done the night before was redone
        assert all(after[k] == v for k, v in before.items()), "a stage marker was rewritten"
        seen.append({k for k in after if k not in before})

    # the config's run name (tiny) is kept: run_name was left empty
    night1, night2 = ({k.split("/")[2] for k in s if k.startswith("runs/tiny/")} for s in seen)
    assert night1 == {"round=0", "round=1", "round=2"}
    assert night2 == {"round=3", "round=4"}
    assert {"tiny round 3", "tiny round 4"} <= set(names)  # round subflows are named after their round
    from coevolve.sql import connect
    from coevolve.store import Store

    con = connect(Store(str(store)))
    assert con.sql("select list(round order by round) from rounds").fetchall()[0][0] == [0, 1, 2, 3, 4]
    assert con.sql(
        "select count(*) = count(distinct (run_id, round, phase, episode_id, turn, step)) from rollouts"
    ).fetchall()[0][0]


def test_a_run_of_a_lineage_in_progress_does_nothing(prefect_harness, tmp_path):
    """A Running flow run tagged with the lineage, started earlier, makes the new run a no-op."""
    from prefect import flow, get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Running
    import anyio

    from coevolve.config import load_config
    from flows.evolve import evolve, lineage_tag

    store = tmp_path / "store"
    cfg = load_config(TINY, {"store": str(store)})

    @flow(name="coevolve-evolve")
    def placeholder() -> None:
        pass

    async def start_other():
        async with get_client() as client:
            run = await client.create_flow_run(placeholder, name="still-running", tags=[lineage_tag(cfg)])
            await client.set_flow_run_state(run.id, Running(), force=True)
            return run.id

    started = datetime.now(timezone.utc)
    other = anyio.run(start_other)
    time.sleep(0.05)
    try:
        rows = evolve(config=TINY, store=str(store), rounds_per_run=1)
        assert rows == []
        assert not (store / "runs").exists(), "the no-op run wrote stage markers"

        async def messages():
            from prefect.client.schemas.filters import LogFilter, LogFilterTimestamp
            from prefect.client.schemas.sorting import LogSort

            # the harness is shared by the session: read this test's logs, newest first
            recent = LogFilter(timestamp=LogFilterTimestamp(after_=started))
            async with get_client() as client:
                logs = await client.read_logs(log_filter=recent, sort=LogSort.TIMESTAMP_DESC, limit=200)
                return [log.message for log in logs]

        deadline = time.time() + 20  # logs reach the API in batches
        while not any("is in progress in flow run 'still-running'" in m for m in anyio.run(messages)):
            assert time.time() < deadline, "no log line says why the run did nothing"
            time.sleep(0.5)
    finally:

        async def finish():
            from prefect.states import Completed

            async with get_client() as client:
                await client.set_flow_run_state(other, Completed(), force=True)
                return (await client.read_flow_run(other)).state.type

        assert anyio.run(finish) == StateType.COMPLETED


def test_empty_parameters_keep_the_config_and_bad_ones_name_the_field(tmp_path):
    from coevolve.config import ConfigError
    from coevolve.lineage import plan_lineage

    cfg, rounds = plan_lineage(TINY, 0, "", "  ", {})
    assert (cfg.run_name, cfg.store, cfg.rounds, rounds) == ("tiny", ".coevolve/store", 2, [0, 1, 2])
    cfg, rounds = plan_lineage(TINY, 3, str(tmp_path / "s"), "night", {"train.steps": 1})
    assert (cfg.run_name, cfg.rounds, cfg.train.steps, rounds) == ("night", 3, 1, [0, 1, 2, 3])
    for bad, field in [
        ((TINY, 1, "", "", {"train.stepz": 1}), "train.stepz"),
        ((TINY, 1, "", "", {"explore.explorer": "nope"}), "explorer 'nope'"),
        (("configs/none.yaml", 1, "", "", {}), "config file not found"),
        ((TINY, 1, "", "", {"rounds": 4}), "rounds_per_run"),
    ]:
        with pytest.raises(ConfigError, match=field):
            plan_lineage(*bad)


def test_continuing_starts_after_the_last_finished_round(tmp_path):
    """Round r is finished when its last stage's marker exists; a missing `rounds` row of the last
    finished round (a kill between the two) brings that round back, to write the row only."""
    from coevolve.store import Store
    from coevolve.lineage import plan_lineage

    store = Store(str(tmp_path / "s"))
    assert plan_lineage(TINY, 2, store.uri, "", {})[1] == [0, 1, 2]
    store.mark_stage("tiny", 0, "commit", {})
    store.mark_stage("tiny", 1, "evaluate", {})
    store.mark_stage("tiny", 3, "evaluate", {})  # not contiguous: round 2 never finished
    assert plan_lineage(TINY, 2, store.uri, "", {})[1] == [1, 2, 3]
    store.write("rounds", 1, "tiny", [{"run_id": "tiny"}])
    cfg, rounds = plan_lineage(TINY, 2, store.uri, "", {})
    assert rounds == [2, 3] and cfg.rounds == 3
