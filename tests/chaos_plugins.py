"""Cheap plug-ins for the fast subset of the fault campaign (imported by child processes as
``chaos_plugins:...`` with tests/ on PYTHONPATH): a trainer that saves the base model as the round's checkpoint
and logs a few rollout rows, so every stage of a round runs in seconds."""

from __future__ import annotations

import shutil
from pathlib import Path

from coevolve.policy.models import resolve_model
from coevolve.train import TrainResult, checkpoint_path


def copy_trainer(store, cfg, run_id, round_no, policy_in, tasks) -> TrainResult:
    out = Path(checkpoint_path(cfg, run_id, round_no))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(resolve_model(policy_in), tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    rows = [
        {
            "run_id": run_id,
            "phase": "train",
            "task_id": t.task_id,
            "episode_id": f"{t.task_id}/s{s}",
            "sample_idx": s,
            "turn": 0,
            "step": 0,
            "action_name": "ls",
            "success": s % 2 == 0,
            "episode_reward": float(s % 2),
        }
        for t in tasks
        for s in range(4)
    ]
    store.write("rollouts", round_no, f"{run_id}-train-copy", rows)
    return TrainResult(checkpoint=str(out), n_rollouts=len(rows), mean_reward=0.5, success_rate=0.5)
