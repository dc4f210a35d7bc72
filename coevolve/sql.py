"""DuckDB over the store: one view per table, defined in ``sql/views/<table>.sql``.

    con = connect(store)                     # local directory or s3://bucket/prefix
    con.sql("select round, count(*) from rollouts group by round").show()

S3 is read through the store's own pyarrow filesystem registered with DuckDB (httpfs
cannot be downloaded offline), so the same credentials and endpoint apply everywhere.
SQL files that take values use DuckDB named parameters (``$run_id``); ``run_sql_file``
runs one of them. For notebooks, ``query(store, sql)`` returns a polars DataFrame and
``scan(store, table)`` a polars LazyFrame over one table. Every reader here reads exactly the
files the store's part manifests record (``Store.table_files``): strays are never read. ``connect(store, read_only=True)``
with ``check_read_only(sql)`` is the ``coevolve sql`` shell's surface: reads of the store only.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from coevolve.schemas import TABLES
from coevolve.store import Store

if TYPE_CHECKING:
    import polars as pl

SQL_DIR = Path(__file__).resolve().parents[1] / "sql"


def _quote(literal: str) -> str:
    return "'" + literal.replace("'", "''") + "'"


class ReadOnlyError(ValueError):
    """A statement given to a read-only connection that is not a read (SELECT or EXPLAIN)."""


READ_STATEMENTS = frozenset({duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN})


def check_read_only(sql: str) -> None:
    """Raise ``ReadOnlyError`` naming the first statement of ``sql`` that is not a SELECT or EXPLAIN.

    DuckDB parses SHOW, DESCRIBE and SUMMARIZE as SELECTs; COPY, CREATE, INSERT, ATTACH,
    INSTALL, LOAD, SET and PRAGMA are refused here (their types are named in the message).
    """
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ReadOnlyError(f"query failed: {str(exc).splitlines()[0]}") from None
    for i, statement in enumerate(statements, 1):
        if statement.type not in READ_STATEMENTS:
            kind = statement.type.name
            raise ReadOnlyError(
                f"statement {i} is {kind}: the SQL shell is read-only over the store (SELECT and EXPLAIN only)"
            )


def _lock(con: duckdb.DuckDBPyConnection, store: Store) -> None:
    """File access only under the store (its directory or S3 prefix), then the configuration locked."""
    root = f"s3://{store.root}/" if store.is_s3 else f"{store.root}/"
    con.execute(f"set allowed_directories = [{_quote(root)}]")
    con.execute("set enable_external_access = false")
    con.execute("set autoinstall_known_extensions = false")
    con.execute("set autoload_known_extensions = false")
    con.execute("set lock_configuration = true")


def connect(
    store: Store, memory_limit: str | None = None, threads: int | None = None, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with a view per table over ``store`` (empty tables included).

    ``read_only`` (the ``coevolve sql`` shell) limits file access to the store's files and locks
    the configuration once the views are made; pass every statement through ``check_read_only``
    too, as the locked connection would still COPY into the store itself.
    """
    # spill files go to the system temp dir, not into whatever directory we run from
    config: dict[str, Any] = {"temp_directory": str(Path(tempfile.gettempdir()) / "coevolve-duckdb")}
    if memory_limit:
        config["memory_limit"] = memory_limit
    if threads:
        config["threads"] = threads
    con = duckdb.connect(config=config)
    if store.is_s3:
        con.register_filesystem(_s3_wrapper(store))
    scheme = "s3://" if store.is_s3 else ""
    for table in TABLES:
        # exactly the recorded files (tasks: those committed pool manifests list), each checked:
        # strays and foreign files are never read, a damaged part raises CorruptPartError
        files = store.table_files(table)
        source = f"[{', '.join(_quote(scheme + f) for f in files)}]" if files else ""
        # every view has every column of the table's schema, in its order: files written before a
        # column was added read it as null (union by name with an empty table of the schema)
        empty = TABLES[table].append(pa.field("round", pa.int32())).empty_table()
        con.register(f"_{table}_empty", empty)
        if source:
            view = (SQL_DIR / "views" / f"{table}.sql").read_text().replace("{{source}}", source)
            head = f"create or replace view {table} as"
            if head not in view:
                raise RuntimeError(f"sql/views/{table}.sql must define its view with '{head} ...'")
            try:  # DuckDB reads every file's footer here: a part that is not Parquet fails now
                con.execute(view.replace(head, f"create or replace view _{table}_files as", 1))
            except duckdb.Error as exc:
                raise store.unreadable(table, files, exc) from None
            con.execute(
                f"create or replace view {table} as select * from _{table}_empty union all by name select * from _{table}_files"
            )
        else:
            con.execute(f"create or replace view {table} as select * from _{table}_empty")
    if read_only:
        _lock(con, store)
    return con


def _s3_wrapper(store: Store) -> Any:
    from fsspec.implementations.arrow import ArrowFSWrapper

    class S3ArrowFS(ArrowFSWrapper):
        protocol = "s3"  # DuckDB routes s3:// paths to the filesystem with this protocol

    return S3ArrowFS(store.fs)


def run_sql_file(con: duckdb.DuckDBPyConnection, relpath: str, **params: Any) -> duckdb.DuckDBPyRelation:
    """Run ``sql/<relpath>`` with named parameters, e.g. ``run_sql_file(con, "signals/rare.sql", round=1)``."""
    text = (SQL_DIR / relpath).read_text()
    return con.execute(text, params)


# ----------------------------------------------------------------------------- polars
def query(store: Store | duckdb.DuckDBPyConnection, sql: str, **params: Any) -> "pl.DataFrame":
    """Run ``sql`` over the store's views (named parameters as ``$name``); a polars DataFrame.

    query(store, "select round, avg(eval_score) s from rounds group by round order by round")
    """
    con = connect(store) if isinstance(store, Store) else store
    return con.sql(sql, params=params or None).pl()


def query_file(store: Store | duckdb.DuckDBPyConnection, relpath: str, **params: Any) -> "pl.DataFrame":
    """``query`` with the text of ``sql/<relpath>``."""
    return query(store, (SQL_DIR / relpath).read_text(), **params)


def scan(store: Store, table: str) -> "pl.LazyFrame":
    """A polars LazyFrame over one table of the store (local or S3), ``round`` included."""
    import polars as pl

    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    files = store.table_files(table)
    if not files:
        return pl.from_arrow(TABLES[table].append(pa.field("round", pa.int32())).empty_table()).lazy()
    options = None
    if store.is_s3:
        import os

        options = {
            k: v
            for k, v in {
                "aws_endpoint_url": store.s3_settings.get("endpoint_url"),
                "aws_region": store.s3_settings.get("region"),
                "aws_access_key_id": os.environ.get("AWS_ACCESS_KEY_ID"),
                "aws_secret_access_key": os.environ.get("AWS_SECRET_ACCESS_KEY"),
                "aws_session_token": os.environ.get("AWS_SESSION_TOKEN"),
            }.items()
            if v
        }
    return pl.scan_parquet(
        [f"s3://{f}" if store.is_s3 else f for f in files],
        hive_partitioning=True,
        hive_schema={"round": pl.Int32},
        storage_options=options,
        missing_columns="insert",
    )
