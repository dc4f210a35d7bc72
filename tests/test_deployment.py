"""The Prefect deployment: deploy `deployments/prefect.yaml` to a (test) Prefect API, trigger
a run with parameters as the UI would, let a process worker pick it up, wait for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def test_deployment_file_has_a_nightly_schedule_and_ui_parameters():
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    (dep,) = spec["deployments"]
    assert dep["entrypoint"] == "flows/evolve.py:evolve"
    assert dep["schedules"][0]["cron"] == "0 2 * * *"
    assert dep["work_pool"]["name"] == "coevolve-process"
    assert set(dep["parameters"]) == {"config", "rounds_per_run", "store", "run_name", "overrides"}


def test_trigger_deployment_and_wait(prefect_harness, tmp_path):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }

    def prefect(*args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "prefect"), *args], cwd=ROOT, env=env, capture_output=True, text=True, **kw)

    made = prefect("work-pool", "create", "coevolve-process", "--type", "process", "--overwrite")
    assert made.returncode == 0, made.stderr
    deployed = prefect("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    store = str(tmp_path / "store")
    flow_run = run_deployment(
        "coevolve-evolve/nightly",
        parameters={
            "config": "configs/tiny.yaml",
            "rounds_per_run": 1,
            "store": store,
            "run_name": "from-ui",
            # every stage, almost no work: what is tested is the deployment path (test_flow.py trains)
            "overrides": {
                "train.steps": 0,
                "train.sft_steps": 0,
                "validate.solver": "none",
                "eval.step_limit": 1,
                "eval.max_new_tokens": 8,
                "train.checkpoint_dir": str(tmp_path / "ckpt"),
            },
        },
        timeout=0,  # return at once; the worker below runs it
    )
    worker = prefect("worker", "start", "--pool", "coevolve-process", "--run-once", timeout=900)
    assert worker.returncode == 0, worker.stdout[-3000:] + worker.stderr[-3000:]

    from prefect import get_client
    import anyio

    async def final_state():
        async with get_client() as client:
            return (await client.read_flow_run(flow_run.id)).state

    state = anyio.run(final_state)
    assert state.is_completed(), state
    assert (Path(store) / "runs" / "from-ui" / "round=1" / "evaluate.json").exists()
