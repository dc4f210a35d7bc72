"""The trainer optimizes exactly the tokens the policy sampled, with the behaviour log-probs
recorded at sampling time, and its GRPO steps update: ratio/clip against those log-probs,
``train_steps`` rows, weights that change.

The environment is a two-turn echo: every call is answered, so episodes are multi-turn and
multi-step, and a small generation budget cuts some messages mid-way. Its reward is planted
(every other episode it opens scores 1), so an untrained model's groups have non-zero
advantages: these tests check the update's mechanics; the learning test is
tests/test_train_learning.py.
"""

from __future__ import annotations

import pytest
import torch

from coevolve.config import PolicyConfig, load_config
from coevolve.envs.base import EpisodeScore, Observation, ToolCall
from coevolve.policy import load_policy
from coevolve.policy.base import SamplingParams
from coevolve.registry import register
from coevolve.rollout import run_episodes
from coevolve.store import Store
from coevolve.tasks import Task
from coevolve.train import train_round
from coevolve.train.scoring import pack, sampled_logprobs
from coevolve.train.sequences import episode_sequences


class EchoEpisode:
    def __init__(self, task: Task, reward: float):
        self.task, self.n_turns, self.calls, self.reward = task, len(task.turns), 0, reward

    def user_message(self, turn: int) -> str:
        return self.task.turns[turn]

    def tools(self, turn: int) -> list[dict]:
        return [{"name": "ls", "description": "List files.", "parameters": {"type": "object", "properties": {}}}]

    def step(self, call: ToolCall) -> Observation:
        self.calls += 1
        return Observation(content=f'{{"called": "{call.name}"}}')

    def end_turn(self) -> None:
        pass

    def score(self) -> EpisodeScore:
        return EpisodeScore(success=False, reward=self.reward, turn_passed=[False] * self.n_turns)


@register("environment", "test-echo")
class EchoEnvironment:
    name = "test-echo"
    opened = 0

    def load_tasks(self, categories=None, ids=None, limit=None) -> list[Task]:
        return [
            Task(
                task_id=f"echo-{i}",
                env=self.name,
                turns=[f"list files {i}", "and again"],
                initial_state={},
                reference_actions=[[{"name": "ls", "arguments": {}}]] * 2,
            )
            for i in range(limit or 4)
        ]

    def episode(self, task: Task) -> EchoEpisode:
        EchoEnvironment.opened += 1
        return EchoEpisode(task, float(EchoEnvironment.opened % 2))


@pytest.fixture(scope="module")
def sampled():
    """Tiny-model episodes at temperature 0.8, 12 new tokens a message. The untrained model
    almost never samples its end token, so ~1.5% of the vocabulary is planted as extra stop
    tokens: some messages stop (on a sampled stop token), others are cut by the budget."""
    torch.manual_seed(0)
    policy = load_policy(PolicyConfig(model="tiny", max_context_tokens=1024, max_new_tokens=12))
    policy.stop_ids = policy.stop_ids | set(range(100, 130))
    tasks = EchoEnvironment().load_tasks(limit=3)
    sampling = SamplingParams(temperature=0.8, max_new_tokens=12, seed=5)
    results = run_episodes(
        policy,
        EchoEnvironment(),
        tasks,
        n_samples=3,
        sampling=sampling,
        step_limit=3,
        phase="train",
        run_id="t",
        round_no=0,
        batch_size=9,
    )
    return policy, results


def _messages(result) -> list[dict]:
    return [row for row in result.steps if row["completion_ids"] is not None]


def test_the_ids_trained_are_the_ids_sampled_message_by_message(sampled):
    policy, results = sampled
    stop = policy.stop_ids
    n_cut = n_stop = n_chained = 0
    for r in results:
        messages = _messages(r)
        assert len(messages) == sum(1 for m in r.messages if m["role"] == "assistant")
        seqs = episode_sequences(r.steps, max_tokens=4096)
        # walk the sequences' trained spans: one span per message, in order, equal to its ids
        spans = []
        for s in seqs:
            t = 0
            while t < len(s.ids):
                if s.mask[t]:
                    end = t
                    while end < len(s.ids) and s.mask[end]:
                        end += 1
                    spans.append((s.ids[t:end], s.logprobs[t:end]))
                    t = end
                else:
                    t += 1
            n_chained += s.messages > 1
        assert [ids for ids, _ in spans] == [m["completion_ids"] for m in messages]
        assert [lp for lp, _ in zip([x for _, x in spans], messages)] == [
            pytest.approx(m["completion_logprobs"]) for m in messages
        ]
        for m in messages:
            assert m["prompt_ids"][-3:] == policy.tokenizer.encode("<|im_start|>assistant\n")[-3:]
            if m["finish_reason"] == "length":  # cut by the budget: no end token was invented
                n_cut += 1
                assert len(m["completion_ids"]) == 12 and not set(m["completion_ids"]) & stop
            else:  # the sampled stop token is trained, and only the last token is one
                n_stop += 1
                assert m["completion_ids"][-1] in stop and not set(m["completion_ids"][:-1]) & stop
    # the test saw cut messages, stopped ones, and sequences chaining several messages
    assert n_cut > 0 and n_stop > 0 and n_chained > 0


def test_trainer_logprobs_at_step_zero_equal_the_behaviour_logprobs(sampled):
    policy, results = sampled
    seqs = [s for r in results for s in episode_sequences(r.steps, max_tokens=4096)]
    batch = pack(seqs, policy.pad_id, [1.0] * len(seqs))
    with torch.no_grad():
        logp = sampled_logprobs(policy.model, batch, temperature=0.8)
        full = torch.log_softmax(
            policy.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float() / 0.8,
            dim=-1,
        )
    assert logp.shape == batch["old_logp"].shape and logp.numel() > 100
    torch.testing.assert_close(logp, batch["old_logp"], atol=2e-4, rtol=0)
    # the gather-at-sampled-positions path is the full log-softmax, read at the targets
    torch.testing.assert_close(logp, full[batch["rows"], batch["cols"], batch["targets"]], atol=1e-5, rtol=0)


def test_rollout_rows_store_the_token_columns(sampled, tmp_path):
    _, results = sampled
    store = Store(str(tmp_path / "store"))
    store.write("rollouts", 0, "t", [row for r in results for row in r.steps])
    rows = [r for r in store.read("rollouts").to_pylist() if r["completion_ids"] is not None]
    first = _messages(results[0])[0]
    assert rows[0]["completion_ids"] == first["completion_ids"] and rows[0]["prompt_ids"] == first["prompt_ids"]
    assert rows[0]["completion_logprobs"] == pytest.approx(first["completion_logprobs"], abs=1e-6)


def _config(tmp_path, **train):
    return load_config(
        None,
        {
            "run_name": "echo",
            "store": str(tmp_path / "store"),
            "seed": 0,
            "env.name": "test-echo",
            "env.step_limit": 2,
            "policy.model": "tiny",
            "policy.max_new_tokens": 16,
            "policy.max_context_tokens": 512,
            "policy.batch_size": 16,
            "policy.temperature": 1.0,
            "train.checkpoint_dir": str(tmp_path / "ckpt"),
            "train.lora": False,
            "train.sft_steps": 0,
            "train.threads": 1,
            **{f"train.{k}": v for k, v in train.items()},
        },
    )


def test_ppo_epochs_clip_log_train_steps_and_change_the_weights(tmp_path):
    from transformers import AutoModelForCausalLM

    from coevolve.policy.models import resolve_model
    from coevolve.sql import connect

    store = Store(str(tmp_path / "store"))
    cfg = _config(
        tmp_path,
        steps=2,
        tasks_per_step=2,
        group_size=4,
        ppo_epochs=3,
        lr=3e-3,
        clip_eps=0.1,
        kl_coef=0.05,
        micro_batch_size=3,
    )
    result = train_round(store, cfg, "echo", 1, "tiny", EchoEnvironment().load_tasks(limit=4))
    steps = connect(store).sql("select * from train_steps order by step, epoch").to_arrow_table().to_pylist()
    assert steps and {r["epoch"] for r in steps} == {0, 1, 2} and {r["round"] for r in steps} == {1}
    assert all(r["grad_norm"] > 0 and r["n_trained_tokens"] > 0 and r["seconds"] > 0 for r in steps)
    first = [r for r in steps if r["epoch"] == 0]
    later = [r for r in steps if r["epoch"] > 0]
    # the first pass is on-policy: ratio 1 and nothing clipped; later passes move and get clipped
    assert all(abs(r["ratio_mean"] - 1) < 1e-3 and r["clip_frac"] == 0 for r in first)
    assert any(r["clip_frac"] > 0 for r in later)
    assert all(r["kl"] >= 0 for r in steps) and any(r["kl"] > 0 for r in later)
    before = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")).state_dict()
    after = AutoModelForCausalLM.from_pretrained(result.checkpoint).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
