"""The named queries in sql/reports/ through `coevolve sql --file`, over a tiny run's store and over
the embedded default's recorded store (tests/data/default-store), and `coevolve sql`'s vertical
layout for results wider than an 80-column terminal (issue 15)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from coevolve.cli import app
from prefect_helpers import FAST

ROOT = Path(__file__).resolve().parents[1]
REPORTS = sorted((ROOT / "sql" / "reports").glob("*.sql"))
DEFAULT_STORE = ROOT / "tests" / "data" / "default-store"
runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory) -> str:
    """Two rounds of the tiny config, then one hand-made signal per kind of fate in round 1:
    a task solved in round 2 (resolved), one signalled again in round 2 (recurred)."""
    from coevolve.config import load_config
    from coevolve.round import run_rounds
    from coevolve.store import Store

    root = tmp_path_factory.mktemp("reports") / "store"
    cfg = load_config(ROOT / "configs" / "tiny.yaml", {**FAST, "store": str(root), "rounds": 2})
    run_rounds(cfg)
    store = Store(str(root))
    sig = {"run_id": "tiny", "signal_type": "boundary", "score": 0.5, "evidence": "{}", "is_new": True}
    store.write(
        "signals",
        1,
        "tiny-test",
        [
            {**sig, "signal_id": "b1", "task_id": "task-a", "rank": 1},
            {**sig, "signal_id": "b2", "task_id": "task-b", "rank": 2},
        ],
    )
    store.write("signals", 2, "tiny-test", [{**sig, "signal_id": "b1", "task_id": "task-b", "rank": 1}])
    store.write(
        "rollouts",
        2,
        "tiny-test",
        [
            {
                "run_id": "tiny",
                "phase": "train",
                "task_id": "task-a",
                "episode_id": "e",
                "sample_idx": 0,
                "turn": 0,
                "step": 0,
                "success": True,
            }
        ],
    )
    return str(root)


def _json(store: str, *args: str) -> list[dict]:
    out = runner.invoke(app, ["sql", "--store", store, "--format", "json", *args])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)


def test_every_report_has_a_header_and_runs(tiny_store):
    assert {p.stem for p in REPORTS} == {"pool_growth", "task_lineage", "signal_resolution", "signal_value"}
    for path in REPORTS:
        header = [line for line in path.read_text().splitlines() if line.startswith("--")]
        text = " ".join(header)
        assert all(k in text for k in ("Grain:", "Parameters:", "Columns:")), path.name
        rows = _json(
            tiny_store, "--file", str(path), *(["--param", "task_id="] if "$task_id" in path.read_text() else [])
        )
        assert rows, f"{path.name} returned nothing on a two-round store"


def test_pool_growth_adds_up_to_each_version(tiny_store):
    rows = _json(tiny_store, "--file", "sql/reports/pool_growth.sql")
    versions = _json(tiny_store, "select version, task_count from pool_versions order by version")
    for v in versions:
        mine = [r for r in rows if r["version"] == v["version"]]
        assert {r["pool_size"] for r in mine} == {v["task_count"]}
    first = [r for r in rows if r["version"] == 1]
    # pool v1: the synthesized seed pool and the held-out synthesized split (evaluation only)
    assert {(r["origin"], r["signal_type"]) for r in first} == {("static", "static"), ("heldout", "heldout")}
    assert not [r for r in rows if r["origin"] == "heldout" and r["version"] > 1]  # frozen in v1
    assert sum(r["added"] for r in rows) == versions[-1]["task_count"]  # pools only grow


def test_task_lineage_reaches_the_exploration_run_and_context(tiny_store):
    explored = _json(tiny_store, "select task_id, seed_task_id from tasks where origin = 'explored' limit 1")[0]
    (row,) = _json(tiny_store, "--file", "sql/reports/task_lineage.sql", "--param", f"task_id={explored['task_id']}")
    assert row["context_task_id"] == explored["seed_task_id"]
    assert row["context_origin"] == "static" and row["context_created_round"] == 0
    assert row["signal_id"] and row["exploration_steps"] > 0 and row["exploration_actions"]
    assert row["verdict_reason"].startswith("accepted")
    all_rows = _json(tiny_store, "--file", "sql/reports/task_lineage.sql", "--param", "task_id=")
    assert len(all_rows) == _json(tiny_store, "select count(*) as n from tasks")[0]["n"]


def test_signal_resolution_counts_later_fates(tiny_store):
    rows = _json(tiny_store, "--file", "sql/reports/signal_resolution.sql")
    (r1,) = [r for r in rows if r["round"] == 1 and r["signal_type"] == "boundary"]
    assert (r1["signals"], r1["solved_later"], r1["recurred"], r1["resolved"], r1["later_rounds"]) == (2, 1, 1, 1, 1)
    (r2,) = [r for r in rows if r["round"] == 2 and r["signal_type"] == "boundary"]
    assert (r2["recurred"], r2["resolved"], r2["later_rounds"]) == (0, 0, 0)


def test_wide_results_switch_to_a_vertical_layout_in_80_columns(tiny_store):
    out = runner.invoke(app, ["sql", "--store", tiny_store, "select * from rounds order by round"], terminal_width=80)
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "-[ record 1 ]" in out.stdout and any(line.startswith("eval_score ") for line in lines)
    narrow = runner.invoke(
        app, ["sql", "--store", tiny_store, "select round, pool_size from rounds"], terminal_width=80
    )
    assert "-[ record" not in narrow.stdout and "pool_size" in narrow.stdout  # narrow results stay a grid


def test_sql_needs_a_query_or_a_file(tiny_store):
    out = runner.invoke(app, ["sql", "--store", tiny_store])
    assert out.exit_code == 2 and "--file" in out.output
    out = runner.invoke(app, ["sql", "--store", tiny_store, "--file", "sql/reports/nope.sql"])
    assert out.exit_code == 2 and "no query file" in out.output


@pytest.fixture(scope="module")
def default_store(tmp_path_factory) -> str:
    """A copy of the embedded default's recorded store (one `make run`: SmolLM2, BFCL-V3, 2 rounds;
    see its README), so that nothing a query does can touch the repository's copy."""
    root = tmp_path_factory.mktemp("default") / "store"
    shutil.copytree(DEFAULT_STORE, root, ignore=shutil.ignore_patterns("README.md"))
    return str(root)


def test_every_report_runs_on_the_embedded_defaults_store(default_store):
    for path in REPORTS:
        params = ["--param", "task_id="] if "$task_id" in path.read_text() else []
        assert _json(default_store, "--file", str(path), *params), f"{path.name} returned nothing"


def test_pool_growth_on_the_embedded_default(default_store):
    rows = _json(default_store, "--file", "sql/reports/pool_growth.sql")
    got = [(r["version"], r["round"], r["origin"], r["signal_type"], r["added"], r["pool_size"]) for r in rows]
    assert got == [
        (1, 0, "static", "static", 55, 55),
        (2, 1, "explored", "fallback", 3, 58),
        (3, 2, "explored", "boundary", 2, 63),
        (3, 2, "explored", "fallback", 3, 63),
    ]


def test_task_lineage_on_the_embedded_default_reaches_a_boundary_signal(default_store):
    (task,) = _json(default_store, "select task_id from tasks where signal_type = 'boundary' order by task_id limit 1")
    (row,) = _json(default_store, "--file", "sql/reports/task_lineage.sql", "--param", f"task_id={task['task_id']}")
    assert (row["created_round"], row["origin"], row["signal_type"]) == (2, "explored", "boundary")
    assert row["signal_id"].startswith("2-boundary-") and row["signal_task_id"] == row["context_task_id"]
    assert (row["context_origin"], row["context_created_round"]) == ("static", 0)
    assert row["exploration_steps"] == len(row["exploration_actions"].split(" > "))
    assert row["verdict_reason"].startswith("accepted")


def test_signal_resolution_on_the_embedded_default(default_store):
    rows = _json(default_store, "--file", "sql/reports/signal_resolution.sql")
    got = [
        (r["round"], r["signal_type"], r["signals"], r["explored"], r["yielded_tasks"], r["later_rounds"]) for r in rows
    ]
    assert got == [(1, "boundary", 1, 1, 0, 1), (2, "boundary", 2, 2, 2, 0)]


def test_signal_value_on_the_embedded_default(default_store):
    rows = _json(default_store, "--file", "sql/reports/signal_value.sql")
    got = {(r["round"], r["signal_type"]): r for r in rows}
    assert set(got) == {(0, "static"), (1, "boundary"), (1, "fallback"), (2, "boundary"), (2, "fallback")}
    # round 1's fallback tasks: 3 yielded, 2 of them by partial credit (read from the reason in a
    # store older than pass_kind), solved in 1 of 6 validation attempts, then 0.75 in round 2
    r = got[(1, "fallback")]
    assert (r["signals"], r["yielded_tasks"], r["partial"]) == (0, 3, 2)
    assert r["success_validate"] == pytest.approx(1 / 6, abs=1e-4) and r["success_next"] == 0.75
    assert r["success_change"] == pytest.approx(0.75 - 1 / 6, abs=1e-4)
    assert (r["eval_score"], r["eval_next"], r["eval_change"]) == (0.0, 0.0, 0.0)
    # round 2: the last round, nothing trained on its tasks yet
    b = got[(2, "boundary")]
    assert (b["signals"], b["yielded_tasks"], b["success_next"], b["eval_next"]) == (2, 2, None, None)
    assert got[(1, "boundary")]["yielded_tasks"] == 0


def test_report_parameters_whose_header_says_empty_is_all_default_to_it(default_store, tmp_path):
    """`--file sql/reports/task_lineage.sql` without `--param task_id=`: every task, as its
    header's `'' = every task` says; a parameter declared without that default stays required."""
    from coevolve.cli.sql import header_defaults

    for path in REPORTS:
        text = path.read_text()
        assert header_defaults(text) == ({"task_id": ""} if "$task_id" in text else {}), path.name
    rows = _json(default_store, "--file", "sql/reports/task_lineage.sql")
    assert len(rows) == _json(default_store, "select count(*) as n from tasks")[0]["n"]
    (one,) = _json(default_store, "--file", "sql/reports/task_lineage.sql", "--param", f"task_id={rows[0]['task_id']}")
    assert one["task_id"] == rows[0]["task_id"]
    required = tmp_path / "required.sql"
    required.write_text(
        "-- required: a report with a parameter that has no default.\n"
        "-- Parameters: $round_no (a round), $name (a signal type;\n"
        "--             '' = all).\n"
        "-- Columns: n.\n"
        "select count(*) as n from tasks where created_round = $round_no and ($name = '' or signal_type = $name)\n"
    )
    assert header_defaults(required.read_text()) == {"name": ""}
    out = runner.invoke(app, ["sql", "--store", default_store, "--file", str(required)])
    assert out.exit_code == 2 and "round_no" in out.output
    assert _json(default_store, "--file", str(required), "--param", "round_no=0")[0]["n"] > 0


def test_sql_help_lists_every_view():
    from coevolve.schemas import TABLES

    out = runner.invoke(app, ["sql", "--help"], terminal_width=400)
    assert out.exit_code == 0
    text = " ".join(out.output.split())
    assert all(name in text for name in TABLES), [n for n in TABLES if n not in text]
