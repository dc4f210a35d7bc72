"""`coevolve ablate`: the plan of conditions x seeds, the static condition's empty feedback
stages, and end to end on the tiny config (Prefect flow, then the CLI resuming it, then a
rerun that repeats nothing), with the `ablations` table read through `coevolve sql`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coevolve.ablate import CONDITIONS, plan
from flows.cli import app
from coevolve.config import ConfigError, load_config
from coevolve.round import run_stage
from coevolve.store import Store

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")
runner = CliRunner()

# the smallest budgets that still run every stage of every condition
SMALL = {
    "train.sft_steps": 1,
    "train.steps": 1,
    "train.tasks_per_step": 1,
    "train.group_size": 2,
    "synth.scenarios": 2,
    "synth.contexts_per_scenario": 1,
    "eval.scenarios": 1,
    "eval.step_limit": 1,
    "env.step_limit": 1,
    "policy.max_new_tokens": 8,
    "explore.runs_per_context": 1,
    "explore.steps_per_run": 2,
}


def _sets(extra: dict) -> list[str]:
    return [a for k, v in {**SMALL, **extra}.items() for a in ("--set", f"{k}={v}")]


def sql(store: str, query: str) -> list[dict]:
    out = runner.invoke(app, ["sql", "--store", store, "--format", "json", query])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_plan_is_every_condition_times_every_seed(tmp_path):
    runs = plan(load_config(TINY), seeds=2, rounds=3, store=str(tmp_path / "abl"))
    assert [r.run_id for r in runs] == [f"{c.name}-s{s}" for c in CONDITIONS for s in (0, 1)]
    assert len({r.cfg.store for r in runs}) == 8  # one pool lineage per run
    for r in runs:
        assert r.cfg.store == f"{tmp_path / 'abl'}/conditions/{r.run_id}" and r.cfg.run_name == r.run_id
        assert (r.cfg.rounds, r.cfg.seed, r.cfg.train.steps) == (3, r.seed, 2)  # equal budgets
    by = {r.run_id: r.cfg for r in runs}
    assert by["static-s0"].explore.enabled is False
    assert by["random-s1"].explore.explorer == "random" and by["random-s1"].explore.enabled
    assert by["signal-guided-s0"].explore.explorer == "rule"
    assert not next(r for r in runs if r.run_id == "zero-shot-s0").condition.trains
    with pytest.raises(ConfigError, match="signal-guided"):
        plan(load_config(TINY, {"explore.explorer": "random"}), seeds=1, rounds=1, store=str(tmp_path))
    with pytest.raises(ConfigError, match="--seeds"):
        plan(load_config(TINY), seeds=0, rounds=1)


def test_static_condition_feedback_stages_produce_nothing(tmp_path):
    store = Store(str(tmp_path / "s"))
    store.commit_pool(
        run_id="st",
        round_no=0,
        expected_parent=None,
        new_tasks=[
            {
                "task_id": "t0",
                "env": "bfcl-v3",
                "split": "train",
                "origin": "seed",
                "turns": ["x"],
                "initial_state": "{}",
                "reference_actions": "[]",
                "content_hash": "h",
            }
        ],
    )
    cfg = load_config(TINY, {"run_name": "st", "store": store.uri, "explore.enabled": False})
    mined = run_stage(store, cfg, 1, "signals")
    builtin = ("forgetting", "boundary", "rare", "uncertainty", "reward_hacking")
    assert mined["signal_counts"] == dict.fromkeys(builtin, 0)  # every built-in signal type, none mined
    assert [mined[f"signals_{t}"] for t in ("forgetting", "boundary", "rare")] == [0, 0, 0]
    assert run_stage(store, cfg, 1, "explore")["n_explorations"] == 0
    assert run_stage(store, cfg, 1, "abstract")["n_candidates"] == 0
    assert run_stage(store, cfg, 1, "validate")["accepted"] == 0
    commit = run_stage(store, cfg, 1, "commit")
    assert commit["added"] == 0 and commit["pool_size"] == 1
    for table in ("signals", "explorations", "candidates"):
        assert store.read(table).num_rows == 0


@pytest.mark.slow
def test_ablation_flow_then_cli_resume_then_nothing_repeated(prefect_harness, tmp_path, monkeypatch):
    from flows.ablate import ablate_flow

    store = str(tmp_path / "abl")
    extra = {"train.checkpoint_dir": str(tmp_path / "ckpt")}
    # seed 0 of every condition, as a Prefect flow with a subflow per condition
    df = ablate_flow(config=TINY, seeds=1, rounds=1, store=store, overrides={**SMALL, **extra})
    assert df["condition"].to_list() == [c.name for c in CONDITIONS] and df["seeds"].to_list() == [1] * 4
    # seed 0's markers and pool manifests; a partition's part manifest (_manifest.json) is shared
    # by the parts of every run in it, so seed 1's ablations rows update it
    first = {p: p.stat().st_mtime_ns for p in Path(store).rglob("*.json") if p.name != "_manifest.json"}
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        artifacts = {a.key: a for a in client.read_artifacts()}
    assert "coevolve-static-s0-round-1" in artifacts and "coevolve-signal-guided-s0-round-1" in artifacts
    summary_md = next(a.data for k, a in artifacts.items() if k.startswith("ablation-"))
    assert "| signal-guided | 1 | 1 |" in summary_md and "score.png" in summary_md

    # two seeds from the CLI: seed 0 is skipped (finished), seed 1 runs
    out = runner.invoke(
        app,
        ["ablate", "--config", TINY, "--seeds", "2", "--rounds", "1", "--store", store, "--no-prefect", *_sets(extra)],
    )
    assert out.exit_code == 0, out.output
    assert out.output.count("skipped (finished)") == 4
    assert "held-out success rate and reward" in out.output and "signal-guided" in out.output
    # the paired comparison of neighbouring rungs: two seeds are too few for a verdict
    assert "upper - lower rung" in out.output and "too few seeds for a verdict" in out.output
    assert all(p.stat().st_mtime_ns == t for p, t in first.items())  # seed 0 untouched

    rows = sql(store, "select condition, seed, round, eval_score from ablations order by all")
    expected = {(c.name, s, 1 if c.trains else 0) for c in CONDITIONS for s in (0, 1)}
    assert {(r["condition"], r["seed"], r["round"]) for r in rows} == expected and len(rows) == len(expected)
    assert all(0.0 <= r["eval_score"] <= 1.0 for r in rows)
    static = Store(f"{store}/conditions/static-s1")
    # static explores only in round 0 (the synthesized seed pool), never after
    explored = static.read("explorations").column("round").to_pylist()
    assert static.latest_pool().added == [] and explored and set(explored) == {0}

    # a rerun repeats nothing
    before = {p: p.stat().st_mtime_ns for p in Path(store).rglob("*") if p.is_file()}
    again = runner.invoke(
        app,
        ["ablate", "--config", TINY, "--seeds", "2", "--rounds", "1", "--store", store, "--no-prefect", *_sets(extra)],
    )
    assert again.exit_code == 0, again.output
    assert again.output.count("skipped (finished)") == 8 and "running" not in again.output
    assert {p: p.stat().st_mtime_ns for p in Path(store).rglob("*") if p.is_file()} == before

    # the report of the ablation: one score series per condition
    from coevolve.report import write_report

    rep = write_report(Store(store), out=tmp_path / "report")
    labels = [ln.get_label() for ln in rep.figures["score"].axes[0].lines]
    assert labels == [c.name for c in CONDITIONS]
    assert (tmp_path / "report" / "score.png").is_file()


@pytest.mark.parametrize(
    "preset,seeds,rounds",
    [("ablate-cpu.yaml", 2, 2), ("ablate-gpu.yaml", 2, 3), ("ablate-gpu-local.yaml", 2, 3), ("ablate-tiny.yaml", 5, 3)],
)
def test_presets_are_the_ladder(preset, seeds, rounds):
    cfg = load_config(str(ROOT / "configs" / preset))
    runs = plan(cfg, cfg.ablate.seeds, cfg.rounds)
    assert len(runs) == 4 * seeds and {r.cfg.rounds for r in runs} == {rounds}
    assert {r.cfg.train.steps for r in runs} == {cfg.train.steps}  # equal budgets
    if preset == "ablate-tiny.yaml":  # the CPU ladder trains on most of its pool each round
        t = cfg.train
        assert t.steps * t.tasks_per_step >= 2 * cfg.synth.scenarios * cfg.synth.runs_per_context
