"""Security probes: store — a damaged, missing or planted file in a table directory (issue 29).

Each probe builds a scratch store with two rows in every table (``Store.write``; ``tasks`` and
``pool_versions`` through a pool commit), then attacks one table at a time and restores it:

- a recorded part truncated, zero-filled (same size) or emptied, or deleted: held when
  ``Store.read`` and ``coevolve sql "select count(*) from <table>"`` both refuse with one line
  naming the table and the file (a ``StoreError``; the CLI's ``error:``, no traceback), and the
  other tables still read;
- a foreign-schema file in ``signals/`` and a stray part of the right schema in ``rollouts/``
  (in a recorded partition and in a new one): held when both readers return exactly the rows
  written (not a row of nulls, not the stray's rows);
- the fsync order of a local write and its stage marker: held when the part file is fsynced
  before its rename, its directory after it, and both before the manifest and the marker.

The quick form (``fast``) runs on a local store; the full form on S3 too (moto on loopback).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from coevolve.bench.security.probe import Attempt, Probe

DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda b: b[: len(b) // 2],
    "zero-filled": lambda b: bytes(len(b)),
    "zero-byte": lambda b: b"",
}


def _rows(table: str) -> list[dict]:
    from coevolve.schemas import TABLES

    import pyarrow as pa

    text = "task_id" if table == "tasks" else next((f.name for f in TABLES[table] if f.type == pa.string()), None)
    return [{text: f"probe-{i}"} if text else {} for i in range(2)]


def _scratch(uri: str) -> Any:
    from coevolve.schemas import TABLES
    from coevolve.store import Store

    store = Store(uri)
    store.commit_pool(run_id="probe", round_no=1, new_tasks=_rows("tasks"), expected_parent=None)
    for table in TABLES:
        if table not in ("tasks", "pool_versions"):
            store.write(table, 1, "probe", _rows(table))
    return store


@contextmanager
def _stores(work: Path, fast: bool) -> Iterator[list[tuple[str, Any]]]:
    """``[(backend, store)]``: a local scratch store, and (full form) one on S3 (moto)."""
    stores = [("local", _scratch(str(work / "store")))]
    if fast:
        yield stores
        return
    from coevolve.bench.reliability.s3_faults import MotoS3

    saved = {
        k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ENDPOINT_URL")
    }
    moto = MotoS3()
    try:
        os.environ["AWS_ENDPOINT_URL"] = moto.url  # the CLI's store reads its endpoint from here
        # moto's state outlives its server in this process: a bucket of this probe's own
        stores.append(("s3", _scratch(f"s3://{moto.bucket(f'probe-{uuid.uuid4().hex[:12]}')}/store")))
        yield stores
    finally:
        moto.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _bytes(store: Any, path: str) -> bytes:
    with store.fs.open_input_stream(path) as f:
        return f.read()


def _put(store: Any, path: str, body: bytes) -> None:
    with store.fs.open_output_stream(path) as f:
        f.write(body)


def _cli(store: Any, query: str) -> tuple[int, str]:
    from typer.testing import CliRunner

    from coevolve.cli import app

    result = CliRunner().invoke(app, ["sql", "--store", store.uri, "--format", "json", query])
    # the error console wraps long lines at the terminal's width: one message, joined back (a
    # path may be cut anywhere: look for it with the spaces removed)
    return result.exit_code, " ".join(result.output.split())


def _refused(store: Any, table: str, path: str) -> Iterator[tuple[str, bool, str]]:
    """(surface, held, detail) for ``Store.read`` and ``coevolve sql`` of a damaged ``table``."""
    from coevolve.store import StoreError

    shown = f"s3://{path}" if store.is_s3 else path
    name = path.rsplit("/", 1)[-1]
    try:
        n = store.read(table).num_rows
        yield "Store.read", False, f"read {n} rows"
    except StoreError as exc:
        message = str(exc)
        ok = f"table {table}" in message and shown in message and "\n" not in message
        yield "Store.read", ok, message[:200]
    except Exception as exc:  # noqa: BLE001 - a raw library error is the finding
        yield "Store.read", False, f"raw {type(exc).__name__}: {str(exc)[:160]}"
    code, output = _cli(store, f"select count(*) as n from {table}")
    ok = (
        code != 0
        and output.startswith(f"error: table {table}:")
        and name in output.replace(" ", "")
        and "Traceback" not in output
    )
    yield "coevolve sql", ok, output[:200]


def _damaged(kind: str) -> Callable[[Path, bool], Iterator[Attempt]]:
    def run(work: Path, fast: bool) -> Iterator[Attempt]:
        from coevolve.schemas import TABLES

        with _stores(work, fast) as stores:
            for backend, store in stores:
                for table in TABLES:
                    path = store.table_files(table)[0]
                    body = _bytes(store, path)
                    if kind == "missing":
                        store.fs.delete_file(path)
                    else:
                        _put(store, path, DAMAGES[kind](body))
                    for surface, held, detail in _refused(store, table, path):
                        yield Attempt(f"{kind} {table} part ({backend}): {surface}", held, detail)
                    _put(store, path, body)
                    others = [t for t in ("rollouts", "rounds") if t != table]
                    intact = all(store.read(t).num_rows == 2 for t in others)
                    yield Attempt(f"{kind} {table} part ({backend}): restored, all tables read", intact)

    return run


def _planted(table: str, rows_of: Callable[[], Any], what: str) -> Callable[[Path, bool], Iterator[Attempt]]:
    def run(work: Path, fast: bool) -> Iterator[Attempt]:
        import pyarrow.parquet as pq

        with _stores(work, fast) as stores:
            for backend, store in stores:
                for where in ("round=1", "round=9"):  # a recorded partition and a new one
                    directory = f"{store.table_dir(table)}/{where}"
                    store.fs.create_dir(directory)
                    pq.write_table(rows_of(), f"{directory}/planted.parquet", filesystem=store.fs)
                    try:
                        got = store.read(table)
                        values = got.column(got.column_names[0]).to_pylist()
                        held = got.num_rows == 2 and None not in values and set(got.column("round").to_pylist()) == {1}
                        detail = f"{got.num_rows} rows"
                    except Exception as exc:  # noqa: BLE001 - refusing to read the table is not holding
                        held, detail = False, f"{type(exc).__name__}: {str(exc)[:160]}"
                    yield Attempt(f"{what} in {table}/{where} ({backend}): Store.read", held, detail)
                    code, output = _cli(store, f"select count(*) as n from {table}")
                    yield Attempt(
                        f"{what} in {table}/{where} ({backend}): coevolve sql",
                        code == 0 and '"n": 2' in output,
                        output[:160],
                    )

    return run


def _foreign() -> Any:
    import pyarrow as pa

    return pa.table({"foreign_id": ["x", "y", "z"], "payload": [1, 2, 3]})


def _stray() -> Any:
    from coevolve.schemas import to_table

    return to_table("rollouts", [{"run_id": "stray", "task_id": "s", "step": 9}])


def _fsync_order(work: Path, fast: bool) -> Iterator[Attempt]:
    """Trace ``os.fsync`` / ``os.replace`` / ``os.link`` of one write and its stage marker."""
    from coevolve.store import Store

    store = Store(str(work / "store"))
    store.write("rollouts", 0, "warm", _rows("rollouts"))
    events: list[tuple[str, str]] = []
    fsync, replace, link = os.fsync, os.replace, os.link

    def traced_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def traced(kind: Callable[..., Any]) -> Callable[..., Any]:
        def call(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            events.append(("rename", str(dst)))
            return kind(src, dst, *args, **kwargs)

        return call

    os.fsync, os.replace, os.link = traced_fsync, traced(replace), traced(link)  # type: ignore[assignment]
    try:
        store.write("rollouts", 1, "run", _rows("rollouts"))
        store.mark_stage("run", 1, "train", {"rows": 2})
    finally:
        os.fsync, os.replace, os.link = fsync, replace, link  # type: ignore[assignment]
    part = next(f for f in store.table_files("rollouts") if "/round=1/" in f)
    partition = part.rsplit("/", 1)[0]
    marker = f"{store.root}/runs/run/round=1/train.json"

    def first(pred: Callable[[tuple[str, str]], bool], after: int = -1) -> int:
        return next((i for i, e in enumerate(events) if i > after and pred(e)), len(events) + 1)

    synced = first(lambda e: e[0] == "fsync" and e[1].startswith(f"{part}."))
    renamed = first(lambda e: e == ("rename", part))
    dir_synced = first(lambda e: e == ("fsync", partition), renamed)
    yield Attempt(
        "part: file fsynced, renamed, directory fsynced", synced < renamed < dir_synced <= len(events), str(events[:4])
    )
    recorded = first(lambda e: e == ("rename", f"{partition}/_manifest.json"))
    yield Attempt("manifest recorded after the part is durable", dir_synced < recorded <= len(events))
    marked = first(lambda e: e == ("rename", marker))
    marker_synced = first(lambda e: e[0] == "fsync" and e[1].startswith(f"{marker}."))
    marker_dir = first(lambda e: e == ("fsync", marker.rsplit("/", 1)[0]), marked)
    yield Attempt(
        "stage marker after data and manifest, itself fsynced",
        recorded < marker_synced < marked < marker_dir <= len(events),
    )


PROBES: tuple[Probe, ...] = (
    Probe("store-truncated-part", "store", "truncate a recorded part of every table", _damaged("truncated")),
    Probe(
        "store-zero-filled-part",
        "store",
        "zero-fill a recorded part (same size) of every table",
        _damaged("zero-filled"),
    ),
    Probe("store-zero-byte-part", "store", "empty a recorded part of every table", _damaged("zero-byte")),
    Probe("store-missing-part", "store", "delete a recorded part of every table", _damaged("missing")),
    Probe(
        "store-foreign-signals-part",
        "store",
        "drop a foreign-schema Parquet file into signals/",
        _planted("signals", _foreign, "foreign-schema file"),
    ),
    Probe(
        "store-stray-part",
        "store",
        "drop an unrecorded part of the right schema into rollouts/",
        _planted("rollouts", _stray, "stray part"),
    ),
    Probe("store-fsync-order", "store", "a power loss leaves a marker beside a zero-length part", _fsync_order),
)
