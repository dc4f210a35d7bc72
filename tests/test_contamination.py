"""Tests of the auditable validator: the contamination check against held-out benchmark turns
(coevolve.contamination), how each accepted task passed (pass_kind), and the cap on the share
that passed by failure with positive reward (validate.max_partial_share)."""

from __future__ import annotations

import dataclasses

import pytest

from coevolve.config import ConfigError, load_config
from coevolve.contamination import HeldoutIndex, heldout_index, ngrams
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.explore import start_task
from coevolve.tasks import Task
from coevolve.validate import Attempts, cap_partial, learnable, partial_share, summarize_candidates, validate_rows
from coevolve.schemas import to_table


@pytest.fixture(scope="module")
def env():
    return BfclEnvironment()


@pytest.fixture(scope="module")
def cfg():
    return load_config()


@pytest.fixture(scope="module")
def heldout(env, cfg):
    """A held-out BFCL-V3 entry of the default config (base category) with a long first question."""
    tasks = env.heldout_tasks(cfg.env.heldout_scenarios, cfg.seed, 0, ["multi_turn_base"])
    return next(t for t in tasks if len(t.turns[0].split()) >= 15 and t.reference_actions[0])


def candidate(state: Task, turns: list[str], reference: list[list[dict]], cid: str) -> dict:
    task = dataclasses.replace(
        start_task(state),
        task_id=f"{state.task_id}~{cid}",
        turns=turns,
        reference_actions=reference,
        origin="explored",
        signal_type="boundary",
        seed_task_id=state.task_id,
    )
    return {
        "run_id": "t",
        "candidate_id": cid,
        "signal_id": "s",
        "signal_type": "boundary",
        "context_task_id": state.task_id,
        "source_run": 0,
        "spec": task.to_json(),
        "n_turns": len(turns),
        "content_hash": task.content_hash,
    }


def near_copy(question: str) -> str:
    """The question with one word in the middle changed and its punctuation dropped."""
    words = question.replace("?", "").replace(".", "").split()
    words[len(words) // 2] = "kindly"
    return " ".join(words)


def test_a_planted_near_copy_of_a_heldout_turn_is_refused_and_an_unrelated_task_is_not(env, cfg, heldout):
    training = env.training_states(cfg.env.heldout_scenarios, cfg.seed, ["multi_turn_base"])
    other = next(t for t in training if "GorillaFileSystem" in t.initial_state["involved_classes"])
    rows = [
        # the question, reworded by one word, from a training state with calls of its own
        candidate(other, [near_copy(heldout.turns[0])], [[{"name": "pwd", "arguments": {}}]], "text-copy"),
        # the held-out turn's own calls on its own state, in other words
        candidate(heldout, ["Please take care of this for me."], [heldout.reference_actions[0]], "call-copy"),
        # an unrelated task on a training state
        candidate(other, ["Show me where I am in the file system."], [[{"name": "pwd", "arguments": {}}]], "unrelated"),
    ]
    out = {r["candidate_id"]: r for r in validate_rows(rows, [], env, cfg, None)}
    for cid in ("text-copy", "call-copy"):
        r = out[cid]
        assert r["verdict"] == "rejected" and r["reason"].startswith("contamination: similarity"), r["reason"]
        assert r["contamination"] > cfg.validate.contamination_threshold
        assert r["contamination_id"] == f"{heldout.task_id}#0"
        assert heldout.turns[0] not in r["reason"]  # an id and a number leave the check, never the text
    assert out["call-copy"]["contamination"] == 1.0
    r = out["unrelated"]
    assert not (r["reason"] or "").startswith("contamination") and r["contamination"] < 0.2
    # recorded in the candidates table
    table = to_table("candidates", list(out.values()))
    assert table.column("contamination").null_count == 0
    # a threshold of 1.0 records and refuses nothing (but an exact copy of calls, 1.0, is not above it)
    lenient = load_config(None, {"validate.contamination_threshold": 1.0})
    again = validate_rows(rows[:2], [], env, lenient, None)
    assert not any((r["reason"] or "").startswith("contamination") for r in again)


def test_the_index_compares_ngrams_everywhere_and_calls_only_on_the_same_state():
    state_a = {"initial_config": {"A": 1}}
    state_b = {"initial_config": {"B": 2}}
    calls = [{"name": "ls", "arguments": {"a": 1}}]
    held = Task("h", "x", ["list the files in the current folder"], state_a, [calls], ["ls"])
    index = HeldoutIndex.of([held])
    same_calls_other_state = Task("c1", "x", ["do it"], state_b, [calls], ["ls"])
    same_calls_same_state = dataclasses.replace(same_calls_other_state, initial_state=state_a)
    assert index.nearest(same_calls_other_state) == (0.0, None)
    assert index.nearest(same_calls_same_state) == (1.0, "h#0")
    words = dataclasses.replace(same_calls_other_state, turns=["list the files in the current folder please"])
    sim, nearest = index.nearest(words)
    assert nearest == "h#0" and sim == pytest.approx(5 / 6)
    assert ngrams("Hi there") == frozenset({("hi", "there")}) and ngrams("") == frozenset()


def test_the_heldout_index_is_built_once_per_settings(env, cfg):
    a = heldout_index(env, cfg.env.heldout_scenarios, cfg.seed)
    assert a is heldout_index(env, cfg.env.heldout_scenarios, cfg.seed) and len(a.turns) > 100


# --------------------------------------------------------------------------- pass kind and the cap
def test_accepted_rows_record_how_they_passed():
    assert learnable(Attempts([1.0, 0.0], [True, False]), True)["pass_kind"] == "success"
    assert learnable(Attempts([0.0, 0.5], [False, False]), True)["pass_kind"] == "partial"
    assert "pass_kind" not in learnable(Attempts([0.0, 0.0], [False, False]), True)


def _accepted(cid: str, kind: str, reward: float) -> dict:
    return {"candidate_id": cid, "verdict": "accepted", "pass_kind": kind, "reward": reward, "reason": "accepted: x"}


def test_the_partial_share_cap_rejects_the_weakest_partial_passes():
    rows = [
        _accepted("s1", "success", 1.0),
        _accepted("p1", "partial", 0.5),
        _accepted("p2", "partial", 0.2),
        _accepted("p3", "partial", 0.2),
        {"candidate_id": "r", "verdict": "rejected", "reason": "pass 1 replay: x", "reward": None},
    ]
    assert partial_share(rows) == 0.75
    assert cap_partial(rows, 1.0) == rows
    capped = {r["candidate_id"]: r for r in cap_partial(rows, 0.5)}
    assert [c for c, r in capped.items() if r["verdict"] == "accepted"] == ["s1", "p1"]
    assert capped["p2"]["reason"].startswith("partial cap: the round's partial share 0.75 is above")
    assert capped["p3"]["reason"].startswith("partial cap: the round's partial share 0.67")
    assert partial_share(list(capped.values())) == 0.5
    none_left = cap_partial(rows, 0.0)
    assert [r["candidate_id"] for r in none_left if r["verdict"] == "accepted"] == ["s1"]
    summary = summarize_candidates(to_table("candidates", [dict(r, run_id="t") for r in capped.values()]))
    assert summary["partial_share"] == 0.5 and summary["accepted_by_pass_kind"] == {"partial": 1, "success": 1}
    assert summary["rejections"]["partial cap"] == 2


def test_validator_settings_are_checked():
    with pytest.raises(ConfigError, match="max_partial_share"):
        load_config(None, {"validate.max_partial_share": 1.5})
    with pytest.raises(ConfigError, match="contamination_threshold"):
        load_config(None, {"validate.contamination_threshold": 0})
