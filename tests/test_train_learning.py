"""The local GRPO trainer learns on BFCL-derived tasks: 30 steps of the tiny model raise its
mean reward on a fixed task set.

Issue #12 asks for +0.2. Measured with the merged training reward (progress + 0.1 x format),
seeded: 0.520 -> 0.718 (+0.198) and 0.555 -> 0.791 (+0.236) in two runs with groups of 8
(this setting; thread timing makes runs differ slightly), 0.520 -> 0.651 with groups of 6. The test guards +0.1, a real learning effect with margin; the +0.2 target is still
open and said so in the README.

The tasks (``coevolve.train.probe``) are hand-made single-turn instructions ("List the files
in the current directory." -> ls) over the initial states of BFCL training scenarios; BFCL's
questions and ground truth are never read. The reward is the environment's
``EpisodeScore.reward`` (1 for a correct call). An SFT warm start on the tasks' reference
calls teaches the tiny from-scratch model the call format, partly; GRPO does the rest.
Reward is measured on the whole task set, 4 samples a task, seeded, before and after.
"""

from __future__ import annotations

import pytest

from coevolve.config import load_config
from coevolve.policy import load_policy
from coevolve.policy.base import SamplingParams
from coevolve.registry import resolve
from coevolve.rollout import run_episodes
from coevolve.store import Store
from coevolve.train import train_round
from coevolve.train.probe import file_system_tasks


def _config(tmp_path, **train):
    return load_config(
        None,
        {
            "run_name": "learn",
            "store": str(tmp_path / "store"),
            "seed": 0,
            "env.name": "bfcl-v3",
            "env.step_limit": 1,
            "policy.model": "tiny",
            "policy.max_new_tokens": 40,
            "policy.max_context_tokens": 1024,
            "policy.batch_size": 32,
            "policy.temperature": 1.0,
            "train.checkpoint_dir": str(tmp_path / "ckpt"),
            "train.lora": False,
            "train.threads": 1,
            "train.sft_lr": 3e-3,
            "train.sft_batch_size": 4,
            "train.max_seq_tokens": 1024,
            # the figures above were measured scoring whole sequences; shared prompts give the same
            # gradient up to float rounding, which moves this 30-step run by as much as the margin
            "train.share_prefix": False,
            **{f"train.{k}": v for k, v in train.items()},
        },
    )


def _reward(cfg, checkpoint: str, tasks) -> float:
    policy = load_policy(cfg.policy, checkpoint)
    results = run_episodes(
        policy,
        resolve("environment", "bfcl-v3")(),
        tasks,
        n_samples=4,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=40, seed=99),
        step_limit=1,
        phase="eval",
        run_id="learn",
        round=0,
        batch_size=40,
    )
    return sum(r.score.reward for r in results) / len(results)


@pytest.mark.timeout(900)
def test_thirty_grpo_steps_raise_the_reward_on_bfcl_state_tasks(tmp_path):
    tasks = file_system_tasks(4)  # 4 training scenarios x 5 instructions
    store = Store(str(tmp_path / "store"))
    warm_cfg = _config(tmp_path, sft_steps=80, steps=0)
    warm = train_round(store, warm_cfg, "learn", 1, "tiny", tasks)
    before = _reward(warm_cfg, warm.checkpoint, tasks)

    cfg = _config(tmp_path, sft_steps=0, steps=30, tasks_per_step=4, group_size=8, lr=5e-4, ppo_epochs=2)
    result = train_round(store, cfg, "learn", 2, warm.checkpoint, tasks)
    after = _reward(cfg, result.checkpoint, tasks)

    episodes = {
        (r["train_step"], r["episode_id"]): r["episode_reward"]
        for r in store.read("rollouts").to_pylist()
        if r["round"] == 2
    }
    curve = [
        sum(v for (s, _), v in episodes.items() if s == step) / sum(1 for s, _ in episodes if s == step)
        for step in range(1, 31)
    ]
    print(f"reward on the task set: {before:.3f} after the warm start -> {after:.3f} after 30 GRPO steps")
    print("training reward per step:", " ".join(f"{x:.2f}" for x in curve))
    assert after >= before + 0.1
    steps = store.read("train_steps").to_pylist()
    assert steps and all(r["grad_norm"] > 0 for r in steps)
