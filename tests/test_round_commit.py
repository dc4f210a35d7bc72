"""The commit stage resumes after a SIGKILL between manifest and pointer (issue 14)."""

from __future__ import annotations

import signal
import subprocess
import sys

from coevolve.config import load_config
from coevolve.round import run_stage
from coevolve.store import Store
from coevolve.tasks import Task

_KILLED_COMMIT = """
import os, signal, sys
from coevolve.config import load_config
from coevolve.round import run_stage
from coevolve.store import Store
Store._move_pointer = lambda self, pointer, manifest: os.kill(os.getpid(), signal.SIGKILL)
cfg = load_config(None, {"store": sys.argv[1], "run_name": "r"})
run_stage(Store(cfg.store), cfg, 1, "commit")
"""


def _row(task_id: str) -> dict:
    return Task(
        task_id=task_id, env="bfcl-v3", turns=["do"], initial_state={}, reference_actions=[[]], split="train"
    ).to_row()


def _candidates(store: Store) -> None:
    rows = []
    for i in range(3):
        task = Task(task_id=f"new-{i}", env="bfcl-v3", turns=["do"], initial_state={}, reference_actions=[[]])
        rows.append(
            {"run_id": "r", "candidate_id": f"c{i}", "spec": task.to_json(), "verdict": "accepted", "reason": "ok"}
        )
    store.write("candidates", 1, "r-candidates", rows)


def test_commit_stage_killed_between_manifest_and_pointer_resumes(tmp_path):
    root = str(tmp_path / "store")
    store = Store(root)
    store.commit_pool(run_id="r", round_no=0, new_tasks=[_row("seed")], expected_parent=None)
    _candidates(store)
    proc = subprocess.run([sys.executable, "-c", _KILLED_COMMIT, root], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert store.stage_done("r", 1, "commit") is None and store.pool_versions() == [1]
    # another run commits meanwhile: the orphan must not block it
    other = store.commit_pool(run_id="other", round_no=1, new_tasks=[_row("o")], expected_parent=1)
    assert other.version == 3
    cfg = load_config(None, {"store": root, "run_name": "r"})
    summary = run_stage(store, cfg, 1, "commit")
    assert summary["added"] == 3 and summary["pool_version"] == 4
    ids = store.pool_tasks().column("task_id").to_pylist()
    assert ids == ["seed", "o", "new-0", "new-1", "new-2"]
    # a second resume (marker lost) neither commits twice nor loses the pool_versions row
    (tmp_path / "store" / "runs" / "r" / "round=1" / "commit.json").unlink()
    again = run_stage(store, load_config(None, {"store": root, "run_name": "r"}), 1, "commit")
    assert (again["pool_version"], again["added"]) == (4, 3) and store.pool_versions() == [1, 3, 4]
    assert sorted(store.read("pool_versions").column("version").to_pylist()) == [1, 3, 4]
    assert sorted(store.read("tasks").column("task_id").to_pylist()) == sorted(ids)


def test_commit_stage_resume_after_pointer_writes_the_missing_row(tmp_path):
    root = str(tmp_path / "store")
    store = Store(root)
    store.commit_pool(run_id="r", round_no=0, new_tasks=[_row("seed")], expected_parent=None)
    _candidates(store)
    code = _KILLED_COMMIT.replace(
        "Store._move_pointer = lambda self, pointer, manifest: os.kill(os.getpid(), signal.SIGKILL)",
        "Store.finish_commit = lambda self, manifest: os.kill(os.getpid(), signal.SIGKILL)",
    )
    proc = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert store.pool_versions() == [1, 2] and store.read("pool_versions").num_rows == 1
    summary = run_stage(store, load_config(None, {"store": root, "run_name": "r"}), 1, "commit")
    assert summary["pool_version"] == 2 and summary["added"] == 3
    assert sorted(store.read("pool_versions").column("version").to_pylist()) == [1, 2]
