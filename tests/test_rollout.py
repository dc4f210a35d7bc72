"""Tests of the rollout engine against a tiny fake environment (a counter API), with scripted
policies for exact behaviour and the tiny local model for batching and seeding."""

from __future__ import annotations

import json
import time

import pytest

from coevolve.config import PolicyConfig
from coevolve.envs.base import EpisodeScore, Observation, ToolCall
from coevolve.policy.base import Generation, SamplingParams
from coevolve.rollout import run_episodes
from coevolve.schemas import to_table
from coevolve.tasks import Task

TOOLS = [
    {
        "name": "add",
        "description": "Add x to the counter.",
        "parameters": {"type": "dict", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    },
    {"name": "get", "description": "Read the counter.", "parameters": {"type": "dict", "properties": {}}},
]


class CounterEpisode:
    """A counter that starts at the task's initial value; turn t passes if the counter then
    equals ``initial_state["expected"][t]``."""

    def __init__(self, task: Task):
        self.task = task
        self.n_turns = len(task.turns)
        self.value = task.initial_state["value"]
        self.after_turn: list[int] = []

    def user_message(self, turn):
        return self.task.turns[turn] or None

    def tools(self, turn):
        return TOOLS

    def step(self, call: ToolCall) -> Observation:
        if call.name == "add":
            self.value += int(call.arguments.get("x", 0))
            return Observation(json.dumps({"value": self.value}))
        if call.name == "get":
            return Observation(json.dumps({"value": self.value}))
        if call.name == "boom":
            raise RuntimeError("kaput")
        if call.name == "sleep":
            time.sleep(float(call.arguments["s"]))
            return Observation("slept")
        return Observation(f"Error: no function {call.name!r}", error="unknown function")

    def end_turn(self):
        self.after_turn.append(self.value)

    def score(self) -> EpisodeScore:
        passed = [v == e for v, e in zip(self.after_turn, self.task.initial_state["expected"])]
        passed += [False] * (self.n_turns - len(passed))
        return EpisodeScore(success=all(passed), reward=sum(passed) / self.n_turns, turn_passed=passed)


class CounterEnv:
    name = "counter"

    def __init__(self):
        self.opened: list[CounterEpisode] = []

    def load_tasks(self, categories=None, ids=None, limit=None):
        return make_tasks(limit or 4)

    def episode(self, task):
        ep = CounterEpisode(task)
        self.opened.append(ep)
        return ep


def make_tasks(n: int) -> list[Task]:
    return [
        Task(
            task_id=f"t{i}",
            env="counter",
            turns=["add 2", "", "add 3 then read"],
            initial_state={"value": i, "expected": [i + 2, i + 2, i + 5]},
            reference_actions=[
                [{"name": "add", "arguments": {"x": 2}}],
                [],
                [{"name": "add", "arguments": {"x": 3}}, {"name": "get", "arguments": {}}],
            ],
        )
        for i in range(n)
    ]


def call(name: str, **args) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


class Scripted:
    """Answers with ``script(meta, conversation)``; records every batch it was given."""

    name, version = "scripted", "script-v1"

    def __init__(self, script):
        self.script, self.batches, self.metas = script, [], []

    def chat(self, conversations, tools, sampling, meta=None):
        self.batches.append(len(conversations))
        self.metas += meta
        return [
            Generation(text=self.script(m, c), prompt_tokens=10, completion_tokens=7)
            for m, c in zip(meta, conversations)
        ]


def reference_script(m, conv):
    """Replays the reference: all calls of the turn in the first message, then a plain answer."""
    refs = make_tasks(10)[int(m["task_id"][1:])].reference_actions[m["turn"]]
    if m["step"] == 0 and refs:
        return "\n".join(call(c["name"], **c["arguments"]) for c in refs)
    return "Done."


def run(policy, tasks, env=None, **kw):
    kw.setdefault("sampling", SamplingParams())
    kw.setdefault("step_limit", 4)
    return run_episodes(policy, env or CounterEnv(), tasks, phase="train", run_id="r", round_no=1, **kw)


def test_reference_replay_succeeds_and_rows_follow_the_schema():
    tasks = make_tasks(3)
    seen = []
    results = run(
        Scripted(reference_script), tasks, n_samples=2, train_step=5, progress=lambda d, t: seen.append((d, t))
    )
    assert [(r.task_id, r.sample_idx) for r in results] == [(t.task_id, s) for t in tasks for s in range(2)]
    assert all(r.score.success and r.score.reward == 1.0 for r in results)
    assert seen[-1] == (6, 6) and len(seen) == 6
    r = results[0]
    assert [(s["turn"], s["step"], s["action_name"]) for s in r.steps] == [
        (0, 0, "add"),
        (0, 1, None),
        (1, 0, None),
        (2, 0, "add"),
        (2, 1, "get"),
        (2, 2, None),
    ]
    assert [s["n_tokens"] for s in r.steps] == [7, 7, 7, 7, 0, 7], "a message's tokens count once"
    assert r.n_generated_tokens == 5 * 7
    assert all(s["episode_reward"] == 1.0 and s["success"] and s["policy_version"] == "script-v1" for s in r.steps)
    assert sum(s["step_reward"] for s in r.steps) == pytest.approx(1.0)
    assert r.steps[3]["observation"] == json.dumps({"value": 5}) and r.steps[3]["action_args"] == '{"x": 3}'
    assert [m["role"] for m in r.messages][:5] == ["system", "user", "assistant", "tool", "assistant"]
    assert r.tools == TOOLS
    table = to_table("rollouts", [s for res in results for s in res.steps])
    assert table.num_rows == 36 and set(table.column("train_step").to_pylist()) == {5}
    assert len({res.episode_id for res in results}) == 6


def test_samples_share_the_initial_state_but_not_the_episode():
    env = CounterEnv()
    run(Scripted(reference_script), make_tasks(2), env=env, n_samples=3)
    assert len(env.opened) == 6 and len({id(e) for e in env.opened}) == 6
    assert [e.after_turn[0] for e in env.opened] == [2, 2, 2, 3, 3, 3]


def test_parse_errors_are_observations_and_logged():
    def script(m, conv):
        return "<tool_call>{oops</tool_call>" if m["step"] == 0 else "I give up."

    (r,) = run(Scripted(script), make_tasks(1))
    first = r.steps[0]
    assert first["action_name"] is None and "not valid JSON" in first["parse_error"]
    assert first["observation"].startswith("Error: ") and r.messages[3]["role"] == "tool"
    assert r.messages[3]["content"] == first["observation"]
    assert not r.score.success and all(s["success"] is False for s in r.steps)


def test_at_evaluation_a_parse_error_ends_the_turn_as_in_bfcl():
    # every message of turn 0 is malformed: retried up to the step limit, or the turn ends at once
    def script(m, conv):
        return "<tool_call>{oops</tool_call>" if m["turn"] == 0 else "Done."

    (retried,) = run(Scripted(script), make_tasks(1), step_limit=5)
    (ended,) = run(Scripted(script), make_tasks(1), step_limit=5, parse_error_ends_turn=True)
    assert [s["turn"] for s in retried.steps].count(0) == 5
    turn0 = [s for s in ended.steps if s["turn"] == 0]
    assert len(turn0) == 1 and "not valid JSON" in turn0[0]["parse_error"] and turn0[0]["observation"] is None
    # no error observation: turn 1 (which brings no user message) answers right after it
    roles = [m["role"] for m in ended.messages]
    assert roles[:4] == ["system", "user", "assistant", "assistant"] and "tool" not in roles[:4]
    assert {s["turn"] for s in ended.steps} == {0, 1, 2}


def test_step_limit_cuts_each_turn():
    (r,) = run(Scripted(lambda m, c: call("get")), make_tasks(1), step_limit=3)
    assert [s["finish_reason"] for s in r.steps].count("step_limit") == 3
    assert all(sum(1 for s in r.steps if s["turn"] == t) == 3 for t in range(3))


def test_at_evaluation_a_turn_at_the_step_limit_ends_the_entry_as_in_bfcl():
    """BFCL force-quits an entry whose turn reaches the limit: that turn is checked, the later
    ones never run (so they fail); a force quit in the last turn leaves the entry scored as usual."""

    def stuck_in(turn):
        def script(m, conv):
            return call("get") if m["turn"] == turn else reference_script(m, conv)

        return script

    (quit_early,) = run(Scripted(stuck_in(0)), make_tasks(1), step_limit=3, step_limit_ends_episode=True)
    assert {s["turn"] for s in quit_early.steps} == {0} and len(quit_early.steps) == 3
    assert quit_early.finish_reason == "step_limit" and quit_early.steps[-1]["finish_reason"] == "step_limit"
    assert quit_early.score.turn_passed == [False, False, False] and not quit_early.score.success
    assert [m["role"] for m in quit_early.messages].count("user") == 1, "turn 1's user message never shown"
    (went_on,) = run(Scripted(stuck_in(0)), make_tasks(1), step_limit=3)
    assert {s["turn"] for s in went_on.steps} == {0, 1, 2} and went_on.finish_reason is None
    # stuck in the last turn, after the first two passed: the entry is scored on all three turns
    (last,) = run(Scripted(stuck_in(2)), make_tasks(1), step_limit=3, step_limit_ends_episode=True)
    assert {s["turn"] for s in last.steps} == {0, 1, 2} and last.finish_reason is None
    assert last.score.turn_passed[:2] == [True, True] and not last.score.turn_passed[2]


def test_batches_stay_within_batch_size_and_refill():
    policy = Scripted(reference_script)
    run(policy, make_tasks(5), n_samples=2, batch_size=4)
    assert max(policy.batches) == 4 and policy.batches[0] == 4
    assert sum(policy.batches) == 10 * 5, "5 model messages per episode"
    assert {tuple(sorted(m)) for m in policy.metas} == {("sample_idx", "step", "task_id", "turn")}


def test_environment_failures_end_only_their_episode():
    def script(m, conv):
        if m["task_id"] == "t0" and m["turn"] == 2:
            return call("boom")
        if m["task_id"] == "t1" and m["turn"] == 0 and m["step"] == 0:
            return call("sleep", s=0.5)
        return reference_script(m, conv)

    bad, slow, good = run(Scripted(script), make_tasks(3), step_timeout_s=0.2)
    assert bad.finish_reason == "error" and "kaput" in bad.steps[-1]["error"] and not bad.score.success
    assert bad.steps[-1]["finish_reason"] == "error"
    assert slow.finish_reason == "time_limit" and slow.steps[-1]["finish_reason"] == "time_limit"
    assert good.finish_reason is None and good.score.success


def test_a_policy_that_drops_conversations_is_an_error():
    with pytest.raises(RuntimeError, match="returned 0 generations for 2"):
        run(_Empty(), make_tasks(2))


class _Empty:
    name, version = "empty", "empty"

    def chat(self, conversations, tools, sampling, meta=None):
        return []


def test_context_limit_ends_the_episode():
    class Full(Scripted):
        def chat(self, conversations, tools, sampling, meta=None):
            return [
                Generation(text="", prompt_tokens=0, completion_tokens=0, finish_reason="context_limit")
                for _ in conversations
            ]

    (r,) = run(Full(None), make_tasks(1))
    assert r.finish_reason == "context_limit" and r.steps[-1]["finish_reason"] == "context_limit"


@pytest.fixture(scope="module")
def tiny_cfg():
    return PolicyConfig(model="tiny", max_context_tokens=1024)


def test_tiny_model_rollouts_are_reproducible_and_batch_independent(tiny_cfg, one_thread):
    from coevolve.policy import load_policy

    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    tasks = make_tasks(3)

    def rows(batch_size, seed=7):
        policy = load_policy(tiny_cfg)  # a fresh policy: its prefix cache starts empty
        results = run(policy, tasks, n_samples=2, sampling=sampling, step_limit=2, batch_size=batch_size, seed=seed)
        assert all(r.steps and r.n_generated_tokens > 0 for r in results)
        assert all(s["policy_version"] == "tiny" for r in results for s in r.steps)
        return [[m["content"] for m in r.messages] for r in results]

    first = rows(4)
    assert rows(4) == first, "same seed, same rollouts"
    assert rows(6) == first, "a row's sample does not depend on its batch"
    assert rows(4, seed=8) != first


def test_bfcl_episodes_with_the_tiny_model_record_every_step(tiny_cfg, one_thread):
    from coevolve.envs.bfcl import BfclEnvironment
    from coevolve.policy import load_policy

    env = BfclEnvironment()
    tasks = env.load_tasks(["multi_turn_base"], limit=2)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16)

    def go():
        return run_episodes(
            load_policy(tiny_cfg),
            env,
            tasks,
            n_samples=2,
            sampling=sampling,
            step_limit=2,
            phase="eval",
            run_id="bfcl",
            round_no=0,
            batch_size=4,
            seed=3,
        )

    first = go()
    for r in first:
        assistant = sum(1 for m in r.messages if m["role"] == "assistant")
        # every model message is at least one row, and its tokens are counted once
        assert len(r.steps) >= assistant and sum(s["n_tokens"] for s in r.steps) == r.n_generated_tokens > 0
        turns = sorted({s["turn"] for s in r.steps})
        assert turns == list(range(len(turns)))
    assert to_table("rollouts", [s for r in first for s in r.steps]).num_rows == sum(len(r.steps) for r in first)
    assert [[s["observation"] for s in r.steps] for r in go()] == [[s["observation"] for s in r.steps] for r in first]


def test_rollout_settings_of_evaluation_and_of_validation():
    """Evaluation follows BFCL's protocol (eval.*); validation's attempts sample as the policy does."""
    from coevolve.config import load_config
    from coevolve.rollout import rollout_settings

    cfg = load_config(
        overrides={"eval.temperature": 0.0, "eval.step_limit": 20, "policy.top_p": 0.9, "env.step_limit": 4, "seed": 3}
    )
    ev, va = rollout_settings(cfg, "eval"), rollout_settings(cfg, "validate")
    assert (ev["sampling"].temperature, ev["sampling"].top_p, ev["step_limit"]) == (0.0, 1.0, 20)
    assert ev["parse_error_ends_turn"] and ev["step_limit_ends_episode"]
    assert ev["sampling"].max_new_tokens == cfg.eval.max_new_tokens and ev["sampling"].seed == 3
    assert (va["sampling"].temperature, va["sampling"].top_p, va["step_limit"]) == (cfg.policy.temperature, 0.9, 4)
    assert (
        "parse_error_ends_turn" not in va
        and "step_limit_ends_episode" not in va
        and va["sampling"].max_new_tokens == cfg.policy.max_new_tokens
    )
    for s in (ev, va):
        assert (s["seed"], s["batch_size"], s["step_timeout_s"]) == (3, cfg.policy.batch_size, cfg.env.step_timeout_s)
