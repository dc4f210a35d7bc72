"""Provenance: no BFCL-V3 question or ground-truth call ever reaches the training side.

At load time every user question and every ground-truth call string of the BFCL data is
replaced by a unique sentinel (the function docs and initial states stay real). Two rounds
of the tiny config then run without Prefect, and no sentinel may appear in a training-side
table (``tasks`` split train, ``explorations``, ``candidates``, ``rollouts`` phase train) nor
in the SFT warm start's examples. On the code before round 0 synthesized the pool (seed
tasks copied from BFCL entries), the sentinels fill the pool and this test fails.

**The one exception, to refuse only.** The contamination check of validation
(``coevolve.contamination``) is the one place on the training side that reads held-out
benchmark questions and ground-truth calls: it compares every candidate with them and refuses
near-copies, and nothing it reads leaves it except a similarity and a held-out turn id
(``candidates.contamination`` / ``contamination_id``). The round test below checks that it is
the only training-side caller of the environment's benchmark readers while two rounds run, and
``test_only_evaluation_and_the_contamination_check_read_the_benchmark`` checks the source: no
other module of the training side calls ``heldout_tasks`` or ``load_tasks``.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from coevolve.config import load_config
from coevolve.envs import bfcl_data

TINY = Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml"
MARK = "sentinel"  # searched case-insensitively


def _clear_caches() -> None:
    for fn in (bfcl_data._category_tasks, bfcl_data._category_entries):
        fn.cache_clear()


@pytest.fixture
def sentinel_data(monkeypatch):
    """BFCL data whose questions and ground-truth calls are sentinels (states and docs real)."""
    real = bfcl_data._read_jsonl
    counter = itertools.count()

    def read(path: Path) -> list[dict]:
        rows = real(path)
        if path.parent.name == "multi_turn_func_doc":
            return rows
        if path.parent.name == "possible_answer":
            for row in rows:
                row["ground_truth"] = [
                    [f"sentinel_gt_{(n := next(counter))}(marker='SENTINEL_GT_{n}')" for _ in turn]
                    for turn in row["ground_truth"]
                ]
            return rows
        for row in rows:
            for turn in row["question"]:
                for msg in turn:
                    msg["content"] = f"SENTINEL_Q_{next(counter)}"
        return rows

    _clear_caches()
    monkeypatch.setattr(bfcl_data, "_read_jsonl", read)
    yield
    _clear_caches()


def _leaks(table) -> list[str]:
    text = [json.dumps(r, default=str) for r in table.to_pylist()]
    return [t[:200] for t in text if MARK in t.lower()]


def test_no_benchmark_question_or_ground_truth_reaches_the_training_side(sentinel_data, tmp_path, monkeypatch):
    import inspect

    import coevolve.contamination as contamination
    import coevolve.round as round_module
    import coevolve.train.sft as sft
    from coevolve.envs.bfcl import BfclEnvironment
    from coevolve.round import run_rounds
    from coevolve.store import Store

    # the patch is in force: the benchmark as loaded is all sentinels
    entry = BfclEnvironment().load_tasks(["multi_turn_base"], limit=1)[0]
    assert entry.turns[0].startswith("SENTINEL_Q_") and entry.reference_actions[0][0]["name"].startswith("sentinel_gt_")

    seen: dict[str, list] = {"episodes": [], "examples": []}
    real_chats, real_sft = sft.reference_chats, sft.run_sft

    def chats(env, tasks, **kw):
        out = real_chats(env, tasks, **kw)
        seen["episodes"] += out
        return out

    def run_sft(model, tokenizer, examples, **kw):
        seen["examples"] += [tokenizer.decode(ids) for ids, _ in examples]
        return real_sft(model, tokenizer, examples, **kw)

    # who reads the benchmark (questions, ground truth) while the training side runs
    readers: list[str] = []
    for name in ("heldout_tasks", "load_tasks"):
        real_reader = getattr(BfclEnvironment, name)

        def spy(self, *a, _real=real_reader, **kw):
            readers.append(inspect.stack()[1].frame.f_globals.get("__name__", "?"))
            return _real(self, *a, **kw)

        monkeypatch.setattr(BfclEnvironment, name, spy)
    monkeypatch.setattr(contamination, "_INDEXES", {})  # built anew under the sentinel data
    monkeypatch.setattr(sft, "reference_chats", chats)
    monkeypatch.setattr(sft, "run_sft", run_sft)
    # evaluation reads the benchmark by design and writes only phase-eval rows: not under test here
    monkeypatch.setitem(round_module._STAGE_FUNCS, "evaluate", lambda ctx: {"eval_score": None})
    cfg = load_config(
        TINY,
        {  # as small as a real run gets: 1 SFT and 1 GRPO step per round
            "store": str(tmp_path / "store"),
            "rounds": 2,
            "train.checkpoint_dir": str(tmp_path / "ckpt"),
            "train.steps": 1,
            "train.sft_steps": 1,
            "train.sft_batch_size": 1,
            "train.warm_start_cache": False,  # run_sft must run: its examples are inspected
            "train.tasks_per_step": 1,
            "train.group_size": 2,
            "env.step_limit": 1,
            "policy.max_new_tokens": 32,
            "abstract.max_turns": 1,
        },
    )
    rows = run_rounds(cfg)
    assert [r["round"] for r in rows] == [0, 1, 2]
    # the contamination check read the held-out tasks (to refuse only), and nothing else did
    assert readers and set(readers) == {"coevolve.contamination"}

    store = Store(cfg.store)
    tasks = store.read("tasks")
    train_tasks = tasks.filter(pc.field("split") == "train")
    assert train_tasks.num_rows >= 1 and set(train_tasks.column("origin").to_pylist()) <= {"static", "explored"}
    # besides the training split, the pool holds only the held-out synthesized split (evaluation
    # only), made from held-out scenarios' states: no benchmark question or answer in it either
    heldout = tasks.filter(pc.field("split") != "train")
    assert set(heldout.column("split").to_pylist()) <= {"heldout"} and _leaks(heldout) == []
    assert set(heldout.column("origin").to_pylist()) <= {"heldout"}
    assert _leaks(train_tasks) == []
    assert store.read("explorations").num_rows > 0 and _leaks(store.read("explorations")) == []
    assert store.read("candidates").num_rows > 0 and _leaks(store.read("candidates")) == []
    train_rollouts = store.read("rollouts").filter(pc.field("phase") == "train")
    assert train_rollouts.num_rows > 0 and _leaks(train_rollouts) == []
    # the SFT warm start ran on synthesized tasks only
    assert seen["episodes"] and seen["examples"]
    episodes = json.dumps([[r.task_id, r.steps] for r in seen["episodes"]], default=str)
    assert MARK not in episodes.lower()
    assert not [e for e in seen["examples"] if MARK in e.lower()]


def test_no_heldout_scenario_reaches_the_training_side(tmp_path, monkeypatch):
    """Split at table level: every training-side row starts from a training scenario's state.

    Held-out scenarios are listed explicitly here, chosen among the scenarios round 0 would
    otherwise draw, so a leak cannot hide behind an unlucky draw.
    """
    import coevolve.round as round_module
    from coevolve.round import run_rounds
    from coevolve.store import Store

    monkeypatch.setitem(round_module._STAGE_FUNCS, "evaluate", lambda ctx: {"eval_score": None})
    from coevolve.synth import synthesis_states

    probe = load_config(TINY, {"env.heldout_scenarios": [], "eval.scenarios": 0})
    drawn = sorted({bfcl_data.scenario_of(t.task_id) for t in synthesis_states(probe)})
    heldout = drawn[: len(drawn) // 2]
    cfg = load_config(
        TINY,
        {
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
            "env.heldout_scenarios": heldout,
        },
    )
    run_rounds(cfg)
    store = Store(cfg.store)
    heldout_states = {
        json.dumps(t.initial_state["initial_config"], sort_keys=True) for t in bfcl_data.scenario_states(heldout)
    }
    training_states = {
        json.dumps(t.initial_state["initial_config"], sort_keys=True)
        for t in bfcl_data.scenario_states(bfcl_data.training_scenarios(frozenset(heldout)))
    }
    only_heldout = heldout_states - training_states
    contexts = store.read("explorations").column("context_task_id").to_pylist()
    assert contexts and not {_scenario(c) for c in contexts} & set(heldout)
    rows = store.read("tasks").to_pylist()
    train = [r for r in rows if r["split"] == "train"]
    for row in train:
        assert _scenario(row["seed_task_id"]) not in heldout, row["task_id"]
        state = json.loads(row["initial_state"])
        assert json.dumps(state["initial_config"], sort_keys=True) not in only_heldout, row["task_id"]
    # the held-out synthesized split comes from held-out scenarios only, and training never touches it
    split = [r for r in rows if r["split"] != "train"]
    assert split and {r["split"] for r in split} == {"heldout"}
    assert {_scenario(r["seed_task_id"]) for r in split} <= set(heldout)
    rollouts = store.read("rollouts").filter(pc.field("phase") == "train")
    pool_ids = {r["task_id"] for r in train}
    assert rollouts.num_rows > 0 and set(rollouts.column("task_id").to_pylist()) <= pool_ids
    validated = {json.loads(s).get("seed_task_id") for s in store.read("candidates").column("spec").to_pylist()}
    assert not validated & {r["seed_task_id"] for r in split}


def _scenario(task_id: str) -> int:
    """The scenario a (possibly derived, ``<root>~x<round>.<hash>``) task id starts from."""
    return bfcl_data.scenario_of(task_id.split("~")[0])


# the benchmark's readers: questions and ground-truth calls come out of these
BENCHMARK_READERS = {"heldout_tasks", "load_tasks"}
# who may call them: evaluation, the environments that define them, benchmarks and the
# evaluation CLI (not the training side), and the contamination check (to refuse only)
MAY_READ = {
    "coevolve/evaluate.py",
    "coevolve/contamination.py",
    "coevolve/cli/eval.py",
}
MAY_READ_UNDER = ("coevolve/envs/", "coevolve/bench/")


def test_only_evaluation_and_the_contamination_check_read_the_benchmark():
    import ast

    root = Path(__file__).resolve().parents[1]
    callers = set()
    for path in sorted([*root.glob("coevolve/**/*.py"), *root.glob("flows/**/*.py")]):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in BENCHMARK_READERS
            ):
                callers.add(rel)
    training_side = {c for c in callers if c not in MAY_READ and not c.startswith(MAY_READ_UNDER)}
    assert training_side == set(), f"training-side modules read held-out benchmark tasks: {sorted(training_side)}"
    assert "coevolve/contamination.py" in callers  # the check itself is found by this scan
