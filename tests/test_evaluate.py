"""Tests of coevolve.evaluate and ``coevolve eval``: ground-truth replay through the rollout
engine, rollouts written to the store, per-category accuracy, fuzzed model output, budgets."""

from __future__ import annotations

import json
import random
import time

import pytest
from typer.testing import CliRunner

from coevolve.config import RunConfig
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.envs.bfcl_data import heldout_scenarios, scenario_of
from coevolve.evaluate import eval_tasks, evaluate, evaluate_parts, replay_reference
from coevolve.policy.base import Generation
from coevolve.policy.replay import ReplayPolicy
from coevolve.rollout import run_episodes
from coevolve.policy.base import SamplingParams
from coevolve.store import Store


@pytest.fixture(scope="module")
def env() -> BfclEnvironment:
    return BfclEnvironment()


@pytest.fixture(scope="module")
def few(env):
    return [t for c in env.categories for t in env.load_tasks([c], limit=3)]


def test_replay_policy_messages(few):
    task = few[0]
    policy = ReplayPolicy([task])
    first = policy.message(task.task_id, 0, 0)
    blocks = [json.loads(b.split("</tool_call>")[0]) for b in first.split("<tool_call>")[1:]]
    assert blocks == task.reference_actions[0]
    assert "<tool_call>" not in policy.message(task.task_id, 0, 1)
    with pytest.raises(ValueError):
        policy.chat([[]], [[]], SamplingParams(), None)


def test_evaluate_replays_ground_truth_and_writes_rollouts(env, few, tmp_path):
    store = Store(str(tmp_path / "store"))
    result = evaluate(store, RunConfig(), "r1", 2, ReplayPolicy(few), few, env=env)
    assert result.score == 1.0 and result.reward == 1.0 and result.n_episodes == len(few)
    assert set(result.per_category) == set(env.categories)
    assert all(row == {"n": 3, "correct": 3, "accuracy": 1.0, "reward": 1.0} for row in result.per_category.values())
    table = store.read("rollouts").to_pylist()
    assert len(table) == result.n_rows > 0
    assert {r["phase"] for r in table} == {"eval"} and {r["run_id"] for r in table} == {"r1"}
    assert {r["round"] for r in table} == {2} and all(r["success"] for r in table)
    assert store.has_part("rollouts", 2, "r1-eval")
    n_calls = sum(len(turn) for t in few for turn in t.reference_actions)
    assert sum(1 for r in table if r["action_name"]) == n_calls


def test_task_sets_evaluated_together_are_scored_and_written_apart(env, few, tmp_path):
    """The benchmark and the held-out synthesized split run as one batch of episodes; each set
    keeps its own part, score and failures, exactly as evaluated alone."""
    store = Store(str(tmp_path / "store"))
    solved, failed = few[:5], few[5:9]
    policy = FailSome(solved + failed, failed)
    both = evaluate_parts(store, RunConfig(), "r1", 1, policy, {"eval": solved, "eval-synth": failed}, env=env)
    assert both["eval"].score == 1.0 and both["eval"].n_episodes == 5
    assert both["eval-synth"].score == 0.0 and set(both["eval-synth"].failures) == {t.task_id for t in failed}
    alone = evaluate(None, RunConfig(), "r1", 1, policy, failed, env=env)
    assert alone.failures == both["eval-synth"].failures and alone.per_category == both["eval-synth"].per_category
    rows = store.read("rollouts").to_pylist()
    assert store.has_part("rollouts", 1, "r1-eval") and store.has_part("rollouts", 1, "r1-eval-synth")
    assert {r["task_id"] for r in rows} == {t.task_id for t in few[:9]}
    assert sum(both[p].n_rows for p in both) == len(rows)


def test_eval_tasks_follow_config(env):
    cfg = RunConfig()
    cfg.env.heldout_scenarios = [11, 3, 7]
    cfg.eval.categories = ["multi_turn_miss_param", "multi_turn_base"]
    cfg.eval.scenarios = 2
    tasks = eval_tasks(cfg, env)
    picked = sorted({int(t.task_id.rsplit("_", 1)[1]) for t in tasks})
    assert len(picked) == 2 and set(picked) <= {3, 7, 11}
    assert [t.task_id for t in tasks] == [f"{c}_{i}" for c in cfg.eval.categories for i in picked]
    assert [t.task_id for t in eval_tasks(cfg, env)] == [t.task_id for t in tasks]  # deterministic
    assert all(t.turns and t.reference_actions for t in tasks)  # full entries, every turn
    assert len(eval_tasks(cfg, env, scenarios=0)) == 6
    assert [t.task_id for t in eval_tasks(cfg, env, limit=1)] == ["multi_turn_miss_param_3", "multi_turn_base_3"]
    assert eval_tasks(RunConfig(), env) == eval_tasks(RunConfig(), env)
    default = eval_tasks(RunConfig(), env)  # the embedded default: 4 held-out scenarios x 4 categories
    assert len(default) == 16 and {t.category for t in default} == set(env.categories)
    cfg.env.heldout_scenarios = 0
    with pytest.raises(ValueError, match="holds nothing out"):
        eval_tasks(cfg, env, scenarios=0)


def test_eval_limit_keeps_categories_the_config_does_not_name():
    # AgentDojo's categories are its suites: the BFCL names of eval.categories select nothing there
    from coevolve.tasks import Task

    class Suites:
        def heldout_tasks(self, heldout, seed, scenarios, categories):
            return [Task(f"{s}.{i}", "x", ["go"], {}, [[]], category=s) for s in ("banking", "slack") for i in range(3)]

    ids = [t.task_id for t in eval_tasks(RunConfig(), Suites(), limit=2)]
    assert ids == ["banking.0", "banking.1", "slack.0", "slack.1"]


class Recorder:
    """Calls ``ls`` forever and records the budgets it is asked to generate under."""

    name = version = "recorder"

    def __init__(self):
        self.budgets: set[int] = set()
        self.steps: dict[tuple[str, int], int] = {}

    def chat(self, conversations, tools, sampling, meta=None):
        self.budgets.add(sampling.max_new_tokens)
        for m in meta:
            key = (m["task_id"], m["turn"])
            self.steps[key] = max(self.steps.get(key, 0), m["step"] + 1)
        return [
            Generation(
                text='<tool_call>{"name": "ls", "arguments": {}}</tool_call>', prompt_tokens=0, completion_tokens=1
            )
            for _ in conversations
        ]


def test_eval_protocol_cuts_a_turn_at_its_own_budget_and_force_quits_the_entry(env):
    cfg = RunConfig()
    cfg.env.heldout_scenarios, cfg.eval.scenarios = [5], 1
    cfg.eval.categories = ["multi_turn_base", "multi_turn_miss_func"]
    cfg.eval.step_limit, cfg.eval.max_new_tokens = 3, 77
    cfg.env.step_limit, cfg.policy.max_new_tokens = 1, 11  # training budgets: must not apply
    policy = Recorder()
    result = evaluate(None, cfg, "p", 0, policy, env=env)
    tasks = eval_tasks(cfg, env)
    assert result.n_episodes == 2 and [t.task_id for t in tasks] == ["multi_turn_base_5", "multi_turn_miss_func_5"]
    assert policy.budgets == {77}
    # the first turn is cut at exactly eval.step_limit messages and BFCL force-quits the entry there
    assert policy.steps == {(t.task_id, 0): 3 for t in tasks} and all(len(t.turns) > 1 for t in tasks)
    assert result.score == 0 and set(result.failures) == {t.task_id for t in tasks}
    defaults = RunConfig().eval
    from bfcl_eval.constants.default_prompts import MAXIMUM_STEP_LIMIT

    assert defaults.step_limit == MAXIMUM_STEP_LIMIT == 20 and defaults.temperature == 0.0


class DropLastTurn(ReplayPolicy):
    """Replays the reference except for the last turn, where it answers in plain text."""

    def __init__(self, tasks):
        super().__init__(tasks)
        self._n_turns = {t.task_id: len(t.turns) for t in tasks}

    def message(self, task_id, turn, step):
        return "I cannot." if turn == self._n_turns[task_id] - 1 else super().message(task_id, turn, step)


class FailSome(ReplayPolicy):
    """Replays the reference, except for the last turn of the ``failing`` tasks (plain text)."""

    def __init__(self, tasks, failing):
        super().__init__(tasks)
        self._last = {t.task_id: len(t.turns) - 1 for t in failing}

    def message(self, task_id, turn, step):
        return "I cannot." if self._last.get(task_id) == turn else super().message(task_id, turn, step)


def test_failures_score_like_bfcl(env, few):
    tasks = [t for t in few if t.reference_actions[-1]]
    result = evaluate(None, RunConfig(), "r", 0, DropLastTurn(tasks), tasks, env=env)
    assert result.score == 0.0 and 0.0 < result.reward < 1.0
    assert all("empty_turn_model_response" in reason for reason in result.failures.values())


FUZZ = [
    "<tool_call>not json</tool_call>",
    '<tool_call>{"name": 5, "arguments": {}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": [1, 2]}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": "x"}',
    '<tool_call>{"name": "__class__", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "_load_scenario", "arguments": {"scenario": {}}}</tool_call>',
    '<tool_call>{"name": "__init__", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": {"a": [1]}, "x": null}}</tool_call>',
    '<tool_call>{"name": "echo", "arguments": {"content": "' + "x" * 100_000 + '"}}</tool_call>',
    '<tool_call>{"name": "power", "arguments": {"base": 10, "exponent": 1e300}}</tool_call>',
    '<tool_call>{"name": "no_such_function", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "cd", "arguments": {"folder": 123456789012345678901234567890}}</tool_call>',
    "<tool_call></tool_call>",
    "</tool_call>{}<tool_call>",
]


class FuzzPolicy:
    """Emits malformed or hostile tool calls; a plain answer after ``per_turn`` messages."""

    name, version = "fuzz", "fuzz"

    def __init__(self, per_turn: int = 3):
        self.per_turn = per_turn

    def chat(self, conversations, tools, sampling, meta=None):
        out = []
        for m in meta:
            rng = random.Random(f"{m['task_id']}/{m['turn']}/{m['step']}")
            if m["step"] >= self.per_turn:
                text = "done"
            elif rng.random() < 0.3:
                junk = "".join(rng.choice('{}[]":,<>/_ abcXYZ019\\\n') for _ in range(rng.randrange(1, 200)))
                text = f"<tool_call>{junk}</tool_call>"
            else:
                text = rng.choice(FUZZ)
            out.append(Generation(text=text, prompt_tokens=0, completion_tokens=1))
        return out


def test_fuzzed_outputs_become_error_steps(env, few):
    results = run_episodes(
        FuzzPolicy(),
        env,
        few,
        sampling=SamplingParams(),
        step_limit=6,
        phase="eval",
        run_id="fuzz",
        round_no=0,
        step_timeout_s=5.0,
    )
    assert len(results) == len(few)
    for r in results:
        assert r.finish_reason is None and not r.score.success
        calls = [row for row in r.steps if row["action_name"] or row["parse_error"]]
        assert calls and all(row["parse_error"] or row["error"] for row in calls), r.steps


class SlowEnv(BfclEnvironment):
    """BFCL whose ``ls`` takes a while: for the wall-clock budget."""

    def episode(self, task):
        ep = super().episode(task)
        step = ep.step

        def slow_step(call):
            if call.name == "ls":
                time.sleep(0.5)
            return step(call)

        ep.step = slow_step
        return ep


class LsForever:
    name, version = "ls", "ls"

    def chat(self, conversations, tools, sampling, meta=None):
        return [
            Generation(
                text='<tool_call>{"name": "ls", "arguments": {}}</tool_call>', prompt_tokens=0, completion_tokens=1
            )
            for _ in conversations
        ]


def test_budgets_end_episodes_with_a_reason(few):
    task = few[0]
    (slow,) = run_episodes(
        LsForever(),
        SlowEnv(),
        [task],
        sampling=SamplingParams(),
        step_limit=4,
        phase="eval",
        run_id="b",
        round_no=0,
        step_timeout_s=0.1,
    )
    assert slow.finish_reason == "time_limit" and not slow.score.success
    assert slow.steps[-1]["finish_reason"] == "time_limit"
    (looping,) = run_episodes(
        LsForever(),
        BfclEnvironment(),
        [task],
        sampling=SamplingParams(),
        step_limit=3,
        phase="eval",
        run_id="b",
        round_no=0,
    )
    cut = [row for row in looping.steps if row["finish_reason"] == "step_limit"]
    assert len(cut) == len(task.turns) and not looping.score.success
    assert all(sum(1 for row in looping.steps if row["turn"] == t) == 3 for t in range(len(task.turns)))


def test_env_only_replay_scores_all(env, few):
    scores = replay_reference(env, few)
    assert few and sorted(scores) == sorted(t.task_id for t in few)  # one score per task
    assert all(s.success for s in scores.values())


def test_cli_eval_replay_ground_truth(tmp_path):
    from coevolve.cli import app

    store = tmp_path / "store"
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--env",
            "bfcl-v3",
            "--replay-ground-truth",
            "--limit",
            "2",
            "--category",
            "multi_turn_base",
            "--category",
            "multi_turn_miss_func",
            "--store",
            str(store),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "multi_turn_base" in res.output and "multi_turn_miss_func" in res.output and "4/4" in res.output
    assert "BFCL overall accuracy" in res.output
    held = heldout_scenarios(RunConfig().env.heldout_scenarios, RunConfig().seed)
    ids = {r["task_id"] for r in Store(str(store)).read("rollouts").to_pylist()}
    assert len(ids) == 4 and all(scenario_of(i) in held for i in ids)
    bad = CliRunner().invoke(app, ["eval", "--ids", "multi_turn_base_999999", "--no-store", "--replay-ground-truth"])
    assert bad.exit_code != 0 and "unknown" in bad.output
    train_id = f"multi_turn_base_{min(set(range(200)) - held)}"
    for args in (["--ids", train_id, "--replay-ground-truth"], ["--all", "--limit", "1", "--model", "tiny"]):
        refused = CliRunner().invoke(app, ["eval", "--no-store", *args])
        assert refused.exit_code != 0 and ("not held-out" in refused.output or "--all" in refused.output), (
            refused.output
        )
    everything = CliRunner().invoke(app, ["eval", "--all", "--replay-ground-truth", "--ids", train_id, "--no-store"])
    assert everything.exit_code == 0 and "1/1" in everything.output, everything.output
