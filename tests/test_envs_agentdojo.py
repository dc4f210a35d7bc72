"""AgentDojo as a coevolve environment: fidelity to AgentDojo's own checks, isolation, dispatch, split."""

from __future__ import annotations

import pytest

pytest.importorskip("agentdojo")

from coevolve.envs import agentdojo as ad  # noqa: E402
from coevolve.envs.agentdojo import AgentDojoEnvironment  # noqa: E402
from coevolve.envs.base import ToolCall  # noqa: E402
from coevolve.registry import resolve  # noqa: E402


@pytest.fixture(scope="module")
def env():
    return AgentDojoEnvironment()


@pytest.fixture(scope="module")
def tasks(env):
    return env.load_tasks()


def test_four_suites_and_97_user_tasks(env, tasks):
    assert resolve("environment", "agentdojo") is AgentDojoEnvironment
    counts = {s: sum(t.category == s for t in tasks) for s in ad.SUITES}
    assert counts == {"workspace": 40, "travel": 20, "banking": 16, "slack": 21}
    assert {len(env.function_docs(t)) for t in tasks if t.category == "banking"} == {11}


def test_replaying_ground_truth_gives_agentdojos_own_utility_verdict_for_all_97(env, tasks):
    from agentdojo.agent_pipeline.ground_truth_pipeline import GroundTruthPipeline

    mismatches, passed = [], 0
    for task in tasks:
        suite = ad.suites()[task.category]
        user_task = suite.user_tasks[task.initial_state["user_task"]]
        theirs, _ = suite.run_task_with_pipeline(GroundTruthPipeline(user_task), user_task, None, {})
        ep = env.episode(task)
        ep.user_message(0)
        for call in task.reference_actions[0]:
            ep.step(ToolCall(call["name"], call["arguments"]))
        ep.reply(user_task.GROUND_TRUTH_OUTPUT)
        ep.end_turn()
        ours = ep.score().success
        passed += ours
        if ours != theirs:
            mismatches.append((task.task_id, ours, theirs))
    assert not mismatches
    assert passed >= 90  # AgentDojo's ground truth solves (nearly) every user task


def test_a_wrong_answer_fails_the_utility_check(env):
    task = env.load_tasks(ids=["banking.user_task_0"])[0]
    ep = env.episode(task)
    ep.step(ToolCall("get_balance", {}))
    ep.reply("I did nothing.")
    ep.end_turn()
    score = ep.score()
    assert not score.success and "utility" in score.reason and score.turn_passed == [False]


def test_episodes_are_isolated_and_bad_calls_are_error_observations(env):
    state = env.training_states(0, 0, ["banking"])[0]
    start = env.start_state(state)
    a, b = env.episode(start), env.episode(start)
    obs = a.step(
        ToolCall(
            "send_money", {"recipient": "GB29NWBK60161331926819", "amount": 5.0, "subject": "x", "date": "2022-03-10"}
        )
    )
    assert obs.error is None
    assert "5.0" in a.step(ToolCall("get_most_recent_transactions", {"n": 1})).content
    assert "5.0" not in b.step(ToolCall("get_most_recent_transactions", {"n": 1})).content
    assert a.state_fingerprint() != b.state_fingerprint()
    assert start.initial_state == env.start_state(state).initial_state  # the task's state is untouched
    for call in [
        ToolCall("__import__", {"name": "os"}),
        ToolCall("send_money", {"amount": "lots"}),
        ToolCall("get_balance", ["x"]),
        ToolCall("send_money", {"recipient": 1, "amount": 1.0}),
    ]:
        out = b.step(call)
        assert out.error and out.content.startswith("Error")
    assert b.n_malformed == 4


def test_a_synthesized_task_is_scored_against_its_reference_replay(env):
    state = env.start_state(env.training_states(0, 0, ["banking"])[0])
    ref = [
        {"name": "update_password", "arguments": {"password": "s3cret-pass"}},
        {"name": "get_balance", "arguments": {}},
    ]
    task = type(state)(
        **{
            **state.__dict__,
            "turns": ["Set my password to s3cret-pass and tell me my balance."],
            "reference_actions": [ref],
        }
    )
    good = env.episode(task)
    for c in ref:
        good.step(ToolCall(c["name"], c["arguments"]))
    good.end_turn()
    assert good.score().success
    half = env.episode(task)
    half.step(ToolCall("get_balance", {}))
    half.end_turn()
    score = half.score()
    assert not score.success and "differs" in score.reason and 0 < score.progress < 0.5


def test_observations_carry_no_wall_clock_time(env):
    """A created file's last_modified is the wall clock: the agent sees a marker instead, so the
    same calls give the same text on every run (and a synthesized task still scores)."""
    import datetime

    state = env.start_state(env.training_states(0, 0, ["workspace"])[0])
    ref = [{"name": "create_file", "arguments": {"filename": "plan.txt", "content": "day one"}}]
    task = type(state)(**{**state.__dict__, "turns": ["Create plan.txt saying day one."], "reference_actions": [ref]})
    seen = []
    for _ in range(2):
        episode = env.episode(task)
        obs = episode.step(ToolCall("create_file", ref[0]["arguments"]))
        episode.end_turn()
        assert episode.score().success
        seen.append(obs.content)
    today = datetime.date.today().isoformat()
    assert seen[0] == seen[1] and "@clock" in seen[0] and today not in seen[0], seen[0]


def test_heldout_user_tasks_never_reach_the_training_side(env):
    held = env.heldout_tasks(40, 0)
    assert len(held) == 40 and len({t.task_id for t in held}) == 40
    assert env.heldout_tasks(40, 0, scenarios=3) == env.heldout_tasks(40, 0, scenarios=3)
    assert {t.task_id for t in env.heldout_tasks(40, 0, scenarios=3)} <= {t.task_id for t in held}
    states = env.training_states(40, 0)
    assert [s.category for s in states] == ad.SUITES
    for s in states:  # state only: no prompt, no ground truth, no user task named
        assert s.turns == [] and s.reference_actions == [] and "user_task" not in s.initial_state
    # settings written for BFCL (its category names) fall back to every suite; a typo among suites fails
    assert [s.category for s in env.training_states(40, 0, ["multi_turn_base"])] == ad.SUITES
    with pytest.raises(ValueError):
        env.training_states(40, 0, ["banking", "bankin"])
