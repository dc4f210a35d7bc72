"""The security bench's runner: a held attempt, a failed one and a crashing probe each counted as
they are, the table's totals, and the CLI's exit status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from coevolve.bench import security
from coevolve.bench.security import Attempt, Probe, format_table, run_probes


def _held(work: Path, fast: bool) -> Iterator[Attempt]:
    assert work.is_dir() and not any(work.iterdir())  # a scratch directory of its own, empty
    (work / "planted").write_text("x")
    yield Attempt("refused", True, "a clear error")


def _leaks(work: Path, fast: bool) -> Iterator[Attempt]:
    yield Attempt("refused", True)
    yield Attempt("got through", False, "wrote a row")


def _crashes(work: Path, fast: bool) -> Iterator[Attempt]:
    yield Attempt("refused", True)
    raise RuntimeError("the probe broke")


FAKE = [
    Probe("holds", "sql", "write through the shell", _held),
    Probe("leaks", "store", "plant a part", _leaks),
    Probe("crashes", "serve", "call without a key", _crashes),
]


@pytest.fixture
def fake_probes(monkeypatch):
    monkeypatch.setattr(security, "all_probes", lambda: list(FAKE))


def test_each_attempt_is_counted_and_a_crash_counts_as_failed(fake_probes):
    lines: list[str] = []
    results = {r.probe.name: r for r in run_probes(log=lines.append)}
    assert (results["holds"].tried, results["holds"].held, results["holds"].failed) == (1, 1, 0)
    assert (results["leaks"].tried, results["leaks"].held, results["leaks"].failed) == (2, 1, 1)
    assert (results["crashes"].tried, results["crashes"].held, results["crashes"].failed) == (2, 1, 1)
    assert "RuntimeError: the probe broke" in results["crashes"].error
    assert any("FAILED leaks: got through: wrote a row" in line for line in lines)
    table = format_table(list(results.values()))
    assert table.splitlines()[-1].split() == ["all", "3", "5", "3", "2"]


def test_probes_are_chosen_by_area_and_by_name(fake_probes):
    assert [r.probe.name for r in run_probes(areas=["store", "serve"])] == ["leaks", "crashes"]
    assert [r.probe.name for r in run_probes(names=["holds"])] == ["holds"]
    assert run_probes(areas=["stack"]) == []


def test_the_command_exits_1_when_an_attempt_got_through(fake_probes, capsys):
    from typer.testing import CliRunner

    from coevolve.cli.app import app

    runner = CliRunner()
    assert runner.invoke(app, ["bench", "security", "--probes", "holds"]).exit_code == 0
    leaked = runner.invoke(app, ["bench", "security", "--areas", "store"])
    assert leaked.exit_code == 1 and "leaks" in leaked.output
    none = runner.invoke(app, ["bench", "security", "--areas", "nowhere"])
    assert none.exit_code != 0 and "no probe matches" in none.output


def test_every_area_module_is_collected():
    probes = security.all_probes()
    assert all(p.area in {"sql", "store", "stack", "params", "serve"} for p in probes)
    assert len({p.name for p in probes}) == len(probes)  # names are unique: --probes picks one


# ----------------------------------------------------------------------------- store probes (issue 29 item 2)
def test_store_probes_hold_on_a_local_store():
    results = run_probes(fast=True, areas=["store"])
    assert {r.probe.name for r in results} >= {
        "store-truncated-part",
        "store-zero-filled-part",
        "store-zero-byte-part",
        "store-missing-part",
        "store-foreign-signals-part",
        "store-stray-part",
        "store-fsync-order",
    }
    failed = [(r.probe.name, r.error, [a for a in r.attempts if not a.held][:2]) for r in results if r.failed]
    assert not failed, failed


def test_store_probes_fail_when_readers_skip_the_checks(monkeypatch):
    """The probes can fail: with the size and magic checks switched off and read errors left
    raw, a truncated part gets through as a traceback; an unsynced write is seen."""
    from coevolve.store import Store

    monkeypatch.setattr(Store, "_check_part", lambda self, table, path, entry, size: None)
    monkeypatch.setattr(Store, "unreadable", lambda self, table, files, exc: exc)  # the raw error
    (truncated,) = run_probes(fast=True, names=["store-truncated-part"])
    assert truncated.failed > 0
    monkeypatch.setattr("coevolve.store._fsync_dir", lambda path: None)  # renames never made durable
    (order,) = run_probes(fast=True, names=["store-fsync-order"])
    assert order.failed > 0
