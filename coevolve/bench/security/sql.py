"""Security probes: sql — ``coevolve sql`` must be read-only over the store (issue 29).

Each attempt runs the real CLI command against a scratch store written with ``Store.write``
and judges it: held when the statement is refused with a one-line error, nothing was written
(inside or outside the store), nothing from outside the store reached the output, and the
store still answers a query afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from coevolve.bench.security.probe import Attempt, Probe


def _scratch(store_dir: Path) -> None:
    from coevolve.store import Store

    rows = [{"run_id": "run", "task_id": f"t{i}", "step": i} for i in range(3)]
    Store(str(store_dir)).write("rollouts", 1, "run", rows)


def _cli(store_dir: Path, query: str) -> tuple[int, str]:
    from typer.testing import CliRunner

    from coevolve.cli import app

    result = CliRunner().invoke(app, ["sql", "--store", str(store_dir), "--format", "json", query])
    # the error console wraps long lines at the terminal's width: one message, joined back
    return result.exit_code, " ".join(result.output.split())


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _shell(work: Path, fast: bool) -> Iterator[Attempt]:
    secret = work / "secret.txt"
    secret.write_text("SECRET-OUTSIDE-THE-STORE\n")
    outside = work / "outside"
    attempts = [
        ("COPY over the store's pool/LATEST", "copy (select 999) to '{store}/pool/LATEST' (format csv, header false)"),
        ("COPY to a file outside the store", f"copy (select 1 as x) to '{outside}.csv'"),
        ("a read, then a COPY, in one call", f"select 1; copy (select 1 as x) to '{outside}-2.csv'"),
        ("read_text of a file outside the store", f"select content from read_text('{secret}')"),
        ("read_csv('/etc/passwd')", "select * from read_csv('/etc/passwd')"),
        ("glob outside the store", f"select file from glob('{work}/**')"),
        ("ATTACH a new database file", f"attach '{outside}.db' as x"),
        ("CREATE TABLE", "create table t as select 1 as x"),
        ("DROP VIEW rollouts", "drop view rollouts"),
        ("INSTALL httpfs", "install httpfs"),
        ("LOAD httpfs", "load httpfs"),
        ("SET enable_external_access", "set enable_external_access = true"),
        ("PRAGMA that changes config", "pragma threads = 1"),
        (
            "read_text of a file outside the store in a subquery",
            f"select (select content from read_text('{secret}')) as c",
        ),
    ]
    for i, (what, query) in enumerate(attempts):
        # a store of its own per attempt, so that one that got through does not fail the next
        store_dir = work / f"store-{i}"
        _scratch(store_dir)
        (store_dir / "pool").mkdir(exist_ok=True)  # so that a COPY into pool/ would land
        before, around = _files(store_dir), set(work.iterdir())
        code, output = _cli(store_dir, query.replace("{store}", str(store_dir)))
        after = _files(store_dir)
        wrote = sorted({k for k in after if before.get(k) != after[k]} | {k for k in before if k not in after})
        wrote += sorted(p.name for p in set(work.iterdir()) - around)
        leaked = "SECRET-OUTSIDE" in output or "root:x:" in output
        still_ok, _ = _cli(store_dir, "select count(*) as n from rollouts")
        refused = code != 0 and output.startswith("error:") and "Traceback" not in output
        held = refused and not wrote and not leaked and still_ok == 0
        why = output[:160] if output else f"exit {code}, no message"
        if wrote:
            why = f"wrote {', '.join(wrote)}; " + why
        if leaked:
            why = "leaked outside data; " + why
        if still_ok != 0:
            why = "the store no longer answers; " + why
        yield Attempt(what, held, why)
    store_dir = work / "store-read"
    _scratch(store_dir)
    code, output = _cli(store_dir, "select count(*) as n from rollouts")
    yield Attempt("a read still answers", code == 0 and '"n": 3' in output, output[:160])


PROBES: tuple[Probe, ...] = (
    Probe(
        name="sql-shell-read-only",
        area="sql",
        attack="coevolve sql writes, attaches, installs, changes config or reads files outside the store",
        run=_shell,
    ),
)
