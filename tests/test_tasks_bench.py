"""``coevolve bench tasks``: gate verdicts and shape figures of a hand-made BFCL pool, and the CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from coevolve.bench import tasks as tasks_bench
from coevolve.cli import app
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.explore import start_task
from coevolve.store import Store
from coevolve.bench.tasks import appears, bfcl_yardstick, pool_report, task_shape

runner = CliRunner()


@pytest.fixture(scope="module")
def env():
    return BfclEnvironment()


@pytest.fixture(scope="module")
def states(env):
    return {s.task_id: s for s in env.training_states([], 0, ["multi_turn_base"])}


def _task(states, state_id, task_id, turns, reference, created_round=0, split="train"):
    return dataclasses.replace(
        start_task(states[state_id]),
        task_id=task_id,
        turns=turns,
        reference_actions=reference,
        origin="explored",
        split=split,
        created_round=created_round,
        run_id="t",
    )


def _call(function, **arguments):
    return {"name": function, "arguments": arguments}


@pytest.fixture(scope="module")
def tasks(states):
    return {
        # scenario 0: workspace/{document, archive}; ls shows 'document', turn 1 goes into it
        "good": _task(
            states,
            "multi_turn_base_state_0",
            "good",
            ["What is in my workspace?", "Go into the document folder.", "Make a drafts folder there."],
            [[_call("ls")], [_call("cd", folder="document")], [_call("mkdir", dir_name="drafts")]],
            created_round=1,
        ),
        # a car (VehicleControlAPI): a schema-filler city, whose zip code comes back 00000
        "filler": _task(
            states,
            "multi_turn_base_state_50",
            "filler",
            ["What is the zip code of city 72?"],
            [[_call("get_zipcode_based_on_city", city="city 72")]],
        ),
        # TradingBot: 'Foo' is no company ("Stock not found"); turn 1 watches AAPL (a state change)
        "fail": _task(
            states,
            "multi_turn_base_state_100",
            "fail",
            ["Which symbol does Foo trade under?", "Show me Apple's figures and watch it."],
            [
                [_call("get_symbol_by_name", name="Foo")],
                [_call("get_stock_info", symbol="AAPL"), _call("add_to_watchlist", stock="AAPL")],
            ],
        ),
        # not a training task: left out of every figure
        "heldout": _task(
            states, "multi_turn_base_state_0", "heldout", ["Where am I?"], [[_call("pwd")]], split="heldout"
        ),
    }


@pytest.fixture
def store(tmp_path, tasks):
    st = Store(str(tmp_path / "store"))
    v1 = st.commit_pool(
        run_id="t",
        round_no=0,
        new_tasks=[tasks[k].to_row() for k in ("filler", "fail", "heldout")],
        expected_parent=None,
    )
    st.commit_pool(run_id="t", round_no=1, new_tasks=[tasks["good"].to_row()], expected_parent=v1.version)
    return st


def test_tokens_match_whole_values_only():
    text = '{"current_directory_content": ["document", "archive"], "id": 12, "price": 12.5}'
    assert appears("document", text) and appears("archive", text)
    assert not appears("doc", text) and not appears("documents", text)
    assert appears(12, text) and appears(12.5, text)
    assert not appears(1, text) and not appears(2, text) and not appears(12.0, '{"p": 12.5}')
    assert appears("it's", json.dumps({"a": "it's"})) and appears('say "hi"', json.dumps({"a": 'say "hi"'}))
    # small integers, one-character strings and bools never count as carried values
    assert list(tasks_bench._scalars({"a": [3, "x", True, None, "ok", 10, {"b": 7.5}]})) == ["ok", 10, 7.5]


def test_pool_figures(store, env):
    report = pool_report(store)
    assert report["pool_version"] == 2 and report["pool_tasks"] == 4
    assert report["left_out"] == {"split heldout": 1} and report["envs"] == ["bfcl-v3"]
    f = report["overall"]
    assert f["tasks"] == 3 and f["passing"] == 1 and f["passing_share"] == round(1 / 3, 4)
    # filler: filler + failing goal; fail: wrong role ('Foo' is no company) + failing goal
    assert f["rule_counts"] == {"filler": 1, "wrong role": 1, "failing goal": 2, "odd request": 0, "undone": 0}
    assert f["rule_shares"]["failing goal"] == round(2 / 3, 4)
    assert f["examples"]["filler"] == ["filler: filler: get_zipcode_based_on_city.city='city 72'"]
    assert f["turns_hist"] == {"1": 1, "2": 1, "3": 1, "4": 0, "5": 0, "6+": 0} and f["turns_mean"] == 2.0
    assert f["calls_hist"] == {"0": 0, "1": 5, "2": 1, "3": 0, "4+": 0}
    assert f["calls"] == 7 and f["calls_per_turn_mean"] == round(7 / 6, 4)
    # cd and mkdir change the file system, add_to_watchlist the watch list; ls, the lookups do not
    assert (f["changing_turns"], f["replayed_turns"], f["state_change_share"]) == (3, 6, 0.5)
    # cd's 'document' is what ls returned; nothing else carries an earlier result
    assert (f["reusing_calls"], f["replayed_calls"], f["replay_errors"]) == (1, 7, 0)
    offered = {d["name"] for k in ("good", "filler", "fail") for d in env.function_docs(store_task(store, k))}
    assert f["functions_offered"] == len(offered) and f["functions_used"] == 7
    assert set(f["unused_functions"]) == offered - {
        "ls", "cd", "mkdir", "get_zipcode_based_on_city", "get_symbol_by_name", "get_stock_info", "add_to_watchlist"
    }  # fmt: skip
    assert "pwd" in f["unused_functions"] and f["not_offered_functions"] == []
    # per created round
    r0, r1 = report["by_round"]["0"], report["by_round"]["1"]
    assert list(report["by_round"]) == ["0", "1"]
    assert (r0["tasks"], r0["passing"], r1["tasks"], r1["passing"]) == (2, 0, 1, 1)
    assert r1["turns_hist"]["3"] == 1 and (r1["changing_turns"], r1["reusing_calls"]) == (2, 1)
    assert (r0["changing_turns"], r0["reusing_calls"], r0["functions_used"]) == (1, 0, 4)


def store_task(store, task_id):
    from coevolve.tasks import Task

    return next(Task.from_row(r) for r in store.pool_tasks().to_pylist() if r["task_id"] == task_id)


def test_a_gate_that_raises_is_counted_not_fatal(store, monkeypatch):
    real = tasks_bench.task_problems

    def flaky(env, task):
        if task.task_id == "good":
            raise RuntimeError("boom")
        return real(env, task)

    monkeypatch.setattr(tasks_bench, "task_problems", flaky)
    f = pool_report(store)["overall"]
    assert f["passing"] == 0 and f["rule_counts"]["gate error"] == 1
    assert f["examples"]["gate error"] == ["good: gate error: RuntimeError: boom"]
    assert f["reusing_calls"] == 1  # the replay still ran


def test_an_episode_without_fingerprint_counts_every_turn_with_a_call(env, tasks):
    class Plain:  # an episode with only the contract's required methods
        def __init__(self, inner):
            self.inner = inner

        def user_message(self, turn):
            return self.inner.user_message(turn)

        def step(self, call):
            return self.inner.step(call)

        def end_turn(self):
            self.inner.end_turn()

    class PlainEnv:
        def __getattr__(self, name):
            return getattr(env, name)

        def episode(self, task):
            return Plain(env.episode(task))

    shape = task_shape(PlainEnv(), tasks["good"])
    assert shape.replayed and shape.changing_turns == 3 and shape.reusing_calls == 1
    assert task_shape(env, tasks["good"]).changing_turns == 2


def test_yardstick_reads_bfcl_ground_truth():
    ys = bfcl_yardstick(limit=10)
    f = ys["figures"]
    assert ys["entries"] == 10 and f["tasks"] == 10 and "examples" not in f
    assert f["turns_mean"] > 1.5 and f["calls"] > f["turns"] / 2
    assert 0 < f["state_change_share"] < 1 and f["replay_errors"] == 0


def test_cli_prints_and_writes_the_figures(store, tmp_path):
    out = tmp_path / "figures.json"
    res = runner.invoke(app, ["bench", "tasks", "--store", store.uri, "--no-yardstick", "--json", str(out)])
    assert res.exit_code == 0, res.output
    text = res.output
    assert "pool v2" in text and "3 training tasks" in text and "left out: 1 split heldout" in text
    line = next(ln for ln in text.splitlines() if "pass every rule" in ln)
    assert "1 (33%)" in line and "0 (0%)" in line and "1 (100%)" in line  # pool, round 0, round 1
    assert "50% (3/6)" in next(ln for ln in text.splitlines() if "changing the state" in ln)
    assert "14% (1/7)" in next(ln for ln in text.splitlines() if "reusing an earlier" in ln)
    assert "7/" in next(ln for ln in text.splitlines() if "functions used/offered" in ln)
    assert "BFCL-V3" not in text and "[filler] filler" in text
    assert json.loads(out.read_text())["overall"]["reusing_calls"] == 1
    # a bfcl-v3 pool gets the yardstick column by default
    res = runner.invoke(app, ["bench", "tasks", "--store", store.uri, "--yardstick-limit", "5"])
    assert res.exit_code == 0, res.output
    assert "BFCL-V3 base (5)" in res.output and "read for comparison only" in res.output


def test_cli_without_a_pool_fails_cleanly(tmp_path):
    (tmp_path / "empty").mkdir()
    res = runner.invoke(app, ["bench", "tasks", "--store", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "no committed pool" in res.output
