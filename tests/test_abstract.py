"""Abstraction: runs -> task specs (template and llm abstractors), candidates rows."""

from __future__ import annotations

import json
import re

import pytest

from coevolve.abstract import (
    LLMAbstractor,
    Run,
    abstract,
    check_spec,
    make_task,
    split_turns,
)
from coevolve.abstractors.goals import GOALS
from coevolve.abstractors.template import TemplateAbstractor, clause
from coevolve.config import load_config
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.explore import explore, start_task
from coevolve.policy.base import Generation
from coevolve.tasks import Task


@pytest.fixture(scope="module")
def env():
    return BfclEnvironment()


@pytest.fixture(scope="module")
def seed(env):
    # the state of scenario 0 (a file system with workspace/document/final_report.pdf, and Twitter)
    return start_task(env.training_states([], 0, ["multi_turn_base"])[0])


def _run(seed, env, steps):
    rows = [
        {"step": i, "action_name": n, "action_args": json.dumps(a), "observation": o, "error": e}
        for i, (n, a, o, e) in enumerate(steps)
    ]
    return Run("s1", "boundary", 0, seed, rows, {d["name"]: d for d in env.function_docs(seed)})


def test_split_turns_is_contiguous_and_even():
    calls = [{"name": str(i), "arguments": {}} for i in range(5)]
    assert [len(t) for t in split_turns(calls, 3)] == [2, 2, 1]
    assert [len(t) for t in split_turns(calls[:2], 3)] == [1, 1]
    assert sum(split_turns(calls, 3), []) == calls


def test_successful_calls_drop_errors_and_keep_order(env, seed):
    run = _run(
        seed,
        env,
        [
            ("cd", {"folder": "nope"}, '{"error": "no"}', "no"),
            ("cd", {"folder": "document"}, "{}", None),
            ("cd", {"folder": "document"}, "{}", None),
            (None, {}, "garbage", "no call"),
            ("mkdir", {"dir_name": "temp"}, "None", None),
        ],
    )
    assert run.successful_calls() == [
        {"name": "cd", "arguments": {"folder": "document"}},
        {"name": "cd", "arguments": {"folder": "document"}},
        {"name": "mkdir", "arguments": {"dir_name": "temp"}},
    ]


def _ok(name, args, obs="{}"):
    return (name, args, obs, None)


def test_template_states_goals_not_calls(env, seed):
    run = _run(
        seed,
        env,
        [
            _ok("cd", {"folder": "document"}),
            _ok("mkdir", {"dir_name": "temp"}),
            _ok("mv", {"source": "final_report.pdf", "destination": "temp"}),
        ],
    )
    ((turns, reference),) = TemplateAbstractor(load_config()).abstract([run])
    # one goal (the navigation leads to it, the move acts on the new folder): one turn
    (turn,) = turns  # one phrasing of the goal, opened as a person would
    assert "go into document, create a folder named temp and move final_report.pdf to temp" in turn.lower()
    assert reference == [[c for c in run.successful_calls()]]
    assert "set to" not in turns[0]  # no call dictation ("with dir_name set to 'temp'")
    assert (
        clause({"name": "wc", "arguments": {"file_name": "a.txt", "mode": "w"}}, run.docs["wc"])
        == "tell me how many words a.txt has"
    )
    # a value no template mentions is still stated
    assert (
        clause({"name": "ls", "arguments": {"a": True}}, run.docs["ls"])
        == "list the current folder, hidden items included"
    )
    assert TemplateAbstractor(load_config()).abstract([_run(seed, env, [("cd", {"folder": "x"}, "e", "e")])]) == [
        "useless run: no call succeeded"
    ]


def test_template_drops_calls_that_change_nothing_and_collapses_repeats(env, seed):
    run = _run(
        seed,
        env,
        [
            _ok("ls", {}),  # a look around: changes nothing, answers nothing
            _ok("pwd", {}),
            _ok("cd", {"folder": "document"}),
            _ok("cat", {"file_name": "final_report.pdf"}),  # an answer: kept
            _ok("cat", {"file_name": "final_report.pdf"}),  # the same answer again: collapsed
            _ok("echo", {"content": "hi", "file_name": "notes.txt"}),
            _ok("echo", {"content": "hi", "file_name": "notes.txt"}),  # writes what is there: a no-op
            _ok("ls", {}),
        ],
    )
    ((turns, reference),) = TemplateAbstractor(load_config()).abstract([run])
    calls = [(c["name"], c["arguments"]) for turn in reference for c in turn]
    assert calls == [
        ("cd", {"folder": "document"}),
        ("cat", {"file_name": "final_report.pdf"}),
        ("echo", {"content": "hi", "file_name": "notes.txt"}),
    ]
    text = " ".join(turns).lower()
    assert "show me what final_report.pdf contains" in text and "write hi into notes.txt" in text
    only_looking = _run(seed, env, [_ok("ls", {}), _ok("pwd", {})])
    assert TemplateAbstractor(load_config()).abstract([only_looking]) == [
        "useless run: no call changed the state or produced an answer"
    ]


def test_template_splits_turns_at_goal_boundaries(env, seed):
    steps = [
        _ok("cd", {"folder": "document"}),
        _ok("mkdir", {"dir_name": "temp"}),
        _ok("cd", {"folder": ".."}),
        _ok("touch", {"file_name": "todo.txt"}),
        _ok("authenticate_twitter", {"username": "analyst_pro", "password": "Kj8#mP9$vL2"}),
    ]
    ((turns, reference),) = TemplateAbstractor(load_config(overrides={"abstract.max_turns": 3})).abstract(
        [_run(seed, env, steps)]
    )
    assert [[c["name"] for c in t] for t in reference] == [["cd", "mkdir"], ["cd", "touch"], ["authenticate_twitter"]]
    assert "go into the parent folder and create an empty file named todo.txt" in turns[1].lower()
    assert "log in to twitter as analyst_pro with password 'kj8#mp9$vl2'" in turns[2].lower()
    assert "(" not in " ".join(turns)  # no "(key: value)" appendix
    one = load_config(overrides={"abstract.max_turns": 1})
    ((turns, reference),) = TemplateAbstractor(one).abstract([_run(seed, env, steps)])
    # one turn: the two file-system goals merge; the Twitter login (another backend) is dropped
    assert len(turns) == 1 and [c["name"] for c in reference[0]] == ["cd", "mkdir", "cd", "touch"]
    assert len(re.split(r"(?<=[.?]) ", turns[0])) == 2 and " Then " not in turns[0] and "Twitter" not in turns[0]


def test_a_value_said_as_a_reference_replaces_the_noun_before_it():
    doc = {"name": "message_login", "description": "", "parameters": {"properties": {"user_id": {"type": "string"}}}}
    call = {"name": "message_login", "arguments": {"user_id": "USR006"}}
    assert clause(call, doc) == "log in to messaging as user USR006"
    assert clause(call, doc, lambda p, v: "that user") == "log in to messaging as that user"
    assert clause(call, doc, lambda p, v: "Molly's id") == "log in to messaging as user Molly's id"
    flight = {"name": "get_flight_cost", "arguments": {"travel_class": "economy", "travel_from": "SFO"}}
    assert clause(flight, {}).startswith("tell me what an economy flight from SFO")


def test_lists_read_as_a_person_says_them():
    doc = {"name": "lockDoors", "description": "", "parameters": {"properties": {}}}
    call = {"name": "lockDoors", "arguments": {"door": ["passenger", "rear_right"], "unlock": False}}
    assert clause(call, doc) == "lock the passenger and rear right doors"


def test_goal_templates_cover_every_bfcl_function():
    from coevolve.envs import bfcl_data

    names = {d["name"] for c in bfcl_data.CLASSES for d in bfcl_data.class_docs(c)}
    assert names == set(GOALS)
    assert {g.kind for g in GOALS.values()} == {"do", "answer", "read", "nav"}


def test_make_task_keeps_provenance_and_the_seed_state(env, seed):
    run = _run(seed, env, [("cd", {"folder": "document"}, "{}", None)])
    task = make_task(run, ["Go to document."], [[{"name": "cd", "arguments": {"folder": "document"}}]], "t", 3)
    assert (task.origin, task.signal_type, task.seed_task_id, task.created_round, task.split) == (
        "explored",
        "boundary",
        seed.task_id,
        3,
        "train",
    )
    assert task.category == seed.category and task.env == seed.env and task.initial_state == seed.initial_state
    assert task.task_id.startswith(seed.task_id + "~x3.") and Task.from_json(task.to_json()) == task


class ScriptedPolicy:
    """Replies with the given texts in order (or raises), like an endpoint would."""

    def __init__(self, texts):
        self.texts = list(texts)

    def chat(self, conversations, tools, sampling, meta=None):
        if isinstance(self.texts[0], Exception):
            raise self.texts[0]
        out, self.texts = self.texts[: len(conversations)], self.texts[len(conversations) :]
        return [Generation(text=t, prompt_tokens=1, completion_tokens=1) for t in out]


def test_llm_abstractor_checks_the_schema_and_rejects_with_reasons(env, seed):
    run = _run(
        seed, env, [("cd", {"folder": "document"}, "{}", None), ("ls", {}, '{"current_directory_content": []}', None)]
    )
    good = json.dumps(
        {
            "turns": [
                {"instruction": "Go into document.", "calls": [{"name": "cd", "arguments": {"folder": "document"}}]},
                {"instruction": "List it.", "calls": [{"name": "ls", "arguments": {}}]},
            ]
        }
    )
    replies = [
        "Sure! ```json\n" + good + "\n```",
        "I cannot do that.",
        '{"turns": [{"instruction": "x", "calls": [{"name": "format_disk", "arguments": {}}]}]}',
        '{"turns": []}',
        '{"turns": [{"instruction": "", "calls": [{"name": "ls"}]}]}',
        '{"turns": [{"instruction": "x", "calls": [{"name": "ls", "arguments": "a=1"}]}]}',
        '{"turns": [{"instruction": "x", "calls": [{"name": "ls"',
    ]
    cfg = load_config(
        overrides={"abstract.abstractor": "llm", "abstract.base_url": "http://127.0.0.1:1/v1", "abstract.max_turns": 3}
    )
    out = LLMAbstractor(cfg, policy=ScriptedPolicy(replies)).abstract([run] * len(replies))
    turns, reference = out[0]
    assert turns == ["Go into document.", "List it."] and reference[1] == [{"name": "ls", "arguments": {}}]
    reasons = out[1:]
    assert all(isinstance(r, str) and r.startswith("llm abstractor: malformed output") for r in reasons)
    assert "no JSON object" in reasons[0] and "unknown function 'format_disk'" in reasons[1]
    assert "needs 1 to 3 turns" in reasons[2] and "non-empty 'instruction'" in reasons[3]
    assert "must be an object" in reasons[4]
    failing = LLMAbstractor(cfg, policy=ScriptedPolicy([ConnectionError("refused")])).abstract([run])
    assert failing[0].startswith("llm abstractor: endpoint error: ConnectionError")
    with pytest.raises(ValueError):
        check_spec({"turns": [{"instruction": "a", "calls": []}]}, run.docs, 3)


def test_abstract_stage_writes_pending_and_rejected_candidates(signal_store, env):
    tasks = env.load_tasks(["multi_turn_base"], limit=6)
    store = signal_store(tasks)
    cfg = load_config(overrides={"store": store.uri, "run_name": "t", "explore.steps_per_run": 3})
    explore(store, cfg, "t", 1)
    # one more run whose every call failed: a useless run, rejected at once
    first = min(store.read("explorations").to_pylist(), key=lambda r: (r["signal_id"], r["run_idx"], r["step"]))
    failed = {"cd": {"folder": "no_such_folder"}, "rm": {"file_name": "no_such_file"}}
    store.write(
        "explorations",
        1,
        "t-explore-failed",
        [
            {
                **first,
                "signal_id": "sfailed",
                "run_idx": 0,
                "step": i,
                "action_name": name,
                "action_args": json.dumps(args),
                "observation": '{"error": "no such item"}',
                "error": "no such item",
            }
            for i, (name, args) in enumerate(failed.items())
        ],
    )
    n = abstract(store, cfg, "t", 1)
    rows = store.read("candidates").to_pylist()
    assert n == len(rows) == 6 * 2 + 1
    explored = {f"t-r1-s{i:02d}-{k}" for i in range(6) for k in range(2)}
    assert {r["candidate_id"] for r in rows} == explored | {"t-r1-sfailed-0"}
    (rejected,) = [r for r in rows if r["candidate_id"] == "t-r1-sfailed-0"]
    assert rejected["verdict"] == "rejected" and rejected["reason"] == "useless run: no call succeeded", rejected
    assert rejected["n_turns"] == 0 and json.loads(rejected["spec"]) == {"error": rejected["reason"]}
    for r in rows:
        if r["verdict"] is None:
            task = Task.from_json(r["spec"])
            assert task.signal_type == r["signal_type"] and task.seed_task_id == r["context_task_id"]
            assert r["n_turns"] == len(task.turns) >= 1 and r["content_hash"] == task.content_hash
        else:
            assert r["verdict"] == "rejected" and r["reason"]
    assert any(r["verdict"] is None for r in rows)
    assert abstract(store, cfg, "t", 1) == n and store.read("candidates").num_rows == n
