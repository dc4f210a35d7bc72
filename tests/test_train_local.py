"""The local trainer learns: SFT warm start, then 30 GRPO steps raise held-out reward.

The task family ("usual"): "<two words>, call the usual" is passed by calling ``grep`` and
nothing else (partial credit for calling anything, or grep among others). A from-scratch
tiny model cannot call anything at first; an SFT warm start on a sibling family ("<two
words>, call <name>") teaches the call format, but only rewards can teach what "the usual"
is, and held-out tasks (new word pairs) show whether GRPO taught it.
"""

from __future__ import annotations

import random

import pytest
import torch

from coevolve.config import load_config
from coevolve.envs.base import EpisodeScore, Observation, ToolCall
from coevolve.policy import load_policy
from coevolve.policy.base import SamplingParams
from coevolve.registry import register
from coevolve.rollout import run_episodes
from coevolve.store import Store
from coevolve.tasks import Task
from coevolve.train import checkpoint_path, train_round

FUNCTIONS = ["ls", "cd", "mv", "grep"]
WORDS = ["red", "blue", "green", "small", "big", "old", "new", "fast", "slow", "warm", "cold", "dark"]


class PickEpisode:
    def __init__(self, task: Task):
        self.task = task
        self.n_turns = len(task.turns)
        self.turn = 0
        self.calls: list[list[str]] = [[] for _ in task.turns]
        self.passed: list[float] = []

    def user_message(self, turn: int) -> str | None:
        return self.task.turns[turn]

    def tools(self, turn: int) -> list[dict]:
        # No tool block in the prompt: it keeps sequences ~100 tokens, so the test runs fast;
        # the instruction itself names the function to call.
        return []

    def step(self, call: ToolCall) -> Observation:
        self.calls[self.turn].append(call.name)
        if call.name not in FUNCTIONS:
            return Observation(content=f"Error: no function {call.name}", error="unknown function")
        return Observation(content='{"ok": true}')

    def end_turn(self) -> None:
        want = self.task.reference_actions[self.turn][0]["name"]
        made = self.calls[self.turn]
        # partial credit: any call (the format), the right call among others, exactly it
        self.passed.append(1.0 if made == [want] else 0.5 if want in made else 0.25 if made else 0.0)
        self.turn += 1

    def score(self) -> EpisodeScore:
        passed = self.passed + [0.0] * (self.n_turns - len(self.passed))
        return EpisodeScore(success=all(p == 1.0 for p in passed), reward=sum(passed) / self.n_turns,
                            turn_passed=[p == 1.0 for p in passed])


@register("environment", "test-pick")
class PickEnvironment:
    name = "test-pick"

    def load_tasks(self, categories=None, ids=None, limit=None) -> list[Task]:
        """Category "named": the instruction ends with the function to call (the format warm start).
        Category "usual": "call the usual" always means ``grep``, which only the rewards reveal."""
        rng = random.Random(7)
        tasks = []
        for category in categories or ["named"]:
            for i in range(64):
                f = FUNCTIONS[i % len(FUNCTIONS)] if category == "named" else "grep"
                what = f"call {f}" if category == "named" else "call the usual"
                text = f"{rng.choice(WORDS)} {rng.choice(WORDS)}, {what}"
                tasks.append(Task(task_id=f"{category}-{i:02d}", env=self.name, turns=[text], category=category,
                                  initial_state={}, reference_actions=[[{"name": f, "arguments": {}}]]))
        return tasks[:limit] if limit else tasks

    def episode(self, task: Task) -> PickEpisode:
        return PickEpisode(task)


def _config(tmp_path, **train):
    return load_config(None, {
        "run_name": "pick", "store": str(tmp_path / "store"), "seed": 0,
        "env.name": "test-pick", "env.step_limit": 2,
        "policy.model": "tiny", "policy.max_new_tokens": 24, "policy.max_context_tokens": 512,
        "policy.batch_size": 32, "policy.temperature": 1.0,
        "train.checkpoint_dir": str(tmp_path / "ckpt"), "train.lora": False,
        **{f"train.{k}": v for k, v in train.items()},
    })


def _heldout_reward(cfg, checkpoint: str, tasks: list[Task]) -> float:
    policy = load_policy(cfg.policy, checkpoint)
    results = run_episodes(policy, PickEnvironment(), tasks, n_samples=4,
                           sampling=SamplingParams(temperature=1.0, max_new_tokens=24, seed=123),
                           step_limit=2, phase="eval", run_id="pick", round=0, batch_size=64)
    return sum(r.score.reward for r in results) / len(results)


@pytest.fixture
def one_thread():
    # Two intra-op threads on a 2-core machine that runs anything else are several times
    # slower than one (spinning OpenMP workers); one thread keeps the test's time predictable.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.timeout(300)
def test_thirty_grpo_steps_raise_heldout_reward(tmp_path, one_thread):
    env = PickEnvironment()
    named = env.load_tasks(["named"])[:48]
    usual = env.load_tasks(["usual"])
    train, heldout = usual[:48], usual[48:]
    store = Store(str(tmp_path / "store"))

    # warm start: SFT on the named family teaches the call format, not what "the usual" is
    warm_cfg = _config(tmp_path, sft_steps=40, sft_batch_size=8, sft_lr=3e-3, steps=0)
    warm = train_round(store, warm_cfg, "pick", 1, "tiny", named)
    before = _heldout_reward(warm_cfg, warm.checkpoint, heldout)

    cfg = _config(tmp_path, sft_steps=0, steps=30, tasks_per_step=4, group_size=8, lr=5e-4)
    result = train_round(store, cfg, "pick", 2, warm.checkpoint, train)
    after = _heldout_reward(cfg, result.checkpoint, heldout)
    print(f"held-out reward: {before:.3f} after the warm start -> {after:.3f} after 30 GRPO steps")
    assert after >= before + 0.3

    assert result.checkpoint == checkpoint_path(cfg, "pick", 2)
    assert result.n_rollouts == 30 * 4 * 8
    rows = store.read("rollouts").to_pylist()
    assert {r["phase"] for r in rows} == {"train"} and {r["round"] for r in rows} == {2}
    assert sorted({r["train_step"] for r in rows}) == list(range(1, 31))
    assert len({r["episode_id"] for r in rows}) == 30 * 4 * 8
    assert {r["epoch"] for r in rows} == {0, 1, 2}  # 30 steps x 4 tasks = 120 draws of 48 tasks


def test_lora_kl_accumulation_round_saves_a_merged_checkpoint_and_reruns_idempotently(tmp_path, one_thread):
    tasks = PickEnvironment().load_tasks(limit=8)
    store = Store(str(tmp_path / "store"))
    cfg = _config(tmp_path, sft_steps=2, steps=2, tasks_per_step=2, group_size=2, lora=True, lora_r=4,
                  kl_coef=0.1, micro_batch_size=3, lr=1e-3)
    first = train_round(store, cfg, "pick", 1, "tiny", tasks)
    again = train_round(store, cfg, "pick", 1, "tiny", tasks)  # a rerun replaces its parts
    rows = store.read("rollouts").to_pylist()
    assert first.n_rollouts == again.n_rollouts == 2 * 2 * 2
    assert len({r["episode_id"] for r in rows}) == 8 and {r["train_step"] for r in rows} == {1, 2}
    assert {r["epoch"] for r in rows} == {0} and {r["policy_version"] for r in rows} == {"tiny"}
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(first.checkpoint)  # plain HF weights, no adapters
    assert not any("lora" in name for name, _ in merged.named_parameters())
    assert 0.0 <= first.mean_reward <= 1.0


def test_trainers_are_registered_without_importing_their_backends():
    import subprocess
    import sys

    code = ("import sys; from coevolve.registry import names; print(names('trainer'), "
            "'verl' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['local', 'verl'] False False"
