"""`coevolve sql`: views over local and S3 stores, output formats, errors."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.sql import connect
from coevolve.store import Store

runner = CliRunner()


def _fill(store: Store) -> None:
    for r in (1, 2):
        store.write("rollouts", r, "run", [{"run_id": "run", "task_id": f"t{i}", "step": i} for i in range(r + 1)])
    store.write("signals", 2, "run-signals", [{"run_id": "run", "signal_id": "s", "signal_type": "rare", "score": 1.0}])


def test_views_over_local_store(tmp_path):
    store = Store(str(tmp_path))
    _fill(store)
    con = connect(store)
    assert con.sql("select round, count(*) from rollouts group by round order by round").fetchall() == [(1, 2), (2, 3)]
    assert con.sql("select signal_type from signals").fetchall() == [("rare",)]
    assert con.sql("select count(*) from candidates").fetchall() == [(0,)]  # empty tables still have views


def test_views_over_s3_store(s3_endpoint, s3_bucket):
    store = Store(f"s3://{s3_bucket}/p", endpoint_url=s3_endpoint)
    _fill(store)
    con = connect(store)
    assert con.sql("select sum(step) from rollouts where round = 2").fetchall() == [(3,)]


def test_cli_formats_and_errors(tmp_path):
    store = Store(str(tmp_path))
    _fill(store)
    q = "select round, count(*) as n from rollouts group by round order by round"
    out = runner.invoke(app, ["sql", "--store", str(tmp_path), "--format", "json", q])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == [{"round": 1, "n": 2}, {"round": 2, "n": 3}]
    out = runner.invoke(app, ["sql", "--store", str(tmp_path), "--format", "csv", q])
    assert out.stdout.splitlines() == ['"round","n"', "1,2", "2,3"]
    out = runner.invoke(app, ["sql", "--store", str(tmp_path), q])
    assert "round" in out.stdout and out.exit_code == 0
    out = runner.invoke(app, ["sql", "--store", str(tmp_path), "select * from nope"])
    assert out.exit_code == 2 and "query failed" in out.output
    out = runner.invoke(app, ["sql", "--store", str(tmp_path / "missing"), "select 1"])
    assert out.exit_code == 2 and "no store" in out.output
