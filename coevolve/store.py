"""The store: every table as hive-partitioned Parquet, pool versions as JSON manifests.

Layout under the root (a local directory or ``s3://bucket/prefix``)::

    tables/<table>/round=<r>/<part>.<token>.parquet
                                              # rows of one write of part <part>; every write
                                              # gets a fresh file, so a recorded file never changes
    tables/<table>/round=<r>/_manifest.json   # the parts of this table and round: part -> file,
                                              # size, sha256, rows (what readers read)
    tables/_manifests.json                    # this store records its parts (see "older stores")
    tables/tasks/round=<r>/pool-v<n>-<run>-<attempt>.<token>.parquet
                                              # the new tasks of one commit attempt
    pool/v000003.json                          # immutable manifest of pool version 3
    pool/LATEST                                # pointer, moved only by compare-and-swap
    runs/<run_id>/round=<r>/<stage>.json       # stage completion markers (resume)
    checkpoints/<run_id>/round=<r>/            # the round's trained policy (coevolve.checkpoints)

Writing a part (``write``): the Parquet bytes go to a new file (locally: a temporary name,
fsynced, renamed, the directory fsynced; on S3 one PUT), then the partition's manifest records
it by compare-and-swap, then the part's previous file, if any, is deleted. Part names are
deterministic, so a rerun replaces a part instead of duplicating it. A crash before the manifest
update leaves a stray file no manifest lists; after it, the new file is the part. A manifest also
lists the files it recently stopped recording (``retired``), so a retried swap whose first try
landed unanswered never records again a file a later writer has replaced and deleted. Stage markers
(``mark_stage``) are JSON documents written (and fsynced) after the stage's data, so a durable
marker always sits beside durable, recorded parts.

Reading (``read``, ``table_files``, the DuckDB views of ``coevolve.sql``): only the files the
manifests record. Strays (a crashed write, a file dropped in by hand, a foreign-schema file) are
ignored. A recorded file that is missing, of another size than recorded, or not Parquet (a
zero-filled file) is a ``StoreError`` naming the table and the path. ``verify`` also checks every
recorded file's sha256.

Older stores (written before manifests) have no ``tables/_manifests.json``: readers read every
Parquet file of their partitions, as before, and log a warning once. The first write to such a
store adopts them: each partition without a manifest gets one listing its files as they are, then
the marker is written; from then on only recorded files are read.

Pool versions (``pool/``) are read and committed by ``coevolve.pool_commit``, whose
docstring is the commit protocol: what each step writes and what a crash between them leaves.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from coevolve.pool_commit import PoolCommits
from coevolve.schemas import TABLES, to_table
from coevolve.store_errors import ConcurrentCommitError, CorruptPartError, StoreError

__all__ = ["ConcurrentCommitError", "CorruptPartError", "S3Client", "Store", "StoreError", "open_store"]

log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"  # per table and round: the recorded parts
FORMAT_KEY = "tables/_manifests.json"  # present once a store records its parts
RETIRED_KEPT = 256  # files a manifest remembers as unrecorded (a lost answer's retry window)


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300] or type(exc).__name__


def _fsync_dir(path: str) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _s3_settings(endpoint_url: str = "", region: str = "") -> dict[str, str]:
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL", "")
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return {"endpoint_url": endpoint, "region": region}


@dataclass(frozen=True)
class S3Client:
    """Retry and timeout settings of the S3 clients (boto3 and pyarrow); see ``config.S3Config``."""

    retry_mode: str = "standard"  # botocore retry mode: 'standard' or 'adaptive' (pyarrow: standard)
    max_attempts: int = 5  # attempts per request, the first included
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0

    @classmethod
    def of(cls, cfg: Any) -> "S3Client":
        """From any object with these attribute names (``config.S3Config``)."""
        return cls(
            **{f: getattr(cfg, f) for f in ("retry_mode", "max_attempts", "connect_timeout_s", "read_timeout_s")}
        )

    def boto_config(self) -> Any:
        from botocore.config import Config

        return Config(
            retries={"mode": self.retry_mode, "total_max_attempts": self.max_attempts},
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
        )

    def arrow_options(self) -> dict[str, Any]:
        return {
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=self.max_attempts),
            "connect_timeout": self.connect_timeout_s,
            "request_timeout": self.read_timeout_s,
        }


class Store(PoolCommits):
    """One object through which every stage reads and writes (local or S3); its pool versions
    (``latest_pool``, ``commit_pool``, ``pool_tasks``, ...) come from ``PoolCommits``."""

    def __init__(self, uri: str, *, endpoint_url: str = "", region: str = "", client: S3Client | None = None):
        self.uri = uri.rstrip("/")
        client = client or S3Client()
        self._lock = threading.Lock()
        self._recording = False  # the store records its parts (cached once seen)
        self._warned = False  # the older-store warning was logged
        if self.uri.startswith("s3://"):
            bucket_and_prefix = self.uri[len("s3://") :]
            self.bucket, _, self.prefix = bucket_and_prefix.partition("/")
            if not self.bucket:
                raise StoreError(f"store URI {uri!r} names no bucket")
            s3 = _s3_settings(endpoint_url, region)
            self.s3_settings = s3
            self.fs: pafs.FileSystem = pafs.S3FileSystem(
                endpoint_override=s3["endpoint_url"] or None,
                region=s3["region"],
                access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
                secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
                session_token=os.environ.get("AWS_SESSION_TOKEN"),
                allow_bucket_creation=False,
                **client.arrow_options(),
            )
            self.root = f"{self.bucket}/{self.prefix}".rstrip("/")
            import boto3  # only S3 stores need it

            self._s3 = boto3.client(
                "s3", endpoint_url=s3["endpoint_url"] or None, region_name=s3["region"], config=client.boto_config()
            )
        else:
            self.bucket = self.prefix = ""
            self.s3_settings = {}
            self.fs = pafs.LocalFileSystem()
            self.root = str(Path(self.uri).expanduser().resolve())
            self._s3 = None

    @property
    def is_s3(self) -> bool:
        return self._s3 is not None

    def check_reachable(self) -> None:
        """Fail fast, with the URI in the message, if the store cannot be used."""
        if self.is_s3:
            try:
                self._s3.head_bucket(Bucket=self.bucket)
            except Exception as exc:  # botocore raises many kinds
                raise StoreError(f"store {self.uri} is unreachable: {exc}") from None
        else:
            parent = Path(self.root)
            while not parent.exists():
                parent = parent.parent
            if not os.access(parent, os.W_OK):
                raise StoreError(f"store {self.uri} is not writable (checked {parent})")

    # ------------------------------------------------------------------ tables
    def table_dir(self, table: str) -> str:
        if table not in TABLES:
            raise StoreError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
        return f"{self.root}/tables/{table}"

    def table_uri(self, table: str) -> str:
        """The URI DuckDB and polars read (``s3://...`` or a local path)."""
        d = self.table_dir(table)
        return f"s3://{d}" if self.is_s3 else d

    def _partition(self, table: str, round_no: int) -> str:
        return f"{self.table_dir(table)}/round={int(round_no)}"

    def write(self, table: str, round_no: int, part: str, rows: list[dict] | pa.Table) -> int:
        """Write ``rows`` as part ``part`` of ``table`` in partition ``round``; replaces a
        part of the same name (so reruns never duplicate). Returns the row count.

        The rows go to a new file (fsynced, with its directory, before and after the rename),
        the partition's manifest then records it (compare-and-swap), then the part's previous
        file is deleted: at every point readers see either the old part or the new one."""
        data = to_table(table, rows)
        self._adopt_older_parts()
        sink = pa.BufferOutputStream()
        pq.write_table(data, sink, compression="zstd")
        body = sink.getvalue().to_pybytes()
        directory = self._partition(table, round_no)
        name = f"{part}.{uuid.uuid4().hex[:16]}.parquet"
        self._put_file(f"{directory}/{name}", body)
        entry = {"file": name, "size": len(body), "sha256": hashlib.sha256(body).hexdigest(), "rows": data.num_rows}

        replaced: list[dict] = []

        def record(parts: dict[str, Any], retired: frozenset[str]) -> bool:
            # A retried compare-and-swap whose first try landed (its answer lost) finds this file
            # recorded, or already replaced by a later writer (who may have deleted it): done.
            if name in retired or parts.get(part, {}).get("file") == name:
                return False
            replaced[:] = [parts[part]] if part in parts else []
            parts[part] = entry
            return True

        self._update_manifest(table, round_no, record)
        for previous in replaced:
            self._delete_quietly(f"{directory}/{previous['file']}")
        return data.num_rows

    def has_part(self, table: str, round_no: int, part: str) -> bool:
        """Whether ``part`` of ``table``/``round`` is recorded (in an older store: its file exists)."""
        doc = self._get_manifest(table, round_no)
        if doc is not None:
            return part in doc["parts"]
        return not self._manifests_on() and self._exists(f"{self._partition(table, round_no)}/{part}.parquet")

    def delete_parts(self, table: str, round_no: int, prefix: str) -> int:
        """Delete the parts of ``table``/``round`` whose name starts with ``prefix`` (first from
        the manifest, then their files, and stray files of such parts too); returns the number
        of files deleted."""
        self._adopt_older_parts()
        directory = self._partition(table, round_no)

        def drop(parts: dict[str, Any], retired: frozenset[str]) -> bool:
            gone = [k for k in parts if k.startswith(prefix)]
            for k in gone:
                del parts[k]
            return bool(gone)

        if self._get_manifest(table, round_no) is not None:
            self._update_manifest(table, round_no, drop)
        n = 0
        for info in self._list(directory):
            name = info.path.rsplit("/", 1)[-1]
            if name.startswith(prefix) and name.endswith(".parquet"):
                self._delete_quietly(info.path)
                n += 1
        return n

    def table_files(self, table: str) -> list[str]:
        """The Parquet files a reader of ``table`` reads: the files the table's manifests record,
        each checked (present, of its recorded size, Parquet); for ``tasks``, of those exactly the
        files committed pool manifests list (a crashed or losing commit's part is never read).
        A damaged recorded part raises ``CorruptPartError`` naming the table and the path."""
        if table == "tasks":
            return self.committed_task_files()
        return [path for path, _ in self._catalog(table).values()]

    def part_paths(self, table: str, refs: list[str]) -> list[str]:
        """The checked files of parts named ``round=<r>/<part>`` (as pool manifests name them)."""
        catalog = self._catalog(table)
        out = []
        for ref in refs:
            if ref not in catalog:
                raise CorruptPartError(
                    f"table {table}: part {ref} is listed by a committed pool version but not recorded in "
                    f"{self.uri}/tables/{table}/{ref.split('/')[0]}/{MANIFEST} (its file or manifest is gone); "
                    "restore them from a copy of the store"
                )
            out.append(catalog[ref][0])
        return out

    def read(self, table: str, filter: Any = None, columns: list[str] | None = None) -> pa.Table:
        """Read a whole table (with its ``round`` column) or an empty table of its schema.

        ``filter`` is a ``pyarrow.dataset`` expression, e.g. ``ds.field("run_id") == "x"``.
        """
        files = self.table_files(table)
        schema = TABLES[table].append(pa.field("round", pa.int32()))
        if not files:
            empty = schema.empty_table()
            return empty.select(columns) if columns else empty
        return self.read_files(table, files, schema, filter=filter, columns=columns, partitioned=True)

    def read_files(
        self,
        table: str,
        files: list[str],
        schema: pa.Schema,
        *,
        filter: Any = None,
        columns: list[str] | None = None,
        partitioned: bool = False,
    ) -> pa.Table:
        """Read ``files`` of ``table`` (from ``table_files`` or ``part_paths``); a file that is
        not readable Parquet raises ``CorruptPartError`` naming the table and the file."""
        try:
            dataset = ds.dataset(
                files,
                schema=schema,
                filesystem=self.fs,
                format="parquet",
                partitioning=ds.partitioning(pa.schema([("round", pa.int32())]), flavor="hive")
                if partitioned
                else None,
                partition_base_dir=self.table_dir(table) if partitioned else None,
            )
            return dataset.to_table(filter=filter, columns=columns)
        except (pa.ArrowInvalid, OSError) as exc:
            raise self.unreadable(table, files, exc) from None

    def unreadable(self, table: str, files: list[str], exc: BaseException) -> StoreError:
        """The error for a failed read of ``files``: the first file whose Parquet footer does
        not read, named with its table, or (none found) the reader's own message."""
        for path in files:
            try:
                pq.read_metadata(path, filesystem=self.fs)
            except (pa.ArrowInvalid, OSError) as bad:
                return CorruptPartError(
                    f"table {table}: part {self._shown(path)} is not readable Parquet "
                    f"({_first_line(bad)}); restore it from a copy of the store"
                )
        return StoreError(f"table {table}: cannot be read: {_first_line(exc)}")

    def verify(self, tables: list[str] | None = None) -> list[str]:
        """Every problem of the recorded parts of ``tables`` (default: all), one line each:
        missing, truncated or not Parquet (as readers report them) and, for parts recorded with
        a checksum, a sha256 that differs. ``[]`` when every recorded part is intact."""
        problems = []
        for table in tables or list(TABLES):
            try:
                catalog = self._catalog(table)
            except StoreError as exc:
                problems.append(str(exc))
                continue
            for path, entry in catalog.values():
                if not entry or not entry.get("sha256"):
                    continue
                with self.fs.open_input_stream(path) as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                if digest != entry["sha256"]:
                    problems.append(
                        f"table {table}: part {self._shown(path)} has sha256 {digest}, recorded {entry['sha256']}"
                    )
        return problems

    # ------------------------------------------------------------------ part manifests
    def _catalog(self, table: str) -> dict[str, tuple[str, dict | None]]:
        """``round=<r>/<part>`` -> (path, manifest entry) of every recorded part of ``table``,
        each checked; in an older store's partitions without a manifest, every Parquet file
        (entry None). Strays and foreign files are not in it."""
        base = self.table_dir(table)
        infos = list(self._list(base, recursive=True))
        sizes = {i.path: i.size for i in infos}
        directories = sorted({i.path.rsplit("/", 1)[0] for i in infos if i.path.endswith((".parquet", f"/{MANIFEST}"))})
        out: dict[str, tuple[str, dict | None]] = {}
        older: bool | None = None  # an older store (asked once, at its first partition without a manifest)
        for directory in directories:
            partition = directory[len(base) + 1 :]
            if "/" in partition or not partition.startswith("round="):
                continue  # not a partition of this table: never read
            if f"{directory}/{MANIFEST}" in sizes:
                key = f"{directory[len(self.root) + 1 :]}/{MANIFEST}"
                try:
                    doc = self.get_json(key)
                except ValueError as exc:
                    raise CorruptPartError(
                        f"table {table}: manifest {self._shown(f'{directory}/{MANIFEST}')} is not valid JSON "
                        f"({_first_line(exc)}); restore it from a copy of the store"
                    ) from None
                try:
                    recorded = sorted((doc[0]["parts"] if doc else {}).items())
                    files = [
                        (part, f"{directory}/{entry['file']}", entry, int(entry["size"])) for part, entry in recorded
                    ]
                except (KeyError, TypeError, AttributeError, ValueError) as exc:
                    raise CorruptPartError(
                        f"table {table}: manifest {self._shown(f'{directory}/{MANIFEST}')} is not a part manifest "
                        f"({type(exc).__name__}: {_first_line(exc)}); restore it from a copy of the store"
                    ) from None
                for part, path, entry, _ in files:
                    self._check_part(table, path, entry, sizes.get(path))
                    out[f"{partition}/{part}"] = (path, entry)
            else:
                if older is None:
                    older = not self._manifests_on()
                if not older:
                    continue  # a partition no write recorded: never read
                self._warn_older()
                for path in sorted(p for p in sizes if p.startswith(f"{directory}/") and p.endswith(".parquet")):
                    if "/" not in path[len(directory) + 1 :]:
                        out[f"{partition}/{path.rsplit('/', 1)[-1][: -len('.parquet')]}"] = (path, None)
        return out

    def _check_part(self, table: str, path: str, entry: dict, size: int | None) -> None:
        """Raise ``CorruptPartError`` if the recorded file is missing, of another size than
        recorded, or (local files) lacks Parquet's magic bytes at either end (zero-filled)."""
        fix = "restore it from a copy of the store, or remove the stage's marker and rerun that stage"
        if size is None:
            raise CorruptPartError(f"table {table}: recorded part {self._shown(path)} is missing; {fix}")
        if size != entry["size"]:
            raise CorruptPartError(
                f"table {table}: part {self._shown(path)} is {size} bytes, recorded as {entry['size']} "
                f"(truncated or overwritten); {fix}"
            )
        if not self.is_s3:
            with open(path, "rb") as f:
                head = f.read(4)
                f.seek(-4, os.SEEK_END)
                tail = f.read(4)
            if head != b"PAR1" or tail != b"PAR1":
                raise CorruptPartError(
                    f"table {table}: part {self._shown(path)} is not Parquet (zero-filled or overwritten); {fix}"
                )

    def _get_manifest(self, table: str, round_no: int) -> dict | None:
        doc = self.get_json(f"tables/{table}/round={int(round_no)}/{MANIFEST}")
        return doc[0] if doc else None

    def _update_manifest(
        self, table: str, round_no: int, change: Callable[[dict[str, Any], frozenset[str]], bool]
    ) -> None:
        """Apply ``change`` to the parts of ``table``/``round``'s manifest by compare-and-swap,
        retried while other writers move it. ``change`` also gets the files recently unrecorded
        (the manifest's ``retired`` list): a conditional PUT that landed but whose answer was lost
        is retried by the client and refused (412), and must not record its file again once a
        later writer has replaced, and perhaps deleted, it."""
        key = f"tables/{table}/round={int(round_no)}/{MANIFEST}"
        for _ in range(1000):
            doc = self.get_json(key)
            before = dict(doc[0]["parts"]) if doc else {}
            retired = list(doc[0].get("retired", [])) if doc else []
            parts = dict(before)
            if not change(parts, frozenset(retired)):
                return
            kept = {p["file"] for p in parts.values()}
            retired += [p["file"] for p in before.values() if p["file"] not in kept]
            body = {"table": table, "round": int(round_no), "parts": parts, "retired": retired[-RETIRED_KEPT:]}
            try:
                if doc is None:
                    self.put_json(key, body, if_absent=True)
                else:
                    self.put_json(key, body, if_etag=doc[1])
                return
            except ConcurrentCommitError:
                time.sleep(random.uniform(0.001, 0.02))
        raise StoreError(f"{self.uri}/{key}: 1000 writers in a row changed it first; retry the write")

    def _manifests_on(self) -> bool:
        """Whether this store records its parts (``tables/_manifests.json``); once seen, cached."""
        if not self._recording:
            self._recording = self.get_json(FORMAT_KEY) is not None
        return self._recording

    def _adopt_older_parts(self) -> None:
        """Before the first write to a store without part manifests: record every partition's
        Parquet files as they are (sizes, no checksums), then mark the store as recording."""
        if self._manifests_on():
            return
        self._warned = True  # no "older store" warning: this is the write that records its parts
        adopted = 0
        for table in TABLES:
            catalog = self._catalog(table)  # only partitions without a manifest are unrecorded here
            by_round: dict[int, dict[str, Any]] = {}
            sizes = {i.path: i.size for i in self._list(self.table_dir(table), recursive=True)}
            for ref, (path, entry) in catalog.items():
                if entry is None:
                    round_no = int(ref.split("/", 1)[0][len("round=") :])
                    name = path.rsplit("/", 1)[-1]
                    by_round.setdefault(round_no, {})[ref.split("/", 1)[1]] = {
                        "file": name,
                        "size": sizes[path],
                        "sha256": "",
                        "rows": None,
                    }
            for round_no, parts in by_round.items():
                key = f"tables/{table}/round={round_no}/{MANIFEST}"
                try:
                    self.put_json(
                        key, {"table": table, "round": round_no, "parts": parts, "adopted": True}, if_absent=True
                    )
                    adopted += len(parts)
                except ConcurrentCommitError:
                    pass  # another writer adopted it first
        self.put_json(FORMAT_KEY, {"part_manifests": 1, "adopted_parts": adopted})
        self._recording = True

    def _warn_older(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "store %s has no part manifests (written before them): reading every Parquet file of its "
                "tables; its next write records them",
                self.uri,
            )

    def _shown(self, path: str) -> str:
        return f"s3://{path}" if self.is_s3 else path

    def _put_file(self, path: str, body: bytes) -> None:
        """Write a new file whole: S3, one PUT; locally a temporary name, fsynced, renamed over,
        then the directory fsynced (so a later marker can never be durable before it)."""
        directory = path.rsplit("/", 1)[0]
        if self.is_s3:
            with self.fs.open_output_stream(path) as f:
                f.write(body)
            return
        self._mkdir(directory)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(directory)

    def _delete_quietly(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except (FileNotFoundError, OSError):
            pass  # an unrecorded file is never read: a later delete_parts or rewrite removes it

    # ------------------------------------------------------------------ JSON documents
    def put_json(self, key: str, obj: Any, *, if_absent: bool = False, if_etag: str | None = None) -> str:
        """Write a JSON document; conditional writes raise ``ConcurrentCommitError``.

        Returns the new ETag (S3) or a content token (local) for later compare-and-swap.
        """
        body = json.dumps(obj, indent=1, sort_keys=True, default=str).encode()
        path = f"{self.root}/{key}"
        if self.is_s3:
            import botocore.exceptions

            kwargs: dict[str, Any] = {}
            if if_absent:
                kwargs["IfNoneMatch"] = "*"
            if if_etag is not None:
                kwargs["IfMatch"] = if_etag
            try:
                resp = self._s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=body, **kwargs)
            except botocore.exceptions.ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "")
                if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                    raise ConcurrentCommitError(f"{key} was changed by another writer") from None
                raise StoreError(f"cannot write {self.uri}/{key}: {exc}") from None
            return resp["ETag"]
        self._mkdir(path.rsplit("/", 1)[0])
        # the ETag check and the rename must be one step for every process, not only threads
        cas = self._file_lock(path) if if_etag is not None else contextlib.nullcontext()
        with self._lock, cas:
            if if_absent and os.path.exists(path):
                raise ConcurrentCommitError(f"{key} already exists (written by another writer)")
            if if_etag is not None and self._local_etag(path) != if_etag:
                raise ConcurrentCommitError(f"{key} was changed by another writer")
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as f:  # durable before it is visible under its name
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            if if_absent:
                try:  # link() fails if the target exists: atomic create-if-absent across processes
                    os.link(tmp, path)
                except FileExistsError:
                    raise ConcurrentCommitError(f"{key} already exists (written by another writer)") from None
                finally:
                    os.unlink(tmp)
            else:
                os.replace(tmp, path)
            _fsync_dir(path.rsplit("/", 1)[0])
        return hashlib.sha256(body).hexdigest()

    def get_json(self, key: str) -> tuple[Any, str] | None:
        """Return ``(document, etag)`` or ``None`` if absent."""
        if self.is_s3:
            try:
                resp = self._s3.get_object(Bucket=self.bucket, Key=self._key(key))
            except self._s3.exceptions.NoSuchKey:
                return None
            return json.loads(resp["Body"].read()), resp["ETag"]
        path = f"{self.root}/{key}"
        try:
            body = Path(path).read_bytes()
        except FileNotFoundError:
            return None
        return json.loads(body), hashlib.sha256(body).hexdigest()

    def delete_json(self, key: str) -> None:
        """Remove a JSON document (absent is fine)."""
        if self.is_s3:
            self._s3.delete_object(Bucket=self.bucket, Key=self._key(key))
            return
        with self._lock:
            try:
                os.unlink(f"{self.root}/{key}")
            except FileNotFoundError:
                pass

    @staticmethod
    @contextlib.contextmanager
    def _file_lock(path: str) -> Iterator[None]:
        """An exclusive ``flock`` on ``<path>.lock``: makes a local check-then-write atomic
        across processes (the in-process lock alone only covers threads of one Store)."""
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}".lstrip("/") if self.prefix else key

    @staticmethod
    def _local_etag(path: str) -> str:
        """A hash of the file's bytes ('' if absent). Not inode and mtime: a freed inode is
        reused at once and mtimes are coarse, so two pointer bodies could share those."""
        try:
            return hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except FileNotFoundError:
            return ""

    # ------------------------------------------------------------------ stage markers
    def stage_done(self, run_id: str, round_no: int, stage: str) -> dict | None:
        doc = self.get_json(f"runs/{run_id}/round={round_no}/{stage}.json")
        return doc[0] if doc else None

    def mark_stage(self, run_id: str, round_no: int, stage: str, summary: dict) -> None:
        self.put_json(f"runs/{run_id}/round={round_no}/{stage}.json", summary)

    # ------------------------------------------------------------------ file system helpers
    def _mkdir(self, path: str) -> None:
        """Create a local directory and its missing parents, each new entry fsynced."""
        if self.is_s3:
            return
        new = []
        p = Path(path)
        while not p.exists():
            new.append(p)
            p = p.parent
        os.makedirs(path, exist_ok=True)
        for d in reversed(new):
            _fsync_dir(str(d.parent))

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    def _list(self, path: str, recursive: bool = False) -> Iterator[pafs.FileInfo]:
        selector = pafs.FileSelector(path, allow_not_found=True, recursive=recursive)
        try:
            infos = self.fs.get_file_info(selector)
        except OSError as exc:
            raise StoreError(f"cannot list {path}: {exc}") from None
        return iter(sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path))


def open_store(uri: str, endpoint_url: str = "", region: str = "", client: S3Client | None = None) -> Store:
    return Store(uri, endpoint_url=endpoint_url, region=region, client=client)
