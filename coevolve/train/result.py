"""What every trainer returns and where it saves: the ground floor of ``coevolve.train``.

The trainers (``coevolve.train.local``, ``coevolve.train.verl_launch``) import this module,
not the package, whose ``__init__`` registers them: so the package points down at its
trainers and no trainer points back up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from coevolve.config import RunConfig


@dataclass
class TrainResult:
    checkpoint: str  # Hugging Face directory of the trained policy (weights + tokenizer)
    n_rollouts: int  # training episodes run (all steps of the round)
    mean_reward: float  # mean episode partial reward over those episodes
    success_rate: float  # share of those episodes the benchmark scored a success
    # where the time went (coevolve.timing.SPLIT_COLUMNS["train"]: load, sft, rollouts, update,
    # checkpoint); a trainer that cannot tell (verl) leaves it empty
    timings: dict[str, float] = field(default_factory=dict)


def checkpoint_path(cfg: "RunConfig", run_id: str, round_no: int) -> str:
    """The local directory round ``round`` of run ``run_id`` saves its policy to (with the
    store, or in the local cache of a remote location: see ``coevolve.checkpoints``)."""
    from coevolve.checkpoints import local_dir

    return local_dir(cfg, run_id, round_no)
