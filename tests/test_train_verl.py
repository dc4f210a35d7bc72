"""verl backend on CPU: config composition + validation, dataset export, the agent loop.

The agent loop runs a whole episode against a server manager backed by the tiny local
model (real generation), and the test checks its token stream and mask token by token.
"""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("verl")
pytestmark = pytest.mark.verl

import torch  # noqa: E402
from test_train_local import PickEnvironment  # noqa: E402  (registers environment "test-pick")

from coevolve.config import load_config  # noqa: E402
from coevolve.policy.models import resolve_model  # noqa: E402
from coevolve.store import Store  # noqa: E402
from coevolve.tasks import Task  # noqa: E402
from coevolve.train.verl_config import build_overrides, compose_config, format_command, launch_command  # noqa: E402
from coevolve.train.verl_data import export_tasks, write_agent_loop_config  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verl")
    cfg = load_config(
        None,
        {
            "run_name": "v",
            "store": str(tmp / "store"),
            "env.name": "test-pick",
            "env.step_limit": 2,
            "policy.model": "tiny",
            "policy.max_new_tokens": 24,
            "policy.max_context_tokens": 512,
            "train.backend": "verl",
            "train.verl_gpus_per_node": 2,
            "train.group_size": 4,
            "train.tasks_per_step": 2,
        },
    )
    tasks = PickEnvironment().load_tasks(limit=4)
    model = resolve_model("tiny")
    overrides = build_overrides(
        cfg,
        model_path=model,
        train_file=export_tasks(tasks, tmp / "train.parquet"),
        agent_loop_config=write_agent_loop_config(tmp / "agent_loop.yaml"),
        out_dir=str(tmp / "out"),
        run_id="v",
        round_no=1,
        n_tasks=len(tasks),
    )
    return cfg, tasks, model, overrides, tmp


def test_composed_config_passes_verl_validation(setup):
    cfg, tasks, model, overrides, _ = setup
    config = compose_config(overrides)
    assert config.algorithm.adv_estimator == "grpo"
    assert config.actor_rollout_ref.rollout.n == 4
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "coevolve"
    assert config.actor_rollout_ref.model.path == model
    assert config.data.train_batch_size == 2 and config.trainer.n_gpus_per_node == 2
    assert config.coevolve.env == "test-pick"
    line = format_command(launch_command(overrides, "http://head:8265"))
    assert (
        line.startswith("ray job submit --address=http://head:8265 '--runtime-env-json=")
        and "verl.trainer.main_ppo" in line
    )
    with pytest.raises(AssertionError, match="real_train_batch_size"):  # verl's validator is consulted:
        compose_config(overrides + ["trainer.n_gpus_per_node=3"])  # 2 tasks x 4 samples do not split over 3 GPUs


def _dataset(config, model):
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tokenizer = AutoTokenizer.from_pretrained(model)
    return RLHFDataset(config.data.train_files, tokenizer, config.data), tokenizer


def test_exported_parquet_loads_through_rlhf_dataset(setup):
    cfg, tasks, model, overrides, _ = setup
    config = compose_config(overrides, validate=False)
    dataset, _ = _dataset(config, model)
    assert len(dataset) == len(tasks)
    row = dataset[1]
    assert row["agent_name"] == "coevolve" and row["data_source"] == "coevolve/test-pick"
    assert row["raw_prompt"] == [{"role": "user", "content": tasks[1].turns[0]}]
    assert Task.from_json(row["extra_info"]["task"]) == tasks[1]
    assert json.loads(row["reward_model"]["ground_truth"]) == tasks[1].reference_actions


class TinyServer:
    """verl's ``server_manager.generate`` backed by the tiny model; ``script`` replaces
    generation with fixed replies (their token ids), to pin the reward."""

    def __init__(self, model_path: str, tokenizer, script: list[str] | None = None):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path).eval()
        self.tokenizer, self.script = tokenizer, list(script or [])
        self.calls: list[tuple[list[int], list[int]]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if self.script:
            ids = self.tokenizer.encode(self.script.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
        else:
            torch.manual_seed(len(self.calls))
            with torch.no_grad():
                out = self.model.generate(
                    torch.tensor([prompt_ids]),
                    attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                    max_new_tokens=sampling_params["max_tokens"],
                    do_sample=True,
                    temperature=1.0,
                    top_p=1.0,
                )
            ids = out[0, len(prompt_ids) :].tolist()
        self.calls.append((list(prompt_ids), ids))
        return TokenOutput(token_ids=ids)


def _run_loop(config, server, tokenizer, row):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from coevolve.train.verl_agent_loop import CoevolveAgentLoop

    async def main():
        loop = CoevolveAgentLoop(
            trainer_config=DictConfigWrap(config),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
            hf_model_type="qwen2",
        )
        return await loop.run({"temperature": 1.0, "top_p": 1.0}, **row)

    return asyncio.run(main())


@pytest.mark.parametrize("scripted", [False, True], ids=["tiny-generation", "scripted-correct-call"])
def test_agent_loop_episode_masks_and_reward(setup, scripted):
    cfg, tasks, model, overrides, tmp = setup
    config = compose_config(overrides, validate=False)
    dataset, tokenizer = _dataset(config, model)
    row = dataset[0]
    task = tasks[0]
    want = task.reference_actions[0][0]["name"]
    script = [f'<tool_call>{{"name": "{want}", "arguments": {{}}}}</tool_call>', "Done."] if scripted else None
    server = TinyServer(model, tokenizer, script)
    out = _run_loop(config, server, tokenizer, row)

    seq = out.prompt_ids + out.response_ids
    mask = [0] * len(out.prompt_ids) + out.response_mask
    assert len(out.response_ids) == len(out.response_mask) and server.calls
    # token by token: every generation saw exactly the sequence so far, its tokens follow
    # at once and are the only ones with mask 1; everything between is context (mask 0)
    generated = [0] * len(seq)
    for prompt, ids in server.calls:
        assert seq[: len(prompt)] == prompt
        assert seq[len(prompt) : len(prompt) + len(ids)] == ids
        for i in range(len(prompt), len(prompt) + len(ids)):
            generated[i] = 1
    assert mask == generated

    # the reward is the environment's score of the calls the episode made
    rows = [
        r
        for r in Store(str(tmp / "store")).read("rollouts").to_pylist()
        if r["episode_id"] == out.extra_fields["episode_id"]
    ]
    assert rows and {r["phase"] for r in rows} == {"train"} and {r["round"] for r in rows} == {1}
    # each message's first row keeps the exact prompt and sampled ids (token in, token out)
    assert [(r["prompt_ids"], r["completion_ids"]) for r in rows if r["completion_ids"] is not None] == server.calls
    # observations and parse errors are in the stream, masked (the random model may just answer)
    context = tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    observed = [r["observation"] for r in rows if r["observation"]]
    assert context.count("<tool_response>") == len(observed)
    assert all(obs.strip()[:40] in context for obs in observed)
    replay = PickEnvironment().episode(task)
    for r in rows:
        if r["action_name"]:
            replay.step(type("Call", (), {"name": r["action_name"], "arguments": json.loads(r["action_args"])})())
    replay.end_turn()
    assert out.reward_score == replay.score().reward == rows[0]["episode_reward"]
    if scripted:
        assert out.reward_score == 1.0 and [r["action_name"] for r in rows] == [want, None]
        assert '{"ok": true}' in context


def test_cli_dry_run_prints_config_and_launch_command(tmp_path):
    from typer.testing import CliRunner

    from coevolve.cli import app

    from coevolve.store import Store

    # a pool to train on (test-pick has no states to synthesize one from)
    Store(str(tmp_path / "store")).commit_pool(
        run_id="default",
        round_no=0,
        new_tasks=[t.to_row() for t in PickEnvironment().load_tasks(limit=4)],
        expected_parent=None,
    )
    args = [
        "train",
        "--backend",
        "verl",
        "--dry-run",
        "--store",
        str(tmp_path / "store"),
        "--set",
        "env.name=test-pick",
        "--set",
        "policy.model=tiny",
        "--set",
        f"train.checkpoint_dir={tmp_path / 'ckpt'}",
        "--set",
        "train.verl_gpus_per_node=1",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "adv_estimator: grpo" in result.output and "default_agent_loop: coevolve" in result.output
    command = result.output.split("# launch command:\n", 1)[1].strip().splitlines()
    assert len(command) == 1 and " -m verl.trainer.main_ppo " in command[0]
    # the round's verl files sit beside its checkpoint, under the configured location
    exported = list((tmp_path / "ckpt").rglob("train.parquet"))
    assert len(exported) == 1 and exported[0].parent.name.endswith("-verl")


def test_cli_dry_run_on_a_store_without_a_pool_says_it_runs_round_0(tmp_path):
    """The dry run exports the pool's train split, so a store without a pool gets round 0 first,
    and says so; an environment round 0 cannot synthesize from is one error line, not a traceback."""
    from typer.testing import CliRunner

    from coevolve.cli import app

    args = ["train", "--backend", "verl", "--dry-run", "--store", str(tmp_path / "store")]
    args += ["--set", "env.name=test-pick", "--set", "policy.model=tiny"]
    result = CliRunner().invoke(app, [*args, "--set", f"train.checkpoint_dir={tmp_path / 'ckpt'}"])
    assert result.exit_code == 2, result.output  # fail()'s exit; a traceback would be 1
    out = " ".join(result.output.split())
    assert "has no task pool: running round 0 first" in out and "offers no training states" in out
    assert not (tmp_path / "ckpt").exists()


def test_agent_loop_hands_a_text_answer_to_the_environment():
    """A message without tool calls ends the turn and, for environments that score the
    turn's text (AgentDojo's utility checks read it), reaches ``Episode.reply``."""
    from coevolve.train.verl_agent_loop import CoevolveAgentLoop

    class Answering:
        def __init__(self):
            self.replies: list[str] = []

        def reply(self, text: str) -> None:
            self.replies.append(text)

    loop = object.__new__(CoevolveAgentLoop)  # _act needs only the row template and the row list
    loop._base, loop._rows = {"phase": "train"}, []
    ep, tokens = Answering(), {"completion_ids": [1, 2], "completion_logprobs": [0.0, 0.0], "finish_reason": None}
    assert loop._act(ep, 0, 0, "The balance is 42.", tokens, []) is True
    assert ep.replies == ["The balance is 42."] and loop._rows[0]["n_tokens"] == 2
    # a call-less answer to an environment without reply (BFCL) ends the turn all the same
    assert loop._act(object(), 0, 1, "Done.", tokens, []) is True
