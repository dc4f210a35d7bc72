"""``coevolve sql``: query the store's tables with DuckDB.

    coevolve sql "select round, count(*) from rollouts group by round order by round"
    coevolve sql --store s3://bucket/prefix --format csv "select * from rounds"
    coevolve sql --file sql/reports/task_lineage.sql --param task_id=... --store S

In table format a result wider than the terminal is printed one record at a time
(``--layout vertical``, like psql's expanded display) instead of as collapsed columns.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path

import typer

from coevolve.cli.app import app
from coevolve.cli.common import console, fail, open_store_or_fail, parse_sets


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


class Layout(str, Enum):
    auto = "auto"
    table = "table"
    vertical = "vertical"


def _cell(v) -> str:
    return "" if v is None else str(v)


def _natural_width(names: list[str], rows: list[dict]) -> int:
    """Columns side by side, nothing wrapped: the widest line of each cell, plus borders."""
    widths = [max([len(n)] + [max(map(len, _cell(r[n]).splitlines() or [""])) for r in rows]) for n in names]
    return sum(widths) + 3 * len(widths) + 1


def print_vertical(names: list[str], rows: list[dict], width: int) -> None:
    """One record after another, a 'column | value' line each, values wrapped to ``width``."""
    import textwrap

    key_w = min(max(map(len, names)), max(8, width // 3))
    value_w = max(10, width - key_w - 3)
    for i, row in enumerate(rows, 1):
        console.print(f"-[ record {i} ]".ljust(width, "-"), markup=False, highlight=False)
        for name in names:
            lines = [
                w for line in (_cell(row[name]).splitlines() or [""]) for w in (textwrap.wrap(line, value_w) or [""])
            ]
            for j, line in enumerate(lines):
                console.print(
                    f"{(name if j == 0 else '')[:key_w]:<{key_w}} | {line}",
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )


def header_defaults(text: str) -> dict[str, str]:
    """The parameters a query file's header declares with ``''`` meaning "all", each as ``''``:
    ``-- Parameters: $task_id (a task id; '' = every task).`` gives ``{"task_id": ""}``, so that
    ``--file sql/reports/task_lineage.sql`` without ``--param`` reports every task. Parameters
    declared without such a default stay required (DuckDB names the missing one)."""
    import re

    lines = text.splitlines()
    block: list[str] = []
    for i, line in enumerate(lines):
        if not line.startswith("--"):
            break  # the header is the file's leading comment block
        if line[2:].strip().lower().startswith("parameters:"):
            block.append(line[2:])
            # continuation lines: indented comments before the next "-- Name:" field
            for more in lines[i + 1 :]:
                if not more.startswith("--") or re.match(r"--\s?[A-Z][\w ]*:", more):
                    break
                block.append(more[2:])
            break
    declared = re.findall(r"\$(\w+)\s*\(([^)]*)\)", " ".join(block))
    return {name: "" for name, note in declared if re.search(r"''\s*=", note)}


def _flat(table):
    """CSV has no nested types: write lists and structs as JSON text."""
    import json

    import pyarrow as pa

    for i, field in enumerate(table.schema):
        if pa.types.is_nested(field.type):
            values = [None if v is None else json.dumps(v, default=str) for v in table.column(i).to_pylist()]
            table = table.set_column(i, field.name, pa.array(values, pa.string()))
    return table


@app.command()
def sql(
    query: str = typer.Argument(
        None,
        help="SQL over the views: tasks, pool_versions, rollouts, signals, explorations, candidates, rounds, ablations, train_steps.",
    ),
    file: Path = typer.Option(
        None, "--file", help="Run the query in this file instead (e.g. sql/reports/pool_growth.sql)."
    ),
    param: list[str] = typer.Option(
        [],
        "--param",
        "-p",
        help="A named parameter of the query: --param task_id=abc (repeatable; values parsed as YAML scalars). "
        "A --file report's parameters whose header says '' = all default to ''.",
    ),
    store: str = typer.Option(".coevolve/store", "--store", "-s", help="Local directory or s3://bucket/prefix."),
    format: OutputFormat = typer.Option(
        OutputFormat.table, "--format", "-f", help="table (for people), csv or json (for scripts)."
    ),
    layout: Layout = typer.Option(
        Layout.auto,
        help="Table format: side by side, one record at a time (vertical), or auto (vertical when wider than the terminal).",
    ),
    max_rows: int = typer.Option(200, help="Rows shown in table format."),
) -> None:
    """Run a SQL query (or a query file) over the store and print the result."""
    import duckdb

    from coevolve.sql import ReadOnlyError, check_read_only, connect
    from coevolve.store import StoreError

    if (query is None) == (file is None):
        fail("give either a query or --file FILE (e.g. --file sql/reports/pool_growth.sql)")
    if file is not None:
        if not file.is_file():
            fail(f"no query file {file}")
        query = file.read_text()
    # "key=" is the empty string (YAML would read it as null, which matches nothing in SQL)
    params = {k: "" if v is None else v for k, v in parse_sets(param).items()}
    if file is not None:  # a report's optional parameters ('' = all) default to ''
        params = {**header_defaults(query), **params}
    try:
        check_read_only(query)
    except ReadOnlyError as exc:
        fail(str(exc))
    st = open_store_or_fail(store)
    try:
        con = connect(st, read_only=True)
    except StoreError as exc:  # a recorded part missing, truncated or not Parquet: named, one line
        fail(str(exc))
    try:
        result = con.sql(query, params=params or None)
    except duckdb.Error as exc:
        fail(f"query failed: {' '.join(str(exc).split())}")
    if result is None:  # a statement without a result set
        return
    table = result.to_arrow_table() if hasattr(result, "to_arrow_table") else result.arrow()
    if format is OutputFormat.csv:
        import pyarrow.csv as pacsv

        pacsv.write_csv(_flat(table), sys.stdout.buffer)
    elif format is OutputFormat.json:
        import json

        sys.stdout.write(json.dumps(table.to_pylist(), default=str) + "\n")
    else:
        from rich.table import Table

        rows = table.slice(0, max_rows).to_pylist()
        names = table.column_names
        vertical = layout is Layout.vertical or (layout is Layout.auto and _natural_width(names, rows) > console.width)
        if vertical:
            print_vertical(names, rows, console.width)
        else:
            out = Table(*names, show_lines=False)
            for row in rows:
                out.add_row(*(_cell(v) for v in row.values()))
            console.print(out)
        if table.num_rows > max_rows:
            console.print(f"[dim]{table.num_rows - max_rows} more rows (use --max-rows or --format csv)[/dim]")
