"""Round 0: the seed pool synthesized from training-scenario states (no model, no human data)."""

from __future__ import annotations

from collections import Counter

import pytest

from coevolve.config import ConfigError, load_config
from coevolve.envs import bfcl_data
from coevolve.envs.bfcl import BfclEnvironment
from coevolve.evaluate import replay_reference
from coevolve.round import pool_tasks, round_stages, run_round, seed_pool
from coevolve.store import Store
from coevolve.synth import synthesis_states


@pytest.fixture(scope="module")
def round0_run(tmp_path_factory):
    """Round 0 of the embedded default's synthesis config, in a fresh store, with every way
    of loading a model refused and recorded: (cfg, store, row, models it tried to load)."""
    import coevolve.policy
    from coevolve.policy import local, models

    loads: list[str] = []

    def refuse(what):
        def load(*args, **kwargs):
            loads.append(what)
            raise AssertionError(f"round 0 loads no model ({what})")

        return load

    cfg = load_config(None, {"store": str(tmp_path_factory.mktemp("synth") / "store")})
    store = Store(cfg.store)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(coevolve.policy, "load_policy", refuse("load_policy"))
        patched.setattr(local.LocalPolicy, "__init__", refuse("LocalPolicy"))
        patched.setattr(models, "resolve_model", refuse("resolve_model"))
        row = run_round(store, cfg, 0)
    return cfg, store, row, loads


@pytest.fixture(scope="module")
def round0(round0_run):
    cfg, store, row, _ = round0_run
    return cfg, store, row


def _owner() -> dict[str, str]:
    return {m: c for c in bfcl_data.CLASSES for m in bfcl_data.public_methods(c)}


def test_default_round0_synthesizes_16_tasks_over_4_classes(round0_run):
    cfg, store, row, loads = round0_run
    tasks = pool_tasks(store, "train")
    owner = _owner()
    classes = {owner[c["name"]] for t in tasks for turn in t.reference_actions for c in turn}
    assert len(tasks) >= 16 and len(classes) >= 4, (len(tasks), classes)
    assert {t.origin for t in tasks} == {"static"} and {t.created_round for t in tasks} == {0}
    assert all(t.turns and all(t.turns) and len(t.turns) <= cfg.abstract.max_turns for t in tasks)
    # a round like any other: a pool version of round 0, stage markers and a rounds row
    assert store.latest_pool().version == 1 and store.latest_pool().round == 0
    assert row["round"] == 0 and row["pool_size"] == len(tasks) and row["n_accepted"] == len(tasks)
    assert row["t_explore"] is not None and row["t_train"] is None
    assert loads == []  # no model: round 0 is synthesized, not generated
    assert store.read("rounds").column("round").to_pylist() == [0]


def test_synthesized_tasks_replay_to_success_in_a_fresh_environment(round0):
    _, store, _ = round0
    tasks = pool_tasks(store, "train")
    assert tasks
    scores = replay_reference(BfclEnvironment(), tasks)
    assert sorted(scores) == sorted(t.task_id for t in tasks)  # one score per task
    failed = {t: s.reason for t, s in scores.items() if not s.success}
    assert failed == {}


def test_round0_starts_only_from_training_scenarios_states(round0):
    cfg, store, _ = round0
    held = bfcl_data.heldout_scenarios(cfg.env.heldout_scenarios, cfg.seed)
    states = synthesis_states(cfg)
    assert len({s.task_id for s in states}) == cfg.synth.scenarios * len(cfg.synth.categories)
    assert all(not s.turns and not s.reference_actions for s in states)  # state only
    contexts = set(store.read("explorations").column("context_task_id").to_pylist())
    assert contexts <= {s.task_id for s in states}
    assert not {bfcl_data.scenario_of(c) for c in contexts} & held
    assert Counter(store.read("explorations").column("signal_type").to_pylist()).keys() == {"static"}


def test_round0_is_resumable_and_skipped_for_a_pool_it_did_not_start(round0, tmp_path):
    cfg, store, _ = round0
    assert seed_pool(store, cfg)["skipped"] is False  # markers exist: every stage is skipped, nothing redone
    assert store.latest_pool().version == 1
    # a store whose pool was committed otherwise: round 0 has no stages
    other = Store(str(tmp_path / "other"))
    other.commit_pool(
        run_id="x", round_no=0, new_tasks=[t.to_row() for t in pool_tasks(store, "train")[:2]], expected_parent=None
    )
    other_cfg = load_config(None, {"store": other.uri})
    assert round_stages(other, other_cfg, 0) == () and run_round(other, other_cfg, 0) is None
    assert round_stages(other, other_cfg, 1)[0] == "train"


def test_round0_errors_clearly_without_states_or_tasks(tmp_path, monkeypatch):
    class Stateless:
        name = "stateless"

    monkeypatch.setattr("coevolve.synth.resolve", lambda kind, name: Stateless)
    cfg = load_config(None, {"store": str(tmp_path / "a")})
    with pytest.raises(ConfigError, match="training states"):
        synthesis_states(cfg)
    with pytest.raises(ConfigError, match="synth.scenarios"):
        load_config(None, {"synth.scenarios": 0})


def test_round0_freezes_the_heldout_synthesized_split(round0):
    """Pool v1 also holds the held-out synthesized split: tasks from held-out scenarios' states,
    split and origin 'heldout', that pass the quality gate and replay, apart from training."""
    from coevolve.heldout import synthesize_heldout
    from coevolve.quality import quality_reason

    cfg, store, row = round0
    held = bfcl_data.heldout_scenarios(cfg.env.heldout_scenarios, cfg.seed)
    split = pool_tasks(store, "heldout")
    assert len(split) == cfg.eval.synth_tasks
    assert [t.task_id for t in split] == [t.task_id for t in synthesize_heldout(cfg)]  # deterministic: frozen
    assert {t.origin for t in split} == {"heldout"} and {t.created_round for t in split} == {0}
    assert all(bfcl_data.scenario_of(t.seed_task_id) in held for t in split)
    env = BfclEnvironment()
    assert [quality_reason(env, t) for t in split] == [None] * len(split)
    assert {t: s.reason for t, s in replay_reference(env, split).items() if not s.success} == {}
    # the training side sees none of it: not in the training split, its count, or any exploration
    train = pool_tasks(store, "train")
    assert not {t.task_id for t in split} & {t.task_id for t in train} and row["pool_size"] == len(train)
    assert not {bfcl_data.scenario_of(t.seed_task_id) for t in train} & held
    contexts = set(store.read("explorations").column("context_task_id").to_pylist())
    assert not contexts & {t.seed_task_id for t in split}
    assert store.stage_done(cfg.run_name, 0, "commit")["heldout_synth"] == len(split)
    # its own seed: another run seed draws another split
    other = synthesize_heldout(load_config(None, {"seed": cfg.seed + 1}))
    assert other and {t.task_id for t in other} != {t.task_id for t in split}
    assert synthesize_heldout(load_config(None, {"eval.synth_tasks": 0})) == []
