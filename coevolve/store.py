"""The store: every table as hive-partitioned Parquet, pool versions as JSON manifests.

Layout under the root (a local directory or ``s3://bucket/prefix``)::

    tables/<table>/round=<r>/<part>.parquet   # rows; <part> names are deterministic, so a
                                              # rerun overwrites instead of duplicating
    tables/tasks/round=<r>/pool-v<n>-<run>-<attempt>.parquet
                                              # the new tasks of one commit attempt
    pool/v000003.json                          # immutable manifest of pool version 3
    pool/LATEST                                # pointer, moved only by compare-and-swap
    runs/<run_id>/round=<r>/<stage>.json       # stage completion markers (resume)
    checkpoints/<run_id>/round=<r>/            # the round's trained policy (coevolve.checkpoints)

Writes are atomic: local files are written to a temporary name and renamed; S3 objects
appear whole.

Pool versions (``pool/``) are read and committed by ``coevolve.pool_commit``, whose
docstring is the commit protocol: what each step writes and what a crash between them leaves.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from coevolve.pool_commit import PoolCommits
from coevolve.schemas import TABLES, to_table
from coevolve.store_errors import ConcurrentCommitError, StoreError

__all__ = ["ConcurrentCommitError", "S3Client", "Store", "StoreError", "open_store"]


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

    def _part_path(self, table: str, round_no: int, part: str) -> str:
        return f"{self.table_dir(table)}/round={int(round_no)}/{part}.parquet"

    def write(self, table: str, round_no: int, part: str, rows: list[dict] | pa.Table) -> int:
        """Write ``rows`` as part ``part`` of ``table`` in partition ``round``; replaces a
        part of the same name (so reruns never duplicate). Returns the row count."""
        data = to_table(table, rows)
        path = self._part_path(table, round_no, part)
        self._mkdir(path.rsplit("/", 1)[0])
        if self.is_s3:
            pq.write_table(data, path, filesystem=self.fs, compression="zstd")
        else:
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            pq.write_table(data, tmp, compression="zstd")
            os.replace(tmp, path)
        return data.num_rows

    def has_part(self, table: str, round_no: int, part: str) -> bool:
        return self._exists(self._part_path(table, round_no, part))

    def delete_parts(self, table: str, round_no: int, prefix: str) -> int:
        """Delete parts of ``table``/``round`` whose name starts with ``prefix``."""
        n = 0
        for info in self._list(f"{self.table_dir(table)}/round={int(round_no)}"):
            name = info.path.rsplit("/", 1)[-1]
            if name.startswith(prefix) and name.endswith(".parquet"):
                self.fs.delete_file(info.path)
                n += 1
        return n

    def table_files(self, table: str) -> list[str]:
        """The Parquet files a reader of ``table`` reads: for ``tasks``, exactly the files
        committed pool manifests list (a crashed or losing commit's part is never read)."""
        if table == "tasks":
            return self.committed_task_files()
        return [i.path for i in self._list(self.table_dir(table), recursive=True) if i.path.endswith(".parquet")]

    def read(self, table: str, filter: Any = None, columns: list[str] | None = None) -> pa.Table:
        """Read a whole table (with its ``round`` column) or an empty table of its schema.

        ``filter`` is a ``pyarrow.dataset`` expression, e.g. ``ds.field("run_id") == "x"``.
        """
        files = self.table_files(table)
        schema = TABLES[table].append(pa.field("round", pa.int32()))
        if not files:
            empty = schema.empty_table()
            return empty.select(columns) if columns else empty
        dataset = ds.dataset(
            files,
            schema=schema,
            filesystem=self.fs,
            format="parquet",
            partitioning=ds.partitioning(pa.schema([("round", pa.int32())]), flavor="hive"),
            partition_base_dir=self.table_dir(table),
        )
        return dataset.to_table(filter=filter, columns=columns)

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
            Path(tmp).write_bytes(body)
            if if_absent:
                try:  # link() fails if the target exists: atomic create-if-absent across processes
                    os.link(tmp, path)
                except FileExistsError:
                    raise ConcurrentCommitError(f"{key} already exists (written by another writer)") from None
                finally:
                    os.unlink(tmp)
            else:
                os.replace(tmp, path)
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
        if not self.is_s3:
            os.makedirs(path, exist_ok=True)

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
