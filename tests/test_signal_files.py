"""Tests of signals as SQL files (coevolve.signals): headers, preflight, parameters, the
README's example signal, the uncertainty and reward-hacking signals on planted logs, the
round summary's warning, and a user's signal file through a tiny round."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from coevolve.config import ConfigError, SignalsConfig, load_config
from coevolve.signals import (
    BUILTIN_DIR,
    BUILTIN_TYPES,
    CONFIG_PARAMS,
    check_signal_files,
    mine_signals,
    parse_header,
    run_queries,
    signal_types,
)
from coevolve.sql import connect
from coevolve.store import Store
from test_signals import RUN, episode, group, keys, make_store

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
T, F = True, False


def readme_example() -> str:
    """The example signal file of sql/signals/README.md, as the docs show it."""
    text = (ROOT / "sql" / "signals" / "README.md").read_text()
    return re.search(r"```sql\n(.*?)```", text, re.S).group(1)


def user_dir(tmp_path, files: dict[str, str]) -> str:
    d = tmp_path / "my-signals"
    d.mkdir(exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return str(d)


# --------------------------------------------------------------------------- headers and preflight
def test_every_builtin_declares_its_contract_and_runs():
    specs = check_signal_files(SignalsConfig())
    assert [s.name for s in specs] == list(BUILTIN_TYPES)
    for s in specs:
        assert s.path.parent == BUILTIN_DIR and s.grain and s.columns[:2] == (s.key, "score")
    # a built-in's header default is its config field's default: the file alone says what runs
    cfg = SignalsConfig()
    for name, fields in CONFIG_PARAMS.items():
        declared = parse_header(BUILTIN_DIR / f"{name}.sql").params
        for param, get in fields.items():
            assert declared[param] == pytest.approx(get(cfg)), (name, param)


def test_a_broken_file_fails_preflight_with_its_path_and_duckdbs_message(tmp_path):
    bad = readme_example().replace("finish_reason in", "finish_reasonx in")
    d = user_dir(tmp_path, {"cut_short.sql": bad})
    with pytest.raises(ConfigError) as err:
        load_config(None, {"signals.dirs": [d]})
    msg = str(err.value)
    assert f"{d}/cut_short.sql" in msg and "Binder Error" in msg and "finish_reasonx" in msg


def test_the_run_command_stops_at_preflight_on_a_broken_file(tmp_path):
    from typer.testing import CliRunner

    import flows.cli.run  # noqa: F401  (registers `coevolve run`)
    from coevolve.cli.app import app

    d = user_dir(tmp_path, {"oops.sql": readme_example().replace("from rollouts", "from rollout")})
    store = tmp_path / "store"
    res = CliRunner().invoke(app, ["run", "--store", str(store), "--set", f"signals.dirs=[{d}]"])
    out = res.output.replace("\n", "")  # rich wraps the line
    assert res.exit_code == 2 and f"{d}/oops.sql: Catalog Error" in out and "rollout does not exist" in out
    assert not store.exists()  # nothing written


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda t: t.replace("-- key: task_id\n", ""), "declares no '-- key"),
        (lambda t: t.replace("-- signal: cut_short", "-- signal: Cut-Short"), "lowercase"),
        (lambda t: t.replace("-- signal: cut_short", "-- signal: fallback"), "not one of"),
        (lambda t: t.replace("-- signal: cut_short", "-- signal: boundary"), "already defined"),
        (lambda t: t.replace("-- key: task_id", "-- key: episode_id"), "must be one of"),
        (lambda t: t.replace("n_cut, failing_episode_id", "failing_episode_id"), "returns columns"),
        (lambda t: t.replace("-- param: min_cut integer = 1", "-- param: min_cut = 1"), "NAME TYPE = DEFAULT"),
        (lambda t: t.replace("-- param: min_cut integer = 1\n", ""), "min_cut"),  # used, not declared
        (lambda t: t + "\n-- param: round integer = 1", ""),  # after the header: prose, ignored
    ],
)
def test_header_mistakes_are_named(tmp_path, edit, says):
    d = user_dir(tmp_path, {"cut_short.sql": edit(readme_example())})
    if not says:
        check_signal_files(SignalsConfig(dirs=[d]))
        return
    with pytest.raises(ConfigError) as err:
        check_signal_files(SignalsConfig(dirs=[d]))
    assert says in str(err.value) and "cut_short.sql" in str(err.value)


def test_params_override_header_defaults_and_unknown_ones_are_refused(tmp_path):
    d = user_dir(tmp_path, {"cut_short.sql": readme_example()})
    with pytest.raises(ConfigError, match=r"signals.params.cut_short.min_cuts: .* declares no such parameter"):
        load_config(None, {"signals.dirs": [d], "signals.params.cut_short.min_cuts": 2})
    with pytest.raises(ConfigError, match="no signal file defines 'nope'"):
        load_config(None, {"signals.params.nope.x": 1})
    with pytest.raises(ConfigError, match="signals.dirs: .* is not a folder"):
        load_config(None, {"signals.dirs": [str(tmp_path / "missing")]})
    cfg = load_config(None, {"signals.dirs": [d], "signals.params.uncertainty.max_mean_logprob": -0.5})
    assert signal_types(cfg.signals) == [*BUILTIN_TYPES, "cut_short"]


# --------------------------------------------------------------------------- the README's example
def cut_rows(task: str, finish: list[str | None], **kw) -> list[dict]:
    rows = []
    for reason in finish:
        steps = episode(task, False, **kw)
        steps[-1]["finish_reason"] = reason
        rows += steps
    return rows


def test_the_readme_example_finds_tasks_cut_short(tmp_path):
    d = user_dir(tmp_path, {"cut_short.sql": readme_example()})
    rows = (
        cut_rows("cut_twice", ["step_limit", "length", None])
        + cut_rows("cut_once", [None, "step_limit"])
        + cut_rows("never_cut", [None, None, "error"])
        + cut_rows("cut_in_eval", ["step_limit"], phase="eval")
        + cut_rows("cut_last_round", ["length"], round_no=1)
    )
    store = make_store(tmp_path, rows)
    got = run_queries(connect(store), SignalsConfig(dirs=[d]), RUN, 2)["cut_short"]
    assert keys(got) == {"cut_twice", "cut_once"}
    assert {r["task_id"]: r["score"] for r in got.to_pylist()} == {"cut_twice": pytest.approx(2 / 3), "cut_once": 0.5}
    higher = run_queries(connect(store), SignalsConfig(dirs=[d], params={"cut_short": {"min_cut": 2}}), RUN, 2)
    assert keys(higher["cut_short"]) == {"cut_twice"}
    table = mine_signals(store, SignalsConfig(dirs=[d]), RUN, 2)
    mine = [r for r in table.to_pylist() if r["signal_type"] == "cut_short"]
    assert {r["task_id"] for r in mine} == {"cut_twice", "cut_once"}
    assert all(json.loads(r["evidence"])["failing_episode_id"] for r in mine)
    # a count left as DuckDB's HUGEINT (count_if without a cast) is still a number in the evidence
    uncast = user_dir(tmp_path, {"cut_short.sql": readme_example().replace("count_if(cut)::integer", "count_if(cut)")})
    table = mine_signals(store, SignalsConfig(dirs=[uncast]), RUN, 2)
    assert {json.loads(r["evidence"])["n_cut"] for r in table.to_pylist() if r["signal_type"] == "cut_short"} == {1, 2}


# --------------------------------------------------------------------------- uncertainty
def with_logprobs(rows: list[dict], logprobs: list[float]) -> list[dict]:
    """Each tool-call step gets a model message's log-probs (as the rollout engine logs them)."""
    for r in rows:
        r["completion_logprobs"] = list(logprobs)
    return rows


def test_uncertainty_recovers_exactly_the_planted_tasks(tmp_path):
    unsure, sure = [-0.5, -0.1, -0.02, -0.3], [-0.01, -0.02, -0.03, -0.01]
    rows = (
        with_logprobs(group("unsure_mixed", [T, F, F]), unsure)
        + with_logprobs(group("unsure_partial", [(F, 0.2), (F, 0.0)]), unsure)  # rewards spread
        + with_logprobs(group("unsure_all_fail", [F, F, F, F]), unsure)  # outcomes agree: miss
        + with_logprobs(group("sure_mixed", [T, F, T, F]), sure)  # confident: miss
        + with_logprobs(group("one_sample", [T]), unsure)  # 1 < 2 samples: miss
        + with_logprobs(group("no_call", [T, F], actions=[None]), unsure)  # no tool-call tokens: miss
        + group("no_logprobs", [T, F])  # a backend that logs none: miss
        + with_logprobs(group("eval_leak", [T, F], phase="eval"), unsure)
        + with_logprobs(group("earlier_round", [T, F], round_no=1), unsure)
    )
    store = make_store(tmp_path, rows)
    got = run_queries(connect(store), SignalsConfig(), RUN, 2)["uncertainty"]
    assert keys(got) == {"unsure_mixed", "unsure_partial"}
    row = got.to_pylist()[0]
    assert row["mean_logprob"] == pytest.approx(-0.23) and row["score"] == pytest.approx(0.23)
    assert row["low_token_share"] == 0.0 and row["n_tokens"] == 4 * row["n_messages"]
    # the threshold and the even-odds line are parameters
    cfg = SignalsConfig(params={"uncertainty": {"max_mean_logprob": -0.005, "low_logprob": -0.4}})
    loose = run_queries(connect(store), cfg, RUN, 2)["uncertainty"]
    assert keys(loose) == {"unsure_mixed", "unsure_partial", "sure_mixed"}
    assert {r["task_id"]: r["low_token_share"] for r in loose.to_pylist()}["unsure_mixed"] == 0.25
    # relative to the round: the median of the tasks' means (-0.23 here) leaves the sure one out;
    # with the absolute test off, the top quantile takes every mixed task, the bottom the least sure
    relative = SignalsConfig(params={"uncertainty": {"max_mean_logprob": -1.0, "quantile": 1.0}})
    assert keys(run_queries(connect(store), relative, RUN, 2)["uncertainty"]) == {
        "unsure_mixed",
        "unsure_partial",
        "sure_mixed",
    }
    lowest = SignalsConfig(params={"uncertainty": {"max_mean_logprob": -1.0, "quantile": 0.0}})
    got = run_queries(connect(store), lowest, RUN, 2)["uncertainty"]
    assert keys(got) == {"unsure_mixed", "unsure_partial"}
    assert got.column("cutoff").to_pylist() == pytest.approx([-0.23, -0.23], abs=1e-6)


def test_uncertainty_fires_on_smollm2s_logged_logprobs():
    """The embedded default's store (real SmolLM2 log-probs): the defaults fire in both rounds."""
    store = Store(str(ROOT / "tests" / "data" / "default-store"))
    for round_no in (1, 2):
        got = run_queries(connect(store), SignalsConfig(), "default", round_no)["uncertainty"]
        assert got.num_rows >= 2 and all(-0.2 < m < -0.04 for m in got.column("mean_logprob").to_pylist())


# --------------------------------------------------------------------------- reward hacking
def test_reward_hacking_recovers_exactly_the_planted_tasks(tmp_path):
    rows = (
        # partial credit on a task never solved
        group("partial_never", [(F, 0.5), (F, 0.5), (F, 0.25)])
        + group("partial_never", [(F, 0.0), (F, 0.0)], round_no=1)
        + group("partial_low", [(F, 0.2), (F, 0.2)])  # below 0.25: miss
        + group("solved_before", [(T, 1.0), (F, 0.0)], round_no=1)  # solved once: not "never"
        + group("solved_before", [(F, 0.5), (F, 0.5)])
        # reward rose by 0.4 while success stayed at 0.5
        + group("rise", [(T, 1.0), (F, 0.0)], round_no=1)
        + group("rise", [(T, 1.0), (F, 0.8)])
        # reward rose with success: honest learning, miss
        + group("honest", [(F, 0.0), (F, 0.0)], round_no=1)
        + group("honest", [(T, 1.0), (F, 0.0)])
        + group("partial_eval", [(F, 0.9), (F, 0.9)], phase="eval")
        + group("one_episode", [(F, 0.9)])  # 1 < 2 samples: miss
    )
    store = make_store(tmp_path, rows)
    got = {r["task_id"]: r for r in run_queries(connect(store), SignalsConfig(), RUN, 2)["reward_hacking"].to_pylist()}
    assert set(got) == {"partial_never", "rise", "solved_before"} - {"solved_before"}
    assert got["partial_never"]["kind"] == "partial+rise" and got["partial_never"]["score"] == pytest.approx(5 / 12)
    assert got["rise"]["kind"] == "rise" and got["rise"]["reward_rise"] == pytest.approx(0.4)
    assert got["rise"]["before_round"] == 1 and got["rise"]["ever_solved"] is True
    strict = SignalsConfig(params={"reward_hacking": {"min_rise": 0.5, "min_reward": 0.45}})
    assert keys(run_queries(connect(store), strict, RUN, 2)["reward_hacking"]) == set()


def test_the_round_summary_warns_of_reward_hacking(tmp_path, capsys):
    from coevolve.round import round_warnings
    from flows.cli.run import print_summary

    store = make_store(tmp_path, group("partial_never", [(F, 0.5), (F, 0.5)]) + group("fine", [T, F]))
    counts = {"reward_hacking": 0}
    assert round_warnings(counts, store, RUN, 2) == []
    table = mine_signals(store, SignalsConfig(), RUN, 2)
    counts = {t: table.column("signal_type").to_pylist().count(t) for t in BUILTIN_TYPES}
    (warning,) = round_warnings(counts, store, RUN, 2)
    assert warning.startswith("reward hacking: 1 task(s)") and "partial_never" in warning
    row = {"round": 2, "signal_counts": json.dumps(counts), "warnings": json.dumps([warning])}
    print_summary([row])
    out = capsys.readouterr().out
    assert "warning: round 2: reward hacking" in out and "reward_hacking" in out  # the per-type table


# --------------------------------------------------------------------------- a user's signal in a round
@pytest.mark.slow
def test_a_user_signal_file_runs_in_a_tiny_round(tmp_path, monkeypatch):
    """The README's example in a temporary folder, through a tiny round: its rows in `signals`,
    its count in the round summary, exploration contexts from it."""
    import coevolve.round as round_module
    from coevolve.round import run_rounds
    from coevolve.store import Store
    from flows.cli.run import summary_tables

    d = user_dir(tmp_path, {"cut_short.sql": readme_example()})
    monkeypatch.setitem(round_module._STAGE_FUNCS, "evaluate", lambda ctx: {"eval_score": None})
    cfg = load_config(
        TINY,
        {  # as small as a real run gets; an untrained model's messages run into the 32-token budget
            "store": str(tmp_path / "store"),
            "rounds": 1,
            "train.checkpoint_dir": str(tmp_path / "ckpt"),
            "train.steps": 1,
            "train.sft_steps": 1,
            "train.sft_batch_size": 1,
            "train.tasks_per_step": 1,
            "train.group_size": 2,
            "env.step_limit": 1,
            "policy.max_new_tokens": 32,
            "abstract.max_turns": 1,
            "signals.dirs": [d],
        },
    )
    rows = run_rounds(cfg)
    store = Store(cfg.store)
    signals = [r for r in store.read("signals").to_pylist() if r["signal_type"] == "cut_short"]
    assert signals and all(r["task_id"] and r["round"] == 1 for r in signals)
    (round1,) = [r for r in rows if r["round"] == 1]
    counts = json.loads(round1["signal_counts"])
    assert counts["cut_short"] == len(signals) and set(BUILTIN_TYPES) <= set(counts)
    per_type = next(t for t in summary_tables(rows) if "signals per type" in str(t.title))
    assert "cut_short" in [c.header for c in per_type.columns]
    explored = [r for r in store.read("explorations").to_pylist() if r["signal_type"] == "cut_short"]
    assert explored and {r["signal_id"] for r in explored} <= {s["signal_id"] for s in signals}
