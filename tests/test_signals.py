"""Tests of coevolve.signals and sql/signals/*.sql: hand-built logs with planted signals and
near misses just outside each threshold; the runner (budget, is_new, ids, rewrites); the
pandas reference of the benchmark; the CLI."""

from __future__ import annotations

import itertools
import json

import pyarrow.dataset as ds
import pytest
from typer.testing import CliRunner

from coevolve.config import SignalsConfig
from coevolve.signals import mine_signals, run_queries, signal_id
from coevolve.bench.signals import canonical, compare
from coevolve.bench.signals_log import generate_log
from coevolve.bench.signals_pandas import pandas_signals
from coevolve.sql import connect
from coevolve.store import Store

RUN = "run"
_ids = itertools.count()


def episode(
    task: str,
    success: bool | None = False,
    *,
    round_no: int = 2,
    reward: float | None = None,
    actions: list[str | None] = ("a",),
    turns: list[int] | None = None,
    parse_errors: tuple[int, ...] = (),
    phase: str = "train",
    run: str = RUN,
    epoch: int | None = 0,
    train_step: int | None = 0,
    args: str | None = None,
) -> list[dict]:
    """Step rows of one episode; success and reward are repeated on every step, as logged."""
    eid = f"e{next(_ids):04d}"
    if reward is None and success is not None:
        reward = 1.0 if success else 0.0
    turns = turns or [0] * len(actions)
    rows = []
    for i, name in enumerate(actions):
        step = sum(1 for t in turns[:i] if t == turns[i])
        rows.append(
            dict(
                run_id=run,
                round=round_no,
                phase=phase,
                task_id=task,
                episode_id=eid,
                sample_idx=0,
                train_step=train_step,
                epoch=epoch,
                turn=turns[i],
                step=step,
                action_name=name,
                action_args=args,
                parse_error="bad json" if i in parse_errors else None,
                episode_reward=reward,
                success=success,
            )
        )
    return rows


def group(task: str, outcomes: list, **kw) -> list[dict]:
    """One episode per outcome (a success flag, or (success, reward))."""
    rows = []
    for o in outcomes:
        success, reward = o if isinstance(o, tuple) else (o, None)
        rows += episode(task, success, reward=reward, **kw)
    return rows


def make_store(tmp_path, rows: list[dict]) -> Store:
    store = Store(str(tmp_path / "store"))
    for r in sorted({row["round"] for row in rows}):
        store.write("rollouts", r, "log", [row for row in rows if row["round"] == r])
    return store


def found(store: Store, round_no: int = 2, **cfg) -> dict:
    return run_queries(connect(store), SignalsConfig(**cfg), RUN, round_no)


def keys(table, col: str = "task_id") -> set:
    return set(table.column(col).to_pylist())


# --------------------------------------------------------------------------- forgetting
@pytest.fixture
def forgetting_log(tmp_path):
    T, F = True, False
    rows = (
        group("forgot", [T] * 4, round_no=1)
        + group("forgot", [F] * 4, round_no=2)
        + group("half_before", [T, T, F, F], round_no=1)
        + group("half_before", [F] * 4)  # 0.5 counts
        # success near misses whose reward does not fall by 0.2 either
        + group("below_before", [T, F, F, F], round_no=1)
        + group("below_before", [(F, 0.1)] * 4)  # 0.25: miss
        + group("not_zero_now", [T] * 4, round_no=1)
        + group("not_zero_now", [T] + [(F, 0.9)] * 3)  # now 0.25: miss
        + group("within_round", [T] * 4, epoch=0, train_step=1)
        + group("within_round", [F] * 4, epoch=1, train_step=7)
        + group("one_sample", [T], round_no=1)
        + group("one_sample", [F])
        + group("one_round_only", [F] * 4)
        + group("all_fail", [F] * 4, round_no=1)
        + group("all_fail", [F] * 4)
        + group("null_now", [T] * 4, round_no=1)
        + group("null_now", [None] * 4)
        + group("stale", [T] * 4, round_no=1)  # not observed in round 2: nothing to say now
        + group("recovered", [T] * 4, round_no=1)
        + group("recovered", [F] * 4, epoch=0)
        + group("recovered", [T] * 4, epoch=1)
        + group("eval_leak", [T] * 4, round_no=1)
        + group("eval_leak", [T] * 4)
        + group("eval_leak", [F] * 4, phase="eval", epoch=None, train_step=None)
        + group("other_run", [T] * 4, round_no=1, run="other")
        + group("other_run", [F] * 4)
        + group("future", [T] * 4, round_no=1)
        + group("future", [F] * 4)
        + group("future", [T] * 4, round_no=3)
        # many steps per episode, all failing to parse: still episodes that failed
        + group("parse_errors", [T] * 2, round_no=1, actions=["a", "b"])
        + group("parse_errors", [F] * 2, actions=["a", "b"], parse_errors=(0, 1))
    )
    return make_store(tmp_path, rows)


def test_forgetting_recovers_exactly_the_planted_tasks(forgetting_log):
    got = found(forgetting_log)["forgetting"]
    assert keys(got) == {"forgot", "half_before", "within_round", "one_sample", "future", "parse_errors"}
    rec = {r["task_id"]: r for r in got.to_pylist()}
    assert rec["forgot"]["score"] == 1.0 and rec["half_before"]["score"] == 0.5
    assert (rec["forgot"]["success_drop"], rec["forgot"]["reward_drop"]) == (1.0, 1.0)
    assert (rec["forgot"]["before_rate"], rec["forgot"]["before_n"], rec["forgot"]["before_round"]) == (1.0, 4, 1)
    assert (rec["forgot"]["now_rate"], rec["forgot"]["now_n"]) == (0.0, 4)
    failing = forgetting_log.read("rollouts", filter=(ds.field("task_id") == "forgot") & (ds.field("round") == 2))
    assert rec["forgot"]["failing_episode_id"] == min(failing.column("episode_id").to_pylist())
    w = rec["within_round"]
    assert (w["before_round"], w["before_epoch"], w["before_step"], w["now_epoch"], w["now_step"]) == (2, 0, 1, 1, 7)
    assert rec["one_sample"]["before_n"] == rec["one_sample"]["now_n"] == 1
    assert got.column("score").to_pylist() == sorted(got.column("score").to_pylist(), reverse=True)


def test_forgetting_parameters(forgetting_log):
    assert "eval_leak" in keys(found(forgetting_log, phases=["train", "eval"])["forgetting"])
    assert "below_before" in keys(found(forgetting_log, forget_before_min=0.25)["forgetting"])
    assert "not_zero_now" in keys(found(forgetting_log, forget_now_max=0.25)["forgetting"])
    assert "below_before" in keys(found(forgetting_log, forget_reward_drop=0.15)["forgetting"])  # 0.25 -> 0.1
    # success drops alone: the same tasks (their rewards are 1 and 0)
    assert keys(found(forgetting_log, forget_reward_drop=2.0)["forgetting"]) == keys(
        found(forgetting_log)["forgetting"]
    )
    assert keys(found(forgetting_log, round_no=1)["forgetting"]) == set()
    assert "future" not in keys(found(forgetting_log, round_no=3)["forgetting"])


def test_forgetting_on_a_drop_in_reward(tmp_path):
    """A task the policy never solves is forgotten when its mean reward (partial credit)
    falls by >= forget_reward_drop against its best earlier round, epoch or step."""
    F = False
    rows = (
        group("reward_fell", [(F, 0.5)] * 4, round_no=1)
        + group("reward_fell", [(F, 0.25)] * 4)  # 0.25
        + group("at_threshold", [(F, 0.45)] * 4, round_no=1)
        + group("at_threshold", [(F, 0.25)] * 4)  # 0.2 exactly
        + group("just_under", [(F, 0.44)] * 4, round_no=1)
        + group("just_under", [(F, 0.25)] * 4)  # 0.19: miss
        + group("rose", [(F, 0.2)] * 4, round_no=1)
        + group("rose", [(F, 0.5)] * 4)  # miss
        + group("null_now", [(F, 0.6)] * 4, round_no=1)
        + group("null_now", [(None, None)] * 4)  # nothing to compare: miss
        # the small round of the embedded default: two GRPO steps of one epoch
        + group("within_round", [(F, 0.1), (F, 0.6), (F, 0.6), (F, 0.3)], epoch=0, train_step=0)
        + group("within_round", [(F, 0.1), (F, 0.1), (F, 0.35), (F, 0.1)], epoch=0, train_step=1)
        # against the best earlier point, not the latest earlier one
        + group("best_earlier", [(F, 0.6)] * 4, round_no=1)
        + group("best_earlier", [(F, 0.4)] * 4, epoch=0)
        + group("best_earlier", [(F, 0.35)] * 4, epoch=1)
        # both criteria hold: the larger drop is the score
        + group("both", [(True, 1.0), (True, 1.0), (F, 0.5), (F, 0.5)], round_no=1)
        + group("both", [(F, 0.1)] * 4)
    )
    got = found(make_store(tmp_path, rows))["forgetting"]
    assert keys(got) == {"reward_fell", "at_threshold", "within_round", "best_earlier", "both"}
    rec = {r["task_id"]: r for r in got.to_pylist()}
    fell = rec["reward_fell"]
    assert (fell["score"], fell["success_drop"], fell["reward_drop"]) == (0.25, None, 0.25)
    assert (fell["before_rate"], fell["now_rate"], fell["before_reward"], fell["now_reward"]) == (0.0, 0.0, 0.5, 0.25)
    w = rec["within_round"]
    assert (w["before_round"], w["before_step"], w["now_step"]) == (2, 0, 1) and w["score"] == pytest.approx(0.2375)
    b = rec["best_earlier"]
    assert (b["before_round"], b["before_reward"], b["score"]) == (1, 0.6, 0.25)
    both = rec["both"]
    assert (both["success_drop"], both["reward_drop"], both["score"]) == (0.5, 0.65, 0.65)
    assert keys(found(make_store(tmp_path / "again", rows), forget_reward_drop=0.3)["forgetting"]) == {"both"}


# --------------------------------------------------------------------------- boundary
@pytest.fixture
def boundary_log(tmp_path):
    T, F = True, False
    rows = (
        group("mixed", [T, T, F, F], actions=["a", "b", "c"])  # 3 steps per episode, 4 episodes
        + group("lopsided", [T, F, F, F])
        + group("three_samples", [T, F, F])  # miss: 3 < 4 samples
        + group("all_fail", [F] * 4)
        + group("all_success", [T] * 6)
        + group("partial", [(F, 0.0), (F, 0.0), (F, 0.5), (F, 0.5)])  # reward std 0.25
        + group("partial_low", [(F, 0.0), (F, 0.0), (F, 0.49), (F, 0.49)])  # std 0.245
        # never solved, rewards with partial credit: the boundary shows before any success
        + group("edge", [(F, 0.1), (F, 0.1), (F, 0.3), (F, 0.3)])  # std exactly 0.1
        + group("flat", [(F, 0.1), (F, 0.1), (F, 0.29), (F, 0.29)])  # std 0.095: miss
        + group("format_only", [(F, 0.1), (F, 0.0), (F, 0.1), (F, 0.1)])  # a format bonus here and there: miss
        + group("null_rewards", [(F, None)] * 4)
        + group("null_success", [(None, 0.0), (None, 1.0), (None, 0.0), (None, 1.0)])  # rewards still vary
        + group("half_null", [(T, 1.0), (F, 0.0), (None, None), (None, None)])  # 2 scored: miss
        + group("one_sample", [T])
        + group("earlier_round", [T, T, F, F], round_no=1)
        + group("across_steps", [T, T], epoch=0, train_step=0)
        + group("across_steps", [F, F], epoch=1, train_step=3)
        + group("eval_leak", [T] * 4)
        + group("eval_leak", [F] * 4, phase="eval", epoch=None, train_step=None)
        + group("other_run", [T] * 4)
        + group("other_run", [F] * 4, run="other")
        + group(None, [T, T, F, F])  # no task to explore from
    )
    return make_store(tmp_path, rows)


def test_boundary_recovers_exactly_the_planted_tasks(boundary_log):
    got = found(boundary_log)["boundary"]
    assert keys(got) == {"mixed", "lopsided", "partial", "partial_low", "edge", "null_success", "across_steps"}
    rec = {r["task_id"]: r for r in got.to_pylist()}
    assert (rec["mixed"]["score"], rec["mixed"]["n"], rec["mixed"]["rate"]) == (0.25, 4, 0.5)
    assert rec["lopsided"]["score"] == pytest.approx(0.1875)
    assert rec["partial"]["score"] == pytest.approx(0.0625) and rec["partial"]["rate"] == 0.0
    assert rec["edge"]["score"] == pytest.approx(0.01) and rec["edge"]["rate"] == 0.0
    assert rec["null_success"]["n_success"] == 0 and rec["null_success"]["score"] == pytest.approx(0.25)
    assert rec["across_steps"]["n"] == 4
    # the failing episode is one of the task's failures
    failing = boundary_log.read("rollouts", filter=(ds.field("task_id") == "mixed") & (ds.field("success") == False))  # noqa: E712
    assert rec["mixed"]["failing_episode_id"] == min(failing.column("episode_id").to_pylist())


def test_boundary_parameters(boundary_log):
    assert "three_samples" in keys(found(boundary_log, boundary_min_samples=3)["boundary"])
    assert "partial_low" in keys(found(boundary_log, boundary_reward_std=0.24)["boundary"])
    assert "partial_low" not in keys(found(boundary_log, boundary_reward_std=0.25)["boundary"])
    assert "partial" not in keys(found(boundary_log, boundary_reward_std=0.26)["boundary"])
    assert "flat" in keys(found(boundary_log, boundary_reward_std=0.09)["boundary"])
    assert "eval_leak" in keys(found(boundary_log, phases=["train", "eval"])["boundary"])
    assert keys(found(boundary_log, round_no=1)["boundary"]) == {"earlier_round"}


# --------------------------------------------------------------------------- rare
@pytest.fixture
def rare_log(tmp_path):
    """A small round as the embedded default logs it: 18 training episodes of 1-3 calls."""
    rows = []
    for i in range(6):
        rows += episode(f"t{i % 2}", actions=["ls", "cd"])  # ls > cd: 6 episodes, the most common
    for i in range(4):
        rows += episode(f"t{i % 2}", actions=["cd", "ls", "cat"])  # cd > ls, ls > cat: 4 each
    rows += episode("t0", actions=["mv", "cp"]) + episode("t1", actions=["mv", "cp"])  # planted: 2 episodes
    rows += episode("t0", actions=["g", None, "h"], turns=[0, 0, 1])
    rows += episode("t1", actions=["g", None, "h"], turns=[0, 0, 1])  # g > h across a turn and a no-call step
    rows += episode("t0", actions=["rm", "touch"])  # one episode only: near miss
    rows += episode("t1", actions=["grep", "sort", "grep", "sort"])  # grep > sort twice, but in one episode
    rows += episode("t0", actions=["echo", "wc"], parse_errors=(1,))  # wc failed to parse
    rows += episode("t1", actions=["echo", "wc"], parse_errors=(1,))
    rows += episode("t0", actions=["ev1", "ev2"], phase="eval") + episode("t1", actions=["ev1", "ev2"], phase="eval")
    rows += episode("t0", actions=["o1", "o2"], run="other") + episode("t1", actions=["o1", "o2"], run="other")
    rows += episode("t0", actions=["r1", "r2"], round_no=1) + episode("t1", actions=["r1", "r2"], round_no=1)
    total = 6 + 8 + 2 + 2 + 1 + 3
    return make_store(tmp_path, rows), total


def test_rare_is_relative_to_the_round(rare_log):
    """Candidates (>= 2 episodes) count 6, 4, 4, 2, 2: the lower quartile is 2."""
    store, total = rare_log
    got = found(store)["rare"]
    assert keys(got, "pattern") == {"mv > cp", "g > h"}
    rec = {r["pattern"]: r for r in got.to_pylist()}
    mv = rec["mv > cp"]
    assert (mv["n_occurrences"], mv["n_episodes"], mv["total"], mv["cutoff"], mv["actions"]) == (
        2,
        2,
        total,
        2,
        ["mv", "cp"],
    )
    assert mv["task_ids"] == ["t0", "t1"] and len(mv["episode_ids"]) == 2
    assert mv["score"] == pytest.approx(total / 2) and mv["share"] == pytest.approx(2 / total)
    # the old absolute cap (1% of all n-grams) would have found nothing in this round
    assert all(r["share"] > 0.01 for r in got.to_pylist())


def test_rare_parameters(rare_log):
    store, total = rare_log
    assert keys(found(store, rare_quantile=0.5)["rare"], "pattern") == {"mv > cp", "g > h", "cd > ls", "ls > cat"}
    # the most frequent candidate is never rare, whatever the quantile
    assert "ls > cd" not in keys(found(store, rare_quantile=1.0)["rare"], "pattern")
    assert keys(found(store, rare_min_total=total)["rare"], "pattern") == {"mv > cp", "g > h"}
    assert keys(found(store, rare_min_total=total + 1)["rare"], "pattern") == set()  # too few n-grams to say
    # one-off patterns as candidates: counts 6, 4, 4, 2, 2, 2, 1, 1; the quartile is 1
    assert keys(found(store, rare_min_episodes=1)["rare"], "pattern") == {"rm > touch", "sort > grep"}
    with_errors = keys(found(store, include_parse_errors=True)["rare"], "pattern")
    assert with_errors == {"mv > cp", "g > h", "echo > wc"}
    assert "ev1 > ev2" in keys(found(store, phases=["train", "eval"])["rare"], "pattern")
    unigrams = found(store, rare_n=1)["rare"]
    assert keys(unigrams, "pattern") == {"mv", "cp", "g", "h", "echo"}  # ls 10, cd 10, cat 4, these 2
    trigrams = keys(found(store, rare_n=3, rare_min_total=1, rare_quantile=0.5)["rare"], "pattern")
    assert trigrams == set()  # cd > ls > cat (4 episodes) is the only candidate, and the most frequent
    limited = found(store, evidence_limit=1)["rare"].to_pylist()
    assert all(len(r["task_ids"]) == 1 and len(r["episode_ids"]) == 1 for r in limited)
    assert keys(found(store, round_no=1, rare_min_total=0)["rare"], "pattern") == set()  # one candidate: the top


def test_rare_patterns_with_argument_keys(tmp_path):
    rows = []
    for i in range(2):
        rows += episode("t1", actions=["cd"], args='{"folder": "x", "a": 1}') + episode("t1", actions=["ls"], args="{}")
        rows += episode("t2", actions=["cd", "ls"], args='{"b": 2, "a": 1}')
        rows += episode("t3", actions=["cd", "ls"], args="not json")
    for i in range(3):  # the most frequent pattern, never rare
        rows += episode("t4", actions=["pwd", "ls"], args="{}")
    got = found(make_store(tmp_path, rows), rare_with_arg_keys=True, rare_quantile=1.0, rare_min_total=0)[
        "rare"
    ].to_pylist()
    assert {r["pattern"]: r["actions"] for r in got} == {
        "cd(a,b) > ls(a,b)": ["cd", "ls"],
        "cd() > ls()": ["cd", "ls"],
    }


def test_calls_of_functions_the_environment_lacks_are_no_rare_actions(rare_log, tmp_path):
    """A model that invents ``scale`` in two episodes repeats a pattern as rare as the planted
    mv > cp; it is no behaviour to explore (the environments' error: "unknown function ...")."""
    store, _ = rare_log
    rows = store.read("rollouts").to_pylist()
    invented = episode("t0", actions=["scale", "scale"]) + episode("t1", actions=["scale", "scale"])
    for r in invented:
        r["error"] = "unknown function 'scale'"
    mixed = make_store(tmp_path / "mixed", rows + invented)
    got = found(mixed)["rare"]
    assert keys(got, "pattern") == {"mv > cp", "g > h"}  # as without the invented calls
    # the same calls, had they reached a tool, would be a rare pattern of their own
    for r in invented:
        r["error"] = "scale: value out of range"
    real = make_store(tmp_path / "real", rows + invented)
    assert "scale > scale" in keys(found(real)["rare"], "pattern")
    # the pandas reference drops them too
    cfg = SignalsConfig()
    assert (
        compare(canonical(run_queries(connect(mixed), cfg, RUN, 2)), canonical(pandas_signals(mixed.root, cfg, RUN, 2)))
        == []
    )


# --------------------------------------------------------------------------- the runner
def test_mine_signals_budget_is_new_ids_and_rewrites(tmp_path):
    T, F = True, False
    round1 = (
        group("b1", [T, F, F, F], round_no=1)
        + group("b2", [T, T, F, F], round_no=1)
        + group("b3", [T, T, F, F], round_no=1)
    )
    round1 += group("b0", [T, T, F, F], round_no=1) + group("f1", [T] * 4, round_no=1)
    round2 = group("b2", [T, T, F, F]) + group("b3", [T] * 4) + group("b4", [T, T, F, F]) + group("f1", [F] * 4)
    store = make_store(tmp_path, round1 + round2)
    cfg = SignalsConfig(budget_per_type=3)

    first = mine_signals(store, cfg, RUN, 1)
    assert first.column("task_id").to_pylist() == ["b0", "b2", "b3"]  # ties by task id; b1 ranks below
    assert first.column("rank").to_pylist() == [1, 2, 3] and all(first.column("is_new").to_pylist())
    assert first.column("signal_id").to_pylist()[0] == signal_id(1, "boundary", "b0")

    second = mine_signals(store, cfg, RUN, 2)
    rows = [(r["signal_type"], r["task_id"], r["is_new"]) for r in second.to_pylist()]
    # b3 no longer holds: not emitted again; b2 still holds: emitted, not new
    assert rows == [("forgetting", "f1", True), ("boundary", "b2", False), ("boundary", "b4", True)]
    evidence = json.loads(second.to_pylist()[0]["evidence"])
    assert evidence["before_rate"] == 1.0 and evidence["now_rate"] == 0.0 and evidence["failing_episode_id"]

    again = mine_signals(store, cfg, RUN, 2)
    assert again.equals(second)
    stored = store.read("signals", filter=ds.field("round") == 2)
    assert stored.num_rows == 3 and len(set(stored.column("signal_id").to_pylist())) == 3
    assert mine_signals(store, SignalsConfig(budget_per_type=0), RUN, 2).num_rows == 0


def test_a_small_round_mines_every_kind_with_the_defaults(tmp_path):
    """The embedded default's round: 2 GRPO steps x 2 tasks x 4 samples = 16 episodes of 1-3
    calls, rewards with partial credit (progress x 0.5 + a format bonus), almost no success."""
    T, F = True, False

    def step(task, train_step, rewards, actions, round_no):
        rows = []
        for r, a in zip(rewards, actions):
            success, reward = (T, 1.0) if r == 1.0 else (F, r)
            rows += episode(task, success, reward=reward, actions=a, round_no=round_no, train_step=train_step)
        return rows

    four = lambda a: [a] * 4  # noqa: E731
    rows = (
        step("A", 0, [0.6, 0.6, 1.0, 0.35], four(["ls"]), 1)
        + step("B", 0, [0.1, 0.1, 0.0, 0.1], four(["ls"]), 1)
        + step("C", 1, [0.1] * 4, four(["ls"]), 1)
        + step("D", 1, [1.0] * 4, four(["ls"]), 1)
        # round 2
        + step("A", 0, [0.1, 0.35, 0.1, 0.6], [["ls", "cd"], ["ls", "cd", "cat"], ["ls", "cd"], ["ls", "cd"]], 2)
        + step("C", 0, [0.1] * 4, [["pwd", "ls"]] * 3 + [["pwd"]], 2)
        + step("B", 1, [0.0] * 4, [["mkdir", "cd"]] * 2 + [["mkdir"]] * 2, 2)
        + step("D", 1, [1.0, 1.0, 1.0, 0.6], [["cd", "cat"]] * 2 + [["cat"]] * 2, 2)
    )
    store = make_store(tmp_path, rows)
    table = mine_signals(store, SignalsConfig(), RUN, 2)
    got = {(r["signal_type"], r["task_id"] or r["pattern"]) for r in table.to_pylist()}
    # A: mean reward 0.64 -> 0.29 and a reward std of 0.21; D: 3 of 4 solved; mkdir > cd: the
    # least frequent of the patterns seen twice (counts 4, 3, 3, 2 of 12 bigrams)
    assert got == {("forgetting", "A"), ("boundary", "A"), ("boundary", "D"), ("rare", "mkdir > cd")}


def test_mine_signals_on_an_empty_store(tmp_path):
    assert mine_signals(Store(str(tmp_path / "empty")), SignalsConfig(), RUN, 1).num_rows == 0


def test_mine_signals_over_s3(s3_endpoint, s3_bucket):
    store = Store(f"s3://{s3_bucket}/cv", endpoint_url=s3_endpoint)
    rows = group("b", [True, True, False, False]) + episode("x", actions=["x", "y"]) + episode("y", actions=["x", "y"])
    rows += group("c", [True] * 3, actions=["a", "b", "a", "b", "a"])
    for r in (1, 2):
        store.write("rollouts", r, "log", [row | {"round": r} for row in rows])
    table = mine_signals(store, SignalsConfig(), RUN, 2)
    assert {(r["signal_type"], r["task_id"] or r["pattern"]) for r in table.to_pylist()} == {
        ("boundary", "b"),
        ("rare", "x > y"),
    }
    assert store.read("signals").num_rows == 2


# --------------------------------------------------------------------------- reference and CLI
def test_pandas_reference_matches_sql_on_a_synthetic_log(tmp_path):
    planted = generate_log(tmp_path, 60_000, rounds=3, chunk_rows=20_000)
    con = connect(Store(str(tmp_path)))
    other = SignalsConfig(
        rare_n=3,
        include_parse_errors=True,
        phases=["train", "eval"],
        rare_quantile=0.6,
        forget_reward_drop=0.1,
        forget_before_min=0.75,
    )
    for cfg in (SignalsConfig(), other):
        for r in (1, 3):
            sql = canonical(run_queries(con, cfg, "bench", r))
            assert compare(sql, canonical(pandas_signals(tmp_path, cfg, "bench", r))) == []
    sql = canonical(run_queries(con, SignalsConfig(), "bench", 3))
    assert {t for t in planted.forgetting} <= {r["task_id"] for r in sql["forgetting"]}
    assert planted.rare in {r["pattern"] for r in sql["rare"]}
    assert sql["boundary"] and sql["forgetting"]
    # the planted low-confidence coin flips, and partial credit on hard tasks never solved
    assert planted.uncertain and set(planted.uncertain) <= {r["task_id"] for r in sql["uncertainty"]}
    assert {r["kind"] for r in sql["reward_hacking"]} >= {"partial"}


def test_compare_reports_differences():
    a = {"forgetting": [{"task_id": "t", "score": 1.0}], "boundary": [], "rare": [{"pattern": "p", "score": 2.0}]}
    b = {
        "forgetting": [{"task_id": "t", "score": 0.5}],
        "boundary": [{"task_id": "u", "score": 1.0}],
        "rare": [{"pattern": "p", "score": 2.0}],
    }
    problems = compare(a, b)
    assert len(problems) == 2 and "score" in problems[0] and "only pandas ['u']" in problems[1]


def test_cli_signals_and_bench(forgetting_log, tmp_path):
    from coevolve.cli import app

    runner = CliRunner()
    res = runner.invoke(
        app, ["signals", "--store", forgetting_log.uri, "--round", "2", "--run", RUN, "--format", "json"]
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output.splitlines()[-1])
    assert {r["task_id"] for r in rows if r["signal_type"] == "forgetting"} == {
        "forgot",
        "half_before",
        "within_round",
        "one_sample",
        "future",
        "parse_errors",
    }
    res = runner.invoke(
        app,
        [
            "signals",
            "--store",
            forgetting_log.uri,
            "--round",
            "2",
            "--run",
            RUN,
            "--set",
            "budget_per_type=1",
            "--mine",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "1 forgetting" in res.output and "forgot" in res.output

    res = runner.invoke(app, ["bench", "signals", "--rows", "30000", "--store", str(tmp_path / "bench")])
    assert res.exit_code == 0, res.output
    assert "results identical" in res.output and "forgetting" in res.output and "recovered" in res.output
    assert "uncertainty" in res.output and "reward_hacking" in res.output  # every built-in, five


def test_cli_signals_names_the_runs_and_rounds_there(forgetting_log):
    """A run or round the store has no rollouts of: a message naming what it has, nothing written."""
    from coevolve.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["signals", "--store", forgetting_log.uri, "--round", "1"])  # run 'default'
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert "no rollouts of run 'default'" in out and "runs there: 'other', 'run'" in out and "nothing mined" in out
    res = runner.invoke(app, ["signals", "--store", forgetting_log.uri, "--run", RUN, "--round", "7", "--mine"])
    assert res.exit_code == 2
    assert f"run '{RUN}' has no rollouts in round 7" in " ".join(res.output.split())
    assert forgetting_log.read("signals").num_rows == 0
