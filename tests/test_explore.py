"""Exploration: contexts from signals, coverage and the cold-start fallback, the rule / random
explorers (same budget, no reference reading), the explore stage."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.dataset as ds
import pytest

from coevolve.config import load_config
from coevolve.envs.base import Observation
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.explore import (
    ExploreContext,
    coverage_contexts,
    explore,
    round_contexts,
    observed_error,
    pattern_names,
    run_sessions,
    signal_contexts,
    start_task,
    with_attempts,
)
from coevolve.explorers.random import RandomExplorer
from coevolve.explorers.rule import RuleExplorer
from coevolve.roles import fits, param_roles
from coevolve.values import ValuePool

AVOID = frozenset({"rm", "rmdir"})


@pytest.fixture(scope="module")
def env():
    return BfclEnvironment()


@pytest.fixture(scope="module")
def tasks(env):
    return env.load_tasks(["multi_turn_base"], limit=12)


def test_pattern_names_read_both_pattern_forms():
    assert pattern_names("cd > mv") == ["cd", "mv"]
    assert pattern_names("cd(folder) > mv(destination,source) > ls()") == ["cd", "mv", "ls"]
    assert pattern_names("") == []


def test_observed_error_sees_errors_backends_return_instead_of_raising(env):
    assert observed_error(Observation('{"error": "cd: x: No such directory"}'), env) == "cd: x: No such directory"
    assert observed_error(Observation("boom", error="TypeError: bad"), env) == "TypeError: bad"
    assert observed_error(Observation('{"current_working_directory": "document"}'), env) is None
    assert observed_error(Observation("None"), env) is None
    assert observed_error(Observation('{"error": "x"}')) is None  # without the environment: only obs.error


def test_params_read_enums_from_bfcl_descriptions(env, tasks):
    docs = {d["name"]: d for d in env.function_docs(env.load_tasks(ids=["multi_turn_base_50"])[0])}
    start = {p.name: p for p in param_roles(docs["startEngine"], env.value_roles())}
    assert start["ignitionMode"].enum == ("START", "STOP") and start["ignitionMode"].required
    travel = {d["name"]: d for d in env.function_docs(env.load_tasks(ids=["multi_turn_base_150"])[0])}
    currency = {p.name: p for p in param_roles(travel["compute_exchange_rate"], env.value_roles())}
    assert "USD" in currency["base_currency"].enum  # an enum listed without brackets: "[Enum]: USD, RMB, EUR"
    assert fits(["a", "b"], "array") and not fits(True, "integer") and fits(1, "float")


def test_signal_contexts_take_focus_from_the_failed_attempt_never_the_reference(tasks):
    t0, t1 = tasks[0], tasks[1]
    evidence = {
        "e1": [{"task_id": t0.task_id, "action_name": "ls", "action_args": "{}", "observation": "{}", "error": None}]
    }
    signals = [
        {
            "signal_id": "f1",
            "signal_type": "forgetting",
            "task_id": t0.task_id,
            "evidence": json.dumps({"failing_episode_id": "e1"}),
        },
        {
            "signal_id": "r1",
            "signal_type": "rare",
            "task_id": None,
            "pattern": "cd > mkdir",
            "evidence": json.dumps({"task_ids": [t1.task_id], "episode_ids": ["e9"]}),
        },
        {"signal_id": "gone", "signal_type": "boundary", "task_id": "not_in_pool", "evidence": "{}"},
    ]
    ctx = {c.signal_id: c for c in signal_contexts(signals, [t0, t1], evidence, AVOID)}
    assert set(ctx) == {"f1", "r1"}  # a signal whose task left the pool cannot be explored
    assert ctx["f1"].focus == ["ls"]  # what the failing episode called; not the task's reference calls
    assert ctx["f1"].evidence[0]["action_name"] == "ls"
    assert ctx["r1"].task.task_id == t1.task_id and ctx["r1"].focus == ["cd", "mkdir"] and ctx["r1"].sequence
    # no call in the failed attempt: the task's tools
    quiet = [{"signal_id": "b1", "signal_type": "boundary", "task_id": t0.task_id, "evidence": "{}"}]
    (b1,) = signal_contexts(quiet, [t0], {}, AVOID)
    assert b1.focus == [t for t in t0.tools if t not in AVOID]


def test_value_pool_files_folders_and_fresh_results(env):
    pool = ValuePool(env.value_roles())
    pool.harvest({"root": {"a": {"type": "directory", "contents": {"x.txt": {"type": "file", "content": "hi"}}}}})
    assert pool.by_role["dir"] == ["a"] and pool.by_role["file"] == ["x.txt"]
    pool.harvest({"current_directory_content": ["y.txt", "a"]}, "result", function="ls")
    assert ("node", "y.txt") in pool.fresh and pool.source("node", "y.txt") == "result"


def _context(task, signal_type="boundary", focus=None, sequence=False):
    focus = focus if focus is not None else [c["name"] for turn in task.reference_actions for c in turn]
    return ExploreContext(
        f"s-{task.task_id}-{signal_type}", signal_type, task, list(dict.fromkeys(focus)), sequence=sequence, avoid=AVOID
    )


def test_rule_explorer_adapts_to_errors_and_reuses_observed_values(env, tasks):
    sessions = run_sessions(RuleExplorer(), [_context(t) for t in tasks], env, runs=2, steps=6, seed=0)
    assert len(sessions) == 24 and all(len(s.history) == 6 for s in sessions)
    ok = [h for s in sessions for h in s.history if h.error is None]
    assert len(ok) >= 0.4 * 24 * 6  # guided by the state and the observations, most calls work
    for s in sessions:
        failed: dict[tuple, int] = {}
        for i, h in enumerate(s.history):
            key = (h.name, json.dumps(h.arguments, sort_keys=True))
            # a call that failed is repeated with the same arguments only once, right after a
            # call its error pointed at (a precondition): otherwise it reacts with other values
            if h.error and key in failed:
                assert failed[key] == 1 and s.history[i - 2].name == h.name and s.history[i - 1].name != h.name
            if h.error:
                failed[key] = failed.get(key, 0) + 1
        assert all(h.name not in AVOID for h in s.history)
    # values observed during the run (not in the start state) are reused in later calls
    reused = 0
    for s in sessions:
        start = json.dumps(s.context.task.initial_state)
        seen: set = set()
        for h in s.history:
            reused += any(isinstance(v, str) and v in seen and v not in start for v in h.arguments.values())
            if h.error is None:
                seen |= {v for v in h.arguments.values() if isinstance(v, str)}
    assert reused > 0


def test_rule_explorer_performs_a_rare_pattern_consecutively(env, tasks):
    task = tasks[0]  # cd(document), mkdir(temp), mv(...) ...
    ctx = _context(task, "rare", ["cd", "mkdir"], sequence=True)
    sessions = run_sessions(RuleExplorer(), [ctx], env, runs=4, steps=5, seed=1)
    done = 0
    for s in sessions:
        names = [h.name for h in s.history if h.error is None]
        done += any(names[i : i + 2] == ["cd", "mkdir"] for i in range(len(names) - 1))
    assert done >= 2


def test_runs_are_independent_fresh_episodes(env, tasks):
    ctx = _context(tasks[0])
    a, b = run_sessions(RuleExplorer(), [ctx], env, runs=2, steps=4, seed=3)
    assert a.episode is not b.episode
    again = run_sessions(RuleExplorer(), [ctx], env, runs=2, steps=4, seed=3)
    assert [(h.name, h.arguments) for h in again[0].history] == [(h.name, h.arguments) for h in a.history]


def test_start_task_makes_every_function_available_from_the_start(env):
    task = env.load_tasks(["multi_turn_miss_func"], limit=1)[0]
    assert task.initial_state["missed_function"]
    start = start_task(task)
    assert start.initial_state["missed_function"] == {} and task.initial_state["missed_function"]


# ----------------------------------------------------------------------------- the stage
def test_explore_stage_writes_one_row_per_step_and_reruns_replace(signal_store, tasks):
    store = signal_store(tasks[:6])
    cfg = load_config(
        overrides={"store": store.uri, "run_name": "t", "explore.runs_per_context": 2, "explore.steps_per_run": 3}
    )
    n = explore(store, cfg, "t", 1)
    assert n == 6 * 2 * 3
    assert explore(store, cfg, "t", 1) == n
    rows = store.read("explorations", filter=ds.field("round") == 1).to_pylist()
    assert len(rows) == n  # the rerun replaced its part
    assert Counter(r["signal_type"] for r in rows) == {"forgetting": 12, "boundary": 12, "rare": 12}
    assert {r["context_task_id"] for r in rows} == {t.task_id for t in tasks[:6]}


def test_random_explorer_has_the_same_budget_and_ignores_signals(signal_store, tasks):
    store = signal_store(tasks[:6])
    cfg = load_config(
        overrides={
            "store": store.uri,
            "run_name": "t",
            "explore.explorer": "random",
            "explore.runs_per_context": 2,
            "explore.steps_per_run": 3,
        }
    )
    assert explore(store, cfg, "t", 1) == 6 * 2 * 3
    rows = store.read("explorations").to_pylist()
    assert {r["signal_type"] for r in rows} == {"random"}
    assert all(r["signal_id"].startswith("random-") for r in rows)
    assert isinstance(RandomExplorer(), RuleExplorer) and not RandomExplorer.signal_guided


def _budget(rows):
    """Contexts, runs per context and steps per run of a round's explorations rows."""
    runs = Counter((r["signal_id"], r["run_idx"]) for r in rows)
    contexts = {s for s, _ in runs}
    return len(contexts), Counter(Counter(s for s, _ in runs).values()), Counter(runs.values())


@pytest.mark.parametrize("n_signals", [2, 6])
def test_random_and_signal_guided_exploration_get_equal_budgets(signal_store, tasks, n_signals):
    """The ablation baseline is fair: same contexts (with or without the cold-start fallback),
    same runs per context, same steps per run; only where and what differs."""
    budgets = {}
    for explorer in ("rule", "random"):
        store = signal_store(tasks[:n_signals])
        cfg = load_config(
            overrides={
                "store": store.uri,
                "run_name": "t",
                "explore.explorer": explorer,
                "explore.contexts": 5,
                "explore.min_contexts": 3,
                "explore.runs_per_context": 2,
                "explore.steps_per_run": 4,
            }
        )
        explore(store, cfg, "t", 1)
        budgets[explorer] = _budget(store.read("explorations").to_pylist())
    # 2 signals + 3 fallback contexts, or 6 signals cut to the budget: 5 contexts either way
    assert budgets["rule"] == budgets["random"] == (5, Counter({2: 5}), Counter({4: 10}))


def test_random_explorer_retries_after_an_error_like_the_rule_explorer(env, tasks):
    class AlwaysRetry(RandomExplorer):
        p_retry = 1.0
        p_prereq = 0.0  # no precondition detour: the failed function itself comes next

    after_error = []
    for seed in range(10):  # values of the right role fail rarely: find runs where something failed
        (s,) = run_sessions(AlwaysRetry(), [_context(tasks[0], "random", focus=[])], env, runs=1, steps=24, seed=seed)
        after_error += [(a, b) for a, b in zip(s.history, s.history[1:]) if a.error and a.name]
    # the failed function again, unless no other values of its roles are left to try it with
    assert after_error and sum(b.name == a.name for a, b in after_error) >= 0.7 * len(after_error)


def test_cold_start_fallback_fills_the_budget_with_coverage_contexts(signal_store, tasks):
    store = signal_store(tasks[:1])  # one signal: fewer than explore.min_contexts
    cfg = load_config(
        overrides={
            "store": store.uri,
            "run_name": "t",
            "explore.contexts": 6,
            "explore.min_contexts": 2,
            "explore.runs_per_context": 1,
            "explore.steps_per_run": 3,
        }
    )
    contexts = round_contexts(store, cfg, "t", 1, signal_guided=True)
    assert [c.signal_type for c in contexts] == ["forgetting"] + ["fallback"] * 5
    # a fallback context on a task the policy attempted in the round's training carries that attempt
    attempted = {r["task_id"] for r in store.read("rollouts").to_pylist() if r["phase"] == "train" and r["round"] == 1}
    assert all(c.coverage and bool(c.evidence) == (c.task.task_id in attempted) for c in contexts[1:])
    explore(store, cfg, "t", 1)
    rows = store.read("explorations").to_pylist()
    assert Counter(r["signal_type"] for r in rows) == {"forgetting": 3, "fallback": 15}
    # enough signals: no fallback
    many = signal_store(tasks[:4])
    assert {
        c.signal_type
        for c in round_contexts(many, cfg.__class__.from_dict({**cfg.to_dict(), "store": many.uri}), "t", 1, True)
    } == {"forgetting", "boundary", "rare"}


def test_coverage_contexts_reach_every_tool_of_a_state(env):
    import random

    states = env.training_states([], 0, ["multi_turn_base"])[:3]
    contexts = coverage_contexts(states, 6, random.Random(0), AVOID, "static")
    for state in states:
        focus = [f for c in contexts if c.task is state for f in c.focus]
        assert sorted(focus) == sorted(t for t in state.tools if t not in AVOID)  # a partition of its tools
    sessions = run_sessions(RuleExplorer(), contexts, env, runs=1, steps=36, seed=0)
    reached = [len({h.name for h in s.history if h.error is None} & set(s.context.focus)) for s in sessions]
    assert all(reached) and sum(reached) >= 0.4 * sum(len(c.focus) for c in contexts)  # most tools are reached


@pytest.mark.parametrize("explorer", [RuleExplorer, RandomExplorer])
def test_explorers_never_read_turns_or_reference_calls(env, explorer):
    """A context task whose turns and reference calls hold sentinels: no step carries one."""
    state = env.training_states([], 0, ["multi_turn_base"])[0]
    sentinel = "SENTINEL_3f9c"
    state.turns = [f"{sentinel} question"]
    state.reference_actions = [
        [
            {"name": "mkdir", "arguments": {"dir_name": sentinel}},
            {"name": "echo", "arguments": {"content": sentinel, "file_name": f"{sentinel}.txt"}},
        ]
    ]
    ctx = ExploreContext("s", "boundary", state, ["mkdir", "echo"], avoid=AVOID)
    sessions = run_sessions(explorer(), [ctx], env, runs=4, steps=10, seed=0)
    assert all(s.context.task.turns == [""] and s.context.task.reference_actions == [[]] for s in sessions)
    text = json.dumps([[(h.name, h.arguments, h.observation) for h in s.history] for s in sessions])
    assert sentinel not in text and '"mkdir"' in text


def test_cold_start_contexts_explore_outward_from_the_policys_own_attempt(env, tasks):
    task = start_task(tasks[0])
    attempt = [
        {"action_name": "cd", "action_args": '{"folder": "document"}', "observation": "{}", "error": None},
        {"action_name": "cd", "action_args": '{"folder": "city 72"}', "observation": "", "error": "No such folder"},
        {"action_name": "ls", "action_args": "{}", "observation": "{}", "error": None},
    ]
    cold = ExploreContext("fallback-0000", "fallback", task, ["mkdir", "touch"], avoid=AVOID, coverage=True)
    signal = ExploreContext("b1", "boundary", task, ["mkdir"], evidence=[attempt[0]], avoid=AVOID)
    led, same = with_attempts([cold, signal], {task.task_id: attempt})
    assert led.evidence == attempt and led.focus == ["cd", "ls", "mkdir", "touch"]  # what it called, then coverage
    assert same is signal  # a signal's context keeps its own evidence

    class AlwaysReplay(RuleExplorer):
        p_replay = 1.0

    sessions = run_sessions(AlwaysReplay(), [led], env, runs=4, steps=5, seed=0)
    for s in sessions:  # the attempt's calls that worked come first; the failed one is never made again
        assert (s.history[0].name, s.history[0].arguments) == ("cd", {"folder": "document"})
        assert s.history[0].error is None
        assert all(h.arguments != {"folder": "city 72"} for h in s.history)
    assert any(len(s.history) > 1 and s.history[1].name == "ls" for s in sessions)
