"""The held-out split: BFCL-V3 scenarios (one index across the four multi-turn categories) are
held out together; the training side can reach only training scenarios' states; evaluation
(``eval_tasks``, ``coevolve eval``) reads held-out entries only."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from coevolve.config import ConfigError, RunConfig, load_config
from coevolve.envs import bfcl_data
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.evaluate import eval_tasks
from coevolve.store import Store

ROOT = Path(__file__).resolve().parents[1]
SPECS = [(40, 0), (40, 1), (7, 3), (199, 0), ([0, 5, 199], 0)]


@pytest.mark.parametrize("spec,seed", SPECS)
def test_training_side_never_reaches_a_heldout_scenario(spec, seed):
    held = bfcl_data.heldout_scenarios(spec, seed)
    assert len(held) == (spec if isinstance(spec, int) else len(spec))
    train = bfcl_data.training_scenarios(held)
    assert not set(train) & held and set(train) | held == set(range(bfcl_data.N_SCENARIOS))
    states = bfcl_data.scenario_states(train)  # everything the training side may read of the benchmark
    assert len(states) == 4 * len(train)
    for t in states:
        assert bfcl_data.scenario_of(t.task_id) not in held
        assert t.turns == [] and t.reference_actions == []  # states only: no questions, no ground truth
    # every category's twin of a held-out scenario is held out with it
    assert {bfcl_data.scenario_of(t.task_id) for t in states} == set(train)
    for category in bfcl_data.CATEGORIES:
        assert {bfcl_data.scenario_of(t.task_id) for t in states if t.category == category} == set(train)


def test_heldout_twins_are_evaluated_together_and_nothing_else():
    held = bfcl_data.heldout_scenarios(40, 0)
    tasks = bfcl_data.heldout_tasks(held)
    assert len(tasks) == 4 * 40
    by_scenario: dict[int, set[str]] = {}
    for t in tasks:
        by_scenario.setdefault(bfcl_data.scenario_of(t.task_id), set()).add(t.category)
    assert set(by_scenario) == held and all(cats == set(bfcl_data.CATEGORIES) for cats in by_scenario.values())
    training = bfcl_data.training_scenarios(held)[:2]
    with pytest.raises(ValueError, match="not held out"):
        bfcl_data.heldout_tasks(held, training)
    assert set(bfcl_data.eval_scenarios(held, 4, 0)) <= held and len(bfcl_data.eval_scenarios(held, 4, 0)) == 4
    assert bfcl_data.eval_scenarios(held, 0, 0) == sorted(held)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_eval_tasks_are_heldout_for_every_seed(seed):
    cfg = RunConfig(seed=seed)
    held = bfcl_data.heldout_scenarios(cfg.env.heldout_scenarios, seed)
    for scenarios in (0, 1, 4):
        tasks = eval_tasks(cfg, BfclEnvironment(), scenarios=scenarios)
        assert tasks and all(bfcl_data.scenario_of(t.task_id) in held for t in tasks)


def test_config_refuses_more_eval_scenarios_than_held_out():
    with pytest.raises(ConfigError, match="eval.scenarios"):
        load_config(None, {"env.heldout_scenarios": 2, "eval.scenarios": 3})
    assert load_config(None, {"env.heldout_scenarios": [4, 9], "eval.scenarios": 2}).eval.scenarios == 2


def test_cli_eval_limit_evaluates_heldout_entries_only(tmp_path):
    """``coevolve eval --limit 4`` with the tiny model: 4 held-out entries per category, all turns."""
    from coevolve.cli import app

    import yaml

    data = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    data["eval"].update(step_limit=1, max_new_tokens=16)  # an untrained model: keep its messages short
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(data))
    store = tmp_path / "store"
    res = CliRunner().invoke(
        app,
        [
            "eval",
            "--config",
            str(config),
            "--limit",
            "4",
            "--category",
            "multi_turn_base",
            "--store",
            str(store),
            "--run-id",
            "split",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "multi_turn_base" in res.output and "/4" in res.output
    cfg = load_config(config)
    held = bfcl_data.heldout_scenarios(cfg.env.heldout_scenarios, cfg.seed)
    rows = Store(str(store)).read("rollouts").to_pylist()
    ids = {r["task_id"] for r in rows}
    assert len(ids) == 4 and all(bfcl_data.scenario_of(i) in held for i in ids)
    assert {r["phase"] for r in rows} == {"eval"}
    full = {t.task_id: len(t.turns) for t in BfclEnvironment().load_tasks(ids=sorted(ids))}
    for task_id, n_turns in full.items():  # no episode was cut short of its last turn by a turn limit
        turns = {r["turn"] for r in rows if r["task_id"] == task_id}
        last = [r for r in rows if r["task_id"] == task_id][-1]
        assert max(turns) == n_turns - 1 or last["finish_reason"] in ("context_limit", "time_limit", "error")
