"""The local GRPO trainer learns on synthesized BFCL tasks: 30 steps of the tiny model raise its
mean training reward on a fixed task set by at least 0.1 (issue #12).

The tasks are round 0's synthesized seed pool (``coevolve.train.probe.synthesized_tasks``,
one goal per task: coverage exploration of training-scenario states with role-typed values,
abstraction, mechanical validation): the first turns of its tasks whose reference is one call
with at most one argument ("Could you list my credit cards?" -> get_all_credit_cards(), "Find the
airport nearest to Autumnville." -> get_nearest_airport_by_city(location="Autumnville")), 15 of
them, as many functions as possible. Their tool blocks are narrowed to the functions the set
calls plus two distractors per task (``narrow_tools``): a full BFCL class block is thousands of
the tiny model's tokens. BFCL's questions and ground truth are never read. The reward is the
training reward (``coevolve.reward``: progress + 0.1 x format). An SFT warm start on the tasks'
own reference calls teaches the from-scratch model the call format, partly; GRPO does the rest.
Reward is measured on the whole task set, 4 samples a task, seeded, before and after.

Measured (120 SFT steps, then 30 GRPO steps of 8 tasks x 8 samples, 2 PPO epochs, lr 1e-3, one
thread, so runs repeat exactly; 2-core AVX2 box, float32): 0.323 -> 0.520 (+0.197), the training
reward per step rising from 0.23 to 0.54. Around it, on the same task set: 80 SFT steps +0.078
(0.000 -> 0.078; 40 GRPO steps +0.082), 100 +0.082 (lr 1.5e-3: +0.043), 110 +0.108, 130 +0.087
(0.475 -> 0.562). On an earlier task set (one task different) 80 SFT steps gave +0.156. A
from-scratch model this small learns from GRPO only in a narrow band of settings, so the margin
around the chosen one is thin.
"""

from __future__ import annotations

import dataclasses

import pytest

from coevolve.config import load_config
from coevolve.policy import load_policy
from coevolve.policy.base import SamplingParams
from coevolve.registry import resolve
from coevolve.rollout import run_episodes
from coevolve.store import Store
from coevolve.train import train_round
from coevolve.train.probe import narrow_tools, synthesized_tasks


MAX_NEW_TOKENS = 64
N_TASKS = 15
SFT_STEPS = 120
MARGIN = 0.1  # measured +0.197 in this setting (see the module docstring)


def learning_tasks():
    """Synthesized requests answered by one call of at most one argument, narrowed tools: the
    first turns of the seed pool's tasks (a first turn replays from the start state alone)."""
    firsts = [
        dataclasses.replace(t, turns=t.turns[:1], reference_actions=t.reference_actions[:1])
        for t in synthesized_tasks(
            0, overrides={"synth.scenarios": 40, "abstract.max_turns": 1, "synth.steps_per_run": 4}
        )
    ]
    simple = [
        t for t in firsts if len(t.reference_actions[0]) == 1 and len(t.reference_actions[0][0]["arguments"]) <= 1
    ]
    # 15 of them, as many functions as possible (in id order): the size the margin below was measured at
    seen: set[str] = set()
    chosen = []
    for t in simple:
        name = t.reference_actions[0][0]["name"]
        if name not in seen and len(chosen) < N_TASKS:
            seen.add(name)
            chosen.append(t)
    chosen += [t for t in simple if t not in chosen][: N_TASKS - len(chosen)]
    return narrow_tools(chosen)


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
            "policy.max_new_tokens": MAX_NEW_TOKENS,
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
        sampling=SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS, seed=99),
        step_limit=1,
        phase="eval",
        run_id="learn",
        round_no=0,
        batch_size=40,
    )
    return sum(r.score.reward for r in results) / len(results)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_thirty_grpo_steps_raise_the_reward_on_synthesized_tasks(tmp_path):
    tasks = learning_tasks()
    assert len(tasks) >= 10
    store = Store(str(tmp_path / "store"))
    warm_cfg = _config(tmp_path, sft_steps=SFT_STEPS, steps=0)
    warm = train_round(store, warm_cfg, "learn", 1, "tiny", tasks)
    before = _reward(warm_cfg, warm.checkpoint, tasks)

    cfg = _config(tmp_path, sft_steps=0, steps=30, tasks_per_step=8, group_size=8, lr=1e-3, ppo_epochs=2)
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
    assert after >= before + MARGIN
    steps = store.read("train_steps").to_pylist()
    assert steps and all(r["grad_norm"] > 0 for r in steps)
