"""The ``coevolve sql`` shell is read-only over the store (issue 29)."""

from __future__ import annotations

import duckdb
import pytest
from typer.testing import CliRunner

from coevolve.bench.security.sql import PROBES
from coevolve.cli import app
from coevolve.sql import ReadOnlyError, check_read_only, connect
from coevolve.store import Store

runner = CliRunner()


def _store(tmp_path) -> Store:
    store = Store(str(tmp_path / "store"))
    store.write("rollouts", 1, "run", [{"run_id": "run", "task_id": f"t{i}", "step": i} for i in range(3)])
    return store


def _files(root):
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("query", "kind"),
    [
        ("copy (select 1) to 'x.csv'", "COPY"),
        ("create table t as select 1", "CREATE"),
        ("insert into rollouts select * from rollouts", "INSERT"),
        ("attach 'x.db'", "ATTACH"),
        ("install httpfs", "LOAD"),
        ("load httpfs", "LOAD"),
        ("set threads = 1", "SET"),
        ("pragma enable_profiling", "PRAGMA"),
        ("pragma threads = 1", "SET"),
        ("drop view rollouts", "DROP"),
        ("select 1; copy (select 1) to 'x.csv'", "COPY"),
    ],
)
def test_writes_refused_naming_the_statement_type(query, kind):
    with pytest.raises(ReadOnlyError, match=rf"is {kind}\b.*read-only"):
        check_read_only(query)


def test_reads_allowed():
    for query in ("select 1", "explain select 1", "with a as (select 1) select * from a", "describe select 1"):
        check_read_only(query)


def test_cli_refuses_copy_into_the_store_and_writes_nothing(tmp_path):
    store = _store(tmp_path)
    (tmp_path / "store" / "pool").mkdir()
    before = _files(tmp_path / "store")
    target = tmp_path / "store" / "pool" / "LATEST"
    result = runner.invoke(app, ["sql", "--store", store.uri, f"copy (select 999) to '{target}'"])
    assert result.exit_code == 2
    assert "COPY" in result.output and "read-only" in result.output and "Traceback" not in result.output
    assert _files(tmp_path / "store") == before


def test_locked_connection_reads_the_store_but_no_file_outside(tmp_path):
    store = _store(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    con = connect(store, read_only=True)
    assert con.sql("select count(*) from rollouts").fetchall() == [(3,)]
    with pytest.raises(duckdb.PermissionException):
        con.sql(f"select * from read_text('{secret}')").fetchall()
    with pytest.raises(duckdb.Error, match="locked"):
        con.execute("set enable_external_access = true")


def test_cli_outside_read_is_a_one_line_error(tmp_path):
    store = _store(tmp_path)
    result = runner.invoke(app, ["sql", "--store", store.uri, "select * from read_csv('/etc/passwd')"])
    assert result.exit_code == 2
    assert result.output.startswith("error: query failed:") and "root:" not in result.output


def test_internal_connect_unlocked(tmp_path):
    con = connect(_store(tmp_path))  # signal mining and reports register tables and views of their own
    con.execute("create temp table t as select 1 as x")
    assert con.sql("select x from t").fetchall() == [(1,)]


def test_probes_hold(tmp_path):
    for probe in PROBES:
        work = tmp_path / probe.name
        work.mkdir()
        attempts = list(probe.run(work, True))
        assert attempts and all(a.held for a in attempts), [a for a in attempts if not a.held]


def test_locked_s3_connection_reads_only_its_prefix(s3_endpoint, s3_bucket):
    store = Store(f"s3://{s3_bucket}/p", endpoint_url=s3_endpoint)
    store.write("rollouts", 1, "run", [{"run_id": "run", "task_id": "t", "step": 4}])
    Store(f"s3://{s3_bucket}/other", endpoint_url=s3_endpoint).write(
        "rollouts", 1, "run", [{"run_id": "run", "task_id": "t", "step": 5}]
    )
    con = connect(store, read_only=True)
    assert con.sql("select sum(step) from rollouts").fetchall() == [(4,)]
    with pytest.raises(duckdb.PermissionException):
        con.sql(f"select * from read_parquet('s3://{s3_bucket}/other/tables/rollouts/*/*.parquet')").fetchall()
