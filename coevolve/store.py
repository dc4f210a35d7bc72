"""The store: every table as hive-partitioned Parquet, pool versions as JSON manifests.

Layout under the root (a local directory or ``s3://bucket/prefix``)::

    tables/<table>/round=<r>/<part>.parquet   # rows; <part> names are deterministic, so a
                                              # rerun overwrites instead of duplicating
    pool/v000003.json                          # immutable manifest of pool version 3
    pool/LATEST                                # pointer, moved only by compare-and-swap
    runs/<run_id>/round=<r>/<stage>.json       # stage completion markers (resume)

Writes are atomic: local files are written to a temporary name and renamed; S3 objects
appear whole. Pool manifests are created only if absent, and the pointer is replaced only
if it still holds what the writer read, so two writers can never lose each other's work:
the loser gets ``ConcurrentCommitError``.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from coevolve.schemas import TABLES, to_table


class StoreError(RuntimeError):
    """The store cannot be reached or holds something unexpected."""


class ConcurrentCommitError(StoreError):
    """Another writer committed first; re-read the latest pool version and retry."""


@dataclass(frozen=True)
class PoolVersion:
    version: int
    parent: int | None
    round: int
    run_id: str
    task_ids: list[str]
    # (round, part) of the `tasks` files that hold the rows of this version's tasks
    task_files: list[str]
    added: list[str]
    removed: list[str]
    created_at: str

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1, sort_keys=True)


def _s3_settings(endpoint_url: str = "", region: str = "") -> dict[str, str]:
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL", "")
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return {"endpoint_url": endpoint, "region": region}


class Store:
    """One object through which every stage reads and writes (local or S3)."""

    def __init__(self, uri: str, *, endpoint_url: str = "", region: str = ""):
        self.uri = uri.rstrip("/")
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
            )
            self.root = f"{self.bucket}/{self.prefix}".rstrip("/")
            import boto3  # only S3 stores need it

            self._s3 = boto3.client(
                "s3", endpoint_url=s3["endpoint_url"] or None, region_name=s3["region"]
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

    def _part_path(self, table: str, round: int, part: str) -> str:
        return f"{self.table_dir(table)}/round={int(round)}/{part}.parquet"

    def write(self, table: str, round: int, part: str, rows: list[dict] | pa.Table) -> int:
        """Write ``rows`` as part ``part`` of ``table`` in partition ``round``; replaces a
        part of the same name (so reruns never duplicate). Returns the row count."""
        data = to_table(table, rows)
        path = self._part_path(table, round, part)
        self._mkdir(path.rsplit("/", 1)[0])
        if self.is_s3:
            pq.write_table(data, path, filesystem=self.fs, compression="zstd")
        else:
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            pq.write_table(data, tmp, compression="zstd")
            os.replace(tmp, path)
        return data.num_rows

    def has_part(self, table: str, round: int, part: str) -> bool:
        return self._exists(self._part_path(table, round, part))

    def delete_parts(self, table: str, round: int, prefix: str) -> int:
        """Delete parts of ``table``/``round`` whose name starts with ``prefix``."""
        n = 0
        for info in self._list(f"{self.table_dir(table)}/round={int(round)}"):
            name = info.path.rsplit("/", 1)[-1]
            if name.startswith(prefix) and name.endswith(".parquet"):
                self.fs.delete_file(info.path)
                n += 1
        return n

    def read(self, table: str, filter: Any = None, columns: list[str] | None = None) -> pa.Table:
        """Read a whole table (with its ``round`` column) or an empty table of its schema.

        ``filter`` is a ``pyarrow.dataset`` expression, e.g. ``ds.field("run_id") == "x"``.
        """
        files = [i.path for i in self._list(self.table_dir(table), recursive=True) if i.path.endswith(".parquet")]
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
        with self._lock:
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
        return self._local_etag(path)

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
        return json.loads(body), self._local_etag(path)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}".lstrip("/") if self.prefix else key

    @staticmethod
    def _local_etag(path: str) -> str:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return ""
        return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"

    # ------------------------------------------------------------------ stage markers
    def stage_done(self, run_id: str, round: int, stage: str) -> dict | None:
        doc = self.get_json(f"runs/{run_id}/round={round}/{stage}.json")
        return doc[0] if doc else None

    def mark_stage(self, run_id: str, round: int, stage: str, summary: dict) -> None:
        self.put_json(f"runs/{run_id}/round={round}/{stage}.json", summary)

    # ------------------------------------------------------------------ pool versions
    def latest_pool(self) -> PoolVersion | None:
        pointer = self.get_json("pool/LATEST")
        if pointer is None:
            return None
        return self.pool_version(pointer[0]["version"])

    def pool_version(self, version: int) -> PoolVersion:
        doc = self.get_json(f"pool/v{version:06d}.json")
        if doc is None:
            raise StoreError(f"pool version {version} has no manifest in {self.uri}")
        return PoolVersion(**doc[0])

    def pool_versions(self) -> list[int]:
        out = []
        for info in self._list(f"{self.root}/pool"):
            name = info.path.rsplit("/", 1)[-1]
            if name.startswith("v") and name.endswith(".json"):
                out.append(int(name[1:-5]))
        return sorted(out)

    def commit_pool(
        self,
        *,
        run_id: str,
        round: int,
        new_tasks: list[dict],
        removed: list[str] = (),
        expected_parent: int | None,
    ) -> PoolVersion:
        """Commit a new immutable pool version = parent's tasks - removed + new_tasks.

        ``new_tasks`` are ``tasks`` rows; they are written first (to a part named after the
        version), then the manifest is created if absent, then the pointer is moved by
        compare-and-swap. A writer whose parent is no longer the latest gets
        ``ConcurrentCommitError`` and nothing of its version becomes visible.
        """
        pointer = self.get_json("pool/LATEST")
        current = pointer[0]["version"] if pointer else None
        if current != expected_parent:
            raise ConcurrentCommitError(
                f"pool moved: expected parent v{expected_parent}, latest is v{current}; re-read and retry"
            )
        parent = self.pool_version(current) if current is not None else None
        version = (current or 0) + 1
        part = f"pool-v{version:06d}-{run_id}"
        files = list(parent.task_files) if parent else []
        ids = [t for t in (parent.task_ids if parent else []) if t not in set(removed)]
        added = [t["task_id"] for t in new_tasks]
        clash = set(added) & set(ids)
        if clash:
            raise StoreError(f"tasks already in the pool: {sorted(clash)[:5]}")
        if new_tasks:
            self.write("tasks", round, part, new_tasks)
            files.append(f"round={round}/{part}")
        manifest = PoolVersion(
            version=version,
            parent=current,
            round=round,
            run_id=run_id,
            task_ids=ids + added,
            task_files=files,
            added=added,
            removed=list(removed),
            created_at=datetime.now(timezone.utc).isoformat(),
        )
        try:
            self.put_json(f"pool/v{version:06d}.json", manifest.__dict__, if_absent=True)
        except ConcurrentCommitError:
            if new_tasks:  # the winner's version stands; ours must leave no rows behind
                self.delete_parts("tasks", round, part)
            raise ConcurrentCommitError(
                f"pool version v{version} was committed by another writer first; re-read and retry"
            ) from None
        # run_id and time make every pointer body (and so its ETag) unique
        latest = {"version": version, "run_id": run_id, "at": manifest.created_at}
        if pointer:
            self.put_json("pool/LATEST", latest, if_etag=pointer[1])
        else:
            self.put_json("pool/LATEST", latest, if_absent=True)
        self.write(
            "pool_versions",
            round,
            f"v{version:06d}",
            [
                {
                    "run_id": run_id,
                    "version": version,
                    "parent": current,
                    "task_count": len(manifest.task_ids),
                    "added": added,
                    "removed": list(removed),
                    "manifest": f"pool/v{version:06d}.json",
                    "created_at": datetime.now(timezone.utc),
                }
            ],
        )
        return manifest

    def pool_tasks(self, version: PoolVersion | int | None = None) -> pa.Table:
        """The ``tasks`` rows of a pool version (default: the latest), in manifest order."""
        if not isinstance(version, PoolVersion):
            version = self.latest_pool() if version is None else self.pool_version(version)
        if version is None:
            return to_table("tasks", [])
        files = [f"{self.table_dir('tasks')}/{f}.parquet" for f in version.task_files]
        table = ds.dataset(files, schema=TABLES["tasks"], filesystem=self.fs, format="parquet").to_table()
        index = {t: i for i, t in enumerate(version.task_ids)}
        keep = [i for i, t in enumerate(table.column("task_id").to_pylist()) if t in index]
        table = table.take(keep)
        order = sorted(range(table.num_rows), key=lambda i: index[table.column("task_id")[i].as_py()])
        return table.take(order)

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


def open_store(uri: str, endpoint_url: str = "", region: str = "") -> Store:
    return Store(uri, endpoint_url=endpoint_url, region=region)
