"""``coevolve sql``: query the store's tables with DuckDB.

    coevolve sql "select round, count(*) from rollouts group by round order by round"
    coevolve sql --store s3://bucket/prefix --format csv "select * from rounds"
"""

from __future__ import annotations

import sys
from enum import Enum

import typer

from coevolve.cli.app import app
from coevolve.cli.common import console, fail, open_store_or_fail


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


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
    query: str = typer.Argument(..., help="SQL over the views: tasks, pool_versions, rollouts, signals, explorations, candidates, rounds."),
    store: str = typer.Option(".coevolve/store", "--store", "-s", help="Local directory or s3://bucket/prefix."),
    format: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f", help="table (for people), csv or json (for scripts)."),
    max_rows: int = typer.Option(200, help="Rows shown in table format."),
) -> None:
    """Run a SQL query over the store and print the result."""
    import duckdb

    from coevolve.sql import connect

    st = open_store_or_fail(store)
    con = connect(st)
    try:
        result = con.sql(query)
    except duckdb.Error as exc:
        fail(f"query failed: {exc}")
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

        out = Table(*table.column_names, show_lines=False)
        for row in table.slice(0, max_rows).to_pylist():
            out.add_row(*("" if v is None else str(v) for v in row.values()))
        console.print(out)
        if table.num_rows > max_rows:
            console.print(f"[dim]{table.num_rows - max_rows} more rows (use --max-rows or --format csv)[/dim]")
