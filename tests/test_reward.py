"""Tests of the training reward (coevolve.reward) on planted BFCL episodes: a pass, a partial
reproduction, a wrong-argument call, malformed calls, and the parts written to ``rollouts``."""

from __future__ import annotations

import copy
import json

import pytest

from coevolve import reward
from coevolve.envs import bfcl_data
from coevolve.envs.base import EpisodeScore, ToolCall
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.policy.base import Generation, SamplingParams
from coevolve.rollout import run_episodes


@pytest.fixture(scope="module")
def env() -> BfclEnvironment:
    return BfclEnvironment()


@pytest.fixture(scope="module")
def task(env):
    # turn 0: cd(document), mkdir(temp), mv(final_report.pdf -> temp); 4 turns in all
    return env.load_tasks(ids=["multi_turn_base_0"])[0]


def play(env, task, per_turn: list[list[ToolCall]]) -> EpisodeScore:
    """Drive every turn of ``task``: the planted calls of the first turns, none afterwards."""
    ep = env.episode(task)
    for turn in range(ep.n_turns):
        for call in per_turn[turn] if turn < len(per_turn) else []:
            ep.step(call)
        ep.end_turn()
    return ep.score()


def ref(task, turn: int) -> list[ToolCall]:
    return [ToolCall(c["name"], copy.deepcopy(c["arguments"])) for c in task.reference_actions[turn]]


def test_a_pass_earns_one(env, task):
    score = play(env, task, [ref(task, t) for t in range(len(task.turns))])
    assert score.success and score.progress == 1.0 and score.format == 1.0 and score.reward == 1.0


def test_partial_reproduction_earns_scaled_credit(env, task):
    cd, mkdir, _mv = ref(task, 0)
    score = play(env, task, [[cd, mkdir]])  # the move is missing: turn 0 fails, later turns are empty
    assert not score.success and score.turn_passed == [False] * 4
    assert score.progress == pytest.approx(reward.PARTIAL_SCALE * 2 / 3 / 4)
    assert score.reward == pytest.approx(score.progress + reward.FORMAT_WEIGHT * 1.0)
    # a pass of turn 0 is worth more than any partial reproduction of it
    passed = play(env, task, [ref(task, 0)])
    assert passed.turn_passed[0] and passed.progress == pytest.approx(1 / 4) and passed.progress > score.progress


def test_wrong_argument_is_not_a_reproduction(env, task):
    cd, _mkdir, _mv = ref(task, 0)
    wrong = [
        cd,
        ToolCall("mkdir", {"dir_name": "tmp"}),
        ToolCall("mv", {"source": "final_report.pdf", "destination": "tmp"}),
    ]
    score = play(env, task, [wrong])
    assert not score.success and score.format == 1.0
    assert score.progress == pytest.approx(reward.PARTIAL_SCALE * 1 / 3 / 4)  # only cd(document) counts
    partial = play(env, task, [ref(task, 0)[:2]])
    assert score.reward < partial.reward


def test_malformed_calls_lower_the_format_share(env, task):
    bad = [ToolCall("cd", [1, 2]), ToolCall("no_such_function", {})]
    score = play(env, task, [ref(task, 0) + bad])
    assert score.turn_passed[0] and score.n_calls == 5 and score.n_malformed == 2
    assert score.progress == pytest.approx(1 / 4) and score.format == pytest.approx(3 / 5)
    assert score.reward == pytest.approx(1 / 4 + reward.FORMAT_WEIGHT * 3 / 5)
    # messages the engine could not parse count as malformed attempts too
    more = reward.with_parse_errors(score, 3)
    assert more.n_calls == 8 and more.format == pytest.approx(3 / 8) and more.progress == score.progress
    assert more.reward == pytest.approx(1 / 4 + reward.FORMAT_WEIGHT * 3 / 8)
    # a score without parts (an environment that only sets `reward`) is left alone
    plain = EpisodeScore(success=False, reward=0.5)
    assert reward.with_parse_errors(plain, 2) is plain


def test_no_call_earns_nothing(env, task):
    score = play(env, task, [])
    assert score.progress == 0.0 and score.format == 0.0 and score.reward == 0.0


def test_reproduced_matches_one_to_one_and_fills_defaults():
    owner = bfcl_data.method_owner(["GorillaFileSystem"])
    norm = lambda name, args: bfcl_data.normalized_arguments(name, args, owner)  # noqa: E731
    refs = [
        {"name": "ls", "arguments": {}},
        {"name": "ls", "arguments": {}},
        {"name": "cd", "arguments": {"folder": "a"}},
    ]
    agent = [
        {"name": "ls", "arguments": {"a": False}, "error": None},
        {"name": "cd", "arguments": {"folder": "a"}, "error": None},
    ]
    assert reward.reproduced(refs, agent, norm) == 2  # ls() == ls(a=False); one agent ls covers one reference ls
    assert reward.reproduced(refs, agent) == 1  # without the defaults filled in, ls(a=False) differs
    failed = [{"name": "cd", "arguments": {"folder": "a"}, "error": "no such folder"}]
    assert reward.reproduced(refs, failed, norm) == 0  # a failed call reproduces no effect...
    assert (
        reward.reproduced([{**refs[2], "error": "no such folder"}], failed, norm) == 1
    )  # ...unless the reference failed too
    assert reward.reproduced([{"name": "add", "arguments": {"a": 1}}], [{"name": "add", "arguments": {"a": 1.0}}]) == 1


def test_reward_bounds():
    assert reward.training_reward(1.0, 1.0) == 1.0 and reward.training_reward(0.0, 0.0) == 0.0
    assert reward.turn_progress(False, 0, 0) == 0.0 and reward.turn_progress(True, 3, 0) == 1.0
    assert reward.turn_progress(False, 4, 4) == reward.PARTIAL_SCALE < 1.0
    assert reward.format_share(0, 0) == 0.0 and reward.episode_progress([1.0], 2) == 0.5


class Scripted:
    """Turn 0: an unparseable block, then the reference calls, then a plain answer; later turns: answers."""

    name = version = "scripted"

    def __init__(self, task):
        self.task = task

    def chat(self, conversations, tools, sampling, meta=None):
        out = []
        for m in meta:
            if m["turn"] == 0 and m["step"] == 0:
                text = "<tool_call>not json</tool_call>"
            elif m["turn"] == 0 and m["step"] == 1:
                text = "".join(f"<tool_call>{json.dumps(c)}</tool_call>" for c in self.task.reference_actions[0])
            else:
                text = "Done."
            out.append(Generation(text=text, prompt_tokens=0, completion_tokens=1))
        return out


def test_rollout_rows_carry_the_parts(env, task):
    (r,) = run_episodes(
        Scripted(task), env, [task], sampling=SamplingParams(), step_limit=4, phase="train", run_id="rw", round_no=1
    )
    assert sum(1 for row in r.steps if row["parse_error"]) == 1
    assert r.score.n_calls == 4 and r.score.n_malformed == 1
    expected = 1 / 4 + reward.FORMAT_WEIGHT * 3 / 4
    for row in r.steps:
        assert row["reward_progress"] == pytest.approx(1 / 4) and row["reward_format"] == pytest.approx(3 / 4)
        assert row["episode_reward"] == pytest.approx(expected) and row["success"] is False
