"""The ``verl`` trainer: export the round's tasks, compose and validate verl's config, launch
verl's PPO trainer (locally or as a Ray job), stream its progress, and bring its checkpoint
back as a Hugging Face directory.

    plan = prepare(cfg, run_id, round, policy_in, tasks)   # files + validated config + command
    print(plan.yaml, format_command(plan.command))         # what `coevolve train --dry-run` shows
    result = train_verl(store, cfg, run_id, round, policy_in, tasks)

Files of a round live in ``<checkpoint_dir>/<run_id>/round-<r>-verl/``: ``train.parquet``,
``agent_loop.yaml``, verl's own checkpoints (``global_step_<n>/actor``); the merged Hugging
Face checkpoint goes where every trainer puts it, ``checkpoint_path(cfg, run_id, round)``.
"""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from coevolve.tasks import Task
from coevolve.train.result import TrainResult, checkpoint_path
from coevolve.train.verl_config import build_overrides, compose_config, format_command, launch_command
from coevolve.train.verl_data import export_tasks, write_agent_loop_config


@dataclass
class VerlPlan:
    workdir: str  # the round's verl files
    model_path: str  # what verl loads (a local HF directory, or a hub id its workers can fetch)
    overrides: list[str]
    config: Any  # the composed, validated OmegaConf config
    command: list[str]  # argv that launches the training

    @property
    def yaml(self) -> str:
        from omegaconf import OmegaConf

        return OmegaConf.to_yaml(self.config)


def model_for_verl(policy_in: str) -> str:
    """A built-in name or local directory becomes its HF directory; anything else (a hub id
    such as ``Qwen/Qwen2.5-7B-Instruct``) is passed to verl unchanged."""
    from coevolve.policy.models import resolve_model

    try:
        return resolve_model(policy_in)
    except FileNotFoundError:
        return policy_in


def prepare(cfg: Any, run_id: str, round_no: int, policy_in: str, tasks: list[Task]) -> VerlPlan:
    """Write the round's dataset and agent-loop files, compose and validate verl's config."""
    workdir = Path(f"{checkpoint_path(cfg, run_id, round_no)}-verl").resolve()
    model_path = model_for_verl(policy_in)
    overrides = build_overrides(
        cfg,
        model_path=model_path,
        train_file=export_tasks(tasks, workdir / "train.parquet"),
        agent_loop_config=write_agent_loop_config(workdir / "agent_loop.yaml"),
        out_dir=str(workdir / "verl"),
        run_id=run_id,
        round_no=round_no,
        n_tasks=len(tasks),
    )
    config = compose_config(overrides)
    return VerlPlan(str(workdir), model_path, overrides, config, launch_command(overrides, cfg.train.verl_ray_address))


def stream(command: list[str], on_line: Callable[[str], None], tail: int = 40) -> None:
    """Run ``command``, passing each output line to ``on_line``; raise with the last lines on failure."""
    last: deque[str] = deque(maxlen=tail)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            line = line.rstrip("\n")
            last.append(line)
            on_line(line)
        code = proc.wait()
    if code != 0:
        raise RuntimeError(f"{format_command(command[:4])} ... exited with {code}:\n" + "\n".join(last))


def merge_checkpoint(workdir: str, steps: int, target: str, on_line: Callable[[str], None]) -> str:
    """verl's FSDP actor checkpoint of the last step -> a Hugging Face directory at ``target``."""
    actor = Path(workdir) / "verl" / f"global_step_{steps}" / "actor"
    if not actor.is_dir():
        raise RuntimeError(f"verl finished but wrote no checkpoint at {actor}")
    argv = [
        sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(actor),
        "--target_dir",
        target,
    ]
    stream(argv, on_line)
    return target


def round_metrics(store: Any, run_id: str, round_no: int) -> tuple[int, float, float]:
    """(episodes, mean episode reward, success rate) of the round's verl training rollouts."""
    import pyarrow.dataset as ds

    table = store.read(
        "rollouts",
        filter=(ds.field("run_id") == run_id) & (ds.field("round") == round_no) & (ds.field("phase") == "train"),
        columns=["episode_id", "episode_reward", "success"],
    )
    episodes = {r["episode_id"]: r for r in table.to_pylist()}
    n = len(episodes)
    if not n:
        return 0, 0.0, 0.0
    rows = episodes.values()
    return n, sum(r["episode_reward"] for r in rows) / n, sum(bool(r["success"]) for r in rows) / n


def train_verl(
    store: Any,
    cfg: Any,
    run_id: str,
    round_no: int,
    policy_in: str,
    tasks: list[Task],
    *,
    on_line: Callable[[str], None] = print,
) -> TrainResult:
    """Train with verl on a GPU machine or Ray cluster (``train.verl_ray_address``).

    The agent loop on verl's workers writes the rollout rows to the store, so the store must be
    reachable from the cluster (S3 for a remote cluster). ``on_line`` receives verl's output.
    """
    plan = prepare(cfg, run_id, round_no, policy_in, tasks)
    store.delete_parts("rollouts", round_no, f"{run_id}-train-verl-")  # a rerun replaces the round's rows
    on_line(f"launching: {format_command(plan.command)}")
    stream(plan.command, on_line)
    target = merge_checkpoint(plan.workdir, max(cfg.train.steps, 1), checkpoint_path(cfg, run_id, round_no), on_line)
    n, reward, success = round_metrics(store, run_id, round_no)
    return TrainResult(checkpoint=target, n_rollouts=n, mean_reward=reward, success_rate=success)
