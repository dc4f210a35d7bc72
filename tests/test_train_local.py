"""The local trainer's round: LoRA + KL + gradient accumulation, a merged checkpoint, an
idempotent rerun; trainers registered lazily.

The task family ("usual"): "<two words>, call the usual" is passed by calling ``grep`` and
nothing else (partial credit for calling anything, or grep among others); "named" tasks
name the function. ``test-pick`` also serves tests/test_train_verl.py. The learning test
(30 GRPO steps raise the reward) is tests/test_train_learning.py, on BFCL-derived tasks.
"""

from __future__ import annotations

import random

import torch

from coevolve.config import load_config
from coevolve.envs.base import EpisodeScore, Observation, ToolCall
from coevolve.registry import register
from coevolve.store import Store
from coevolve.tasks import Task
from coevolve.train import train_round

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
        return EpisodeScore(
            success=all(p == 1.0 for p in passed),
            reward=sum(passed) / self.n_turns,
            turn_passed=[p == 1.0 for p in passed],
        )


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
                tasks.append(
                    Task(
                        task_id=f"{category}-{i:02d}",
                        env=self.name,
                        turns=[text],
                        category=category,
                        initial_state={},
                        reference_actions=[[{"name": f, "arguments": {}}]],
                    )
                )
        return tasks[:limit] if limit else tasks

    def episode(self, task: Task) -> PickEpisode:
        return PickEpisode(task)


def _config(tmp_path, **train):
    return load_config(
        None,
        {
            "run_name": "pick",
            "store": str(tmp_path / "store"),
            "seed": 0,
            "env.name": "test-pick",
            "env.step_limit": 2,
            "policy.model": "tiny",
            "policy.max_new_tokens": 24,
            "policy.max_context_tokens": 512,
            "policy.batch_size": 32,
            "policy.temperature": 1.0,
            "train.checkpoint_dir": str(tmp_path / "ckpt"),
            "train.lora": False,
            "train.threads": 1,
            **{f"train.{k}": v for k, v in train.items()},
        },
    )


def test_lora_kl_accumulation_round_saves_a_merged_checkpoint_and_reruns_idempotently(
    tmp_path, one_thread, monkeypatch
):
    import coevolve.train.local as local

    # the tiny model earns the same reward on every sample of a group, which skips the update:
    # give the groups a spread so that both steps update
    monkeypatch.setattr(local, "group_advantages", lambda rewards, ids: torch.tensor([1.0, -1.0] * (len(rewards) // 2)))
    tasks = PickEnvironment().load_tasks(limit=8)
    store = Store(str(tmp_path / "store"))
    cfg = _config(
        tmp_path,
        sft_steps=2,
        steps=2,
        tasks_per_step=2,
        group_size=2,
        lora=True,
        lora_r=4,
        kl_coef=0.1,
        micro_batch_size=3,
        lr=1e-3,
    )
    first = train_round(store, cfg, "pick", 1, "tiny", tasks)
    again = train_round(store, cfg, "pick", 1, "tiny", tasks)  # a rerun replaces its parts
    rows = store.read("rollouts").to_pylist()
    assert first.n_rollouts == again.n_rollouts == 2 * 2 * 2
    assert len({r["episode_id"] for r in rows}) == 8 and {r["train_step"] for r in rows} == {1, 2}
    assert {r["epoch"] for r in rows} == {0} and {r["policy_version"] for r in rows} == {"tiny"}
    from transformers import AutoModelForCausalLM

    from coevolve.policy.models import resolve_model

    merged = AutoModelForCausalLM.from_pretrained(first.checkpoint)  # plain HF weights, no adapters
    names = [name for name, _ in merged.named_parameters()]
    assert not any("lora" in name for name in names)
    # the adapters were merged in: every LoRA target projection moved away from the base weights
    base = dict(AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).named_parameters())
    trained = dict(merged.named_parameters())
    projections = [n for n in names if n.endswith("proj.weight")]
    assert projections and all(not torch.equal(trained[n], base[n]) for n in projections)
    assert torch.equal(trained["model.norm.weight"], base["model.norm.weight"])  # LoRA trains projections only
    assert 0.0 <= first.mean_reward <= 1.0
    # the rerun replaced the first run's train_steps rows too; LoRA's reference (adapters off) gives a KL
    steps = store.read("train_steps").to_pylist()
    assert sorted((r["step"], r["epoch"]) for r in steps) == [(1, 0), (2, 0)]
    assert all(r["kl"] >= 0 for r in steps) and any(r["kl"] > 0 for r in steps)
    # each computed token attends to at least itself, and a whole sequence to fewer than its square
    assert all(r["n_computed_tokens"] <= r["n_attended_keys"] <= r["n_computed_tokens"] ** 2 for r in steps)


def test_trainers_are_registered_without_importing_their_backends():
    import subprocess
    import sys

    code = (
        "import sys; from coevolve.registry import names; print(names('trainer'), "
        "'verl' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['local', 'verl'] False False"
