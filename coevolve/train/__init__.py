"""Training stage: trainers by name behind one call, ``train_round``.

    result = train_round(store, cfg, run_id, round, policy_in, tasks)
    result.checkpoint   # Hugging Face directory of the trained policy (the next round's input)

Trainers (registry kind ``"trainer"``, chosen by ``cfg.train.backend``):

- ``local``: SFT warm start + multi-turn GRPO with torch/transformers/peft on this machine
  (``coevolve.train.local``);
- ``verl``: exports the tasks, composes verl's config and launches verl's PPO trainer with
  coevolve's agent loop on a Ray cluster of GPUs (``coevolve.train.verl_launch``).

Each trainer is registered as a thin function that imports its module on first use, so
choosing a trainer never pays for the other one's imports (``import verl`` takes seconds).
Every trainer has the signature of ``train_round`` and returns a ``TrainResult``
(``coevolve.train.result``, re-exported here with ``checkpoint_path``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coevolve.registry import register, resolve
from coevolve.train.result import TrainResult, checkpoint_path

__all__ = ["TrainResult", "checkpoint_path", "train_round"]

if TYPE_CHECKING:
    from coevolve.config import RunConfig
    from coevolve.store import Store
    from coevolve.tasks import Task


def train_round(
    store: "Store", cfg: "RunConfig", run_id: str, round_no: int, policy_in: str, tasks: list["Task"]
) -> TrainResult:
    """Train ``policy_in`` (an HF directory or model name) on ``tasks`` with the trainer
    named by ``cfg.train.backend``; training rollouts go to the store's ``rollouts`` table
    (phase ``train``), the trained policy to ``checkpoint_path(cfg, run_id, round)``."""
    trainer = resolve("trainer", cfg.train.backend)
    return trainer(store, cfg, run_id, round_no, policy_in, tasks)


@register("trainer", "local")
def local_trainer(store, cfg, run_id, round_no, policy_in, tasks) -> TrainResult:
    from coevolve.events import report_progress
    from coevolve.train.local import StepStats, train_local

    def on_step(s: StepStats) -> None:  # the CLI's live status and the stage log
        note = f"GRPO steps; reward {s.mean_reward:.3g}, loss {s.loss:.3g}, {s.seconds:.0f}s"
        report_progress(round_no, "train", s.step, cfg.train.steps, note)

    def on_sft_step(step: int, steps: int, loss: float) -> None:
        report_progress(round_no, "train", step, steps, f"SFT warm start steps; loss {loss:.3g}")

    return train_local(store, cfg, run_id, round_no, policy_in, tasks, on_step=on_step, on_sft_step=on_sft_step)


@register("trainer", "verl")
def verl_trainer(store, cfg, run_id, round_no, policy_in, tasks) -> TrainResult:
    from coevolve.train.verl_launch import train_verl

    return train_verl(store, cfg, run_id, round_no, policy_in, tasks)
