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

Pool commit protocol (``commit_pool``), the same on a local directory and on S3:

1. read the pointer ``pool/LATEST`` (version ``P`` and its ETag); the caller's expected
   parent must be ``P``;
2. adopt an orphan: a manifest ``v > P`` whose parent is ``P`` and which records this very
   commit (same run, round, added and removed ids, every task file present) is what an
   earlier attempt of this commit wrote before it crashed; go to step 5 with it;
3. write the new tasks to a part named by a fresh uuid per attempt (no two attempts, of the
   same run id or of run ids sharing a prefix, can ever touch each other's files);
4. create manifest ``v<N>`` *if absent*, ``N`` = one past the highest manifest present
   (so an orphan manifest can never make the number collide again); it lists that part;
5. move the pointer from ``P`` to ``N`` by compare-and-swap (S3 ``If-Match`` on the ETag;
   locally an ``flock``-guarded check-and-rename, safe across processes);
6. write the version's ``pool_versions`` row (a deterministic part: idempotent).

Atomic points: the manifest create (4) and the pointer swap (5). A version is *committed*
once the pointer reaches it; committed versions form the chain from the pointer through
``parent`` links, and readers (``pool_tasks``, ``read("tasks")``, the ``tasks`` SQL view)
read exactly the task files committed manifests list. A writer that loses step 4 or 5
removes only what it wrote itself (its part, and its manifest) and raises
``ConcurrentCommitError``; if its pointer swap failed because another writer adopted its
manifest, its commit stands and it returns normally.

What a crash leaves, and how resume proceeds:

- before or during 3: nothing visible; a stray part no manifest lists (never read);
  the rerun commits anew;
- after 4, before 5: an orphan manifest; the rerun of the same commit adopts it (step 2),
  any other writer numbers past it; orphans are never read;
- after 5, before 6 (or before the stage marker): the version is committed;
  ``committed_version(run_id, round)`` finds it and ``finish_commit`` rewrites its
  ``pool_versions`` row, so the rerun neither commits twice nor loses the row.
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
    attempt: str = ""  # the commit attempt that wrote this manifest (uuid)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1, sort_keys=True)


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


class Store:
    """One object through which every stage reads and writes (local or S3)."""

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

    def manifest_versions(self) -> list[int]:
        """Every manifest present, committed or orphan (see the protocol above)."""
        out = []
        for info in self._list(f"{self.root}/pool"):
            name = info.path.rsplit("/", 1)[-1]
            if name.startswith("v") and name.endswith(".json") and name[1:-5].isdigit():
                out.append(int(name[1:-5]))
        return sorted(out)

    def committed(self) -> list[PoolVersion]:
        """The committed versions, oldest first: the chain from the pointer through parents."""
        chain: list[PoolVersion] = []
        v = self.latest_pool()
        while v is not None:
            chain.append(v)
            v = self.pool_version(v.parent) if v.parent is not None else None
        return chain[::-1]

    def pool_versions(self) -> list[int]:
        """The numbers of the committed versions, ascending."""
        return [v.version for v in self.committed()]

    def committed_version(self, run_id: str, round: int) -> PoolVersion | None:
        """The committed version that ``run_id`` committed for ``round``, if any (resume)."""
        for v in reversed(self.committed()):
            if v.run_id == run_id and v.round == round:
                return v
        return None

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

        ``new_tasks`` are ``tasks`` rows. The steps, and what a crash between them leaves,
        are the protocol in this module's docstring. A writer whose parent is no longer the
        latest gets ``ConcurrentCommitError`` and nothing of its version becomes visible.
        """
        pointer = self.get_json("pool/LATEST")
        current = pointer[0]["version"] if pointer else None
        if current != expected_parent:
            raise ConcurrentCommitError(
                f"pool moved: expected parent v{expected_parent}, latest is v{current}; re-read and retry"
            )
        parent = self.pool_version(current) if current is not None else None
        if parent is not None and not self.has_part("pool_versions", parent.round, f"v{parent.version:06d}"):
            self.finish_commit(parent)  # a crash after its pointer swap left its row unwritten
        removed = list(removed)
        gone = set(removed)
        ids = [t for t in (parent.task_ids if parent else []) if t not in gone]
        added = [t["task_id"] for t in new_tasks]
        clash = set(added) & set(ids)
        if clash:
            raise StoreError(f"tasks already in the pool: {sorted(clash)[:5]}")
        if len(set(added)) != len(added):
            raise StoreError("new_tasks holds the same task_id twice")
        highest = max(self.manifest_versions(), default=0)
        orphan = self._adoptable(current, highest, run_id, round, added, removed)
        if orphan is not None:
            self._move_pointer(pointer, orphan)
            return self.finish_commit(orphan)
        attempt = uuid.uuid4().hex
        version = max(highest, current or 0) + 1
        files = list(parent.task_files) if parent else []
        part = f"pool-v{version:06d}-{run_id}-{attempt}"
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
            removed=removed,
            created_at=datetime.now(timezone.utc).isoformat(),
            attempt=attempt,
        )
        try:
            self.put_json(f"pool/v{version:06d}.json", manifest.__dict__, if_absent=True)
        except ConcurrentCommitError:
            there = self.get_json(f"pool/v{version:06d}.json")
            if there is not None and there[0].get("attempt") == attempt:
                pass  # ours after all: a retried request whose first try had succeeded
            else:
                self._drop_part(round, part, new_tasks)  # only this attempt's own file
                raise ConcurrentCommitError(
                    f"pool version v{version} was committed by another writer first; re-read and retry"
                ) from None
        try:
            self._move_pointer(pointer, manifest)
        except ConcurrentCommitError:
            if self._is_committed(version):
                # a retried swap whose first try had succeeded, or another attempt of this
                # commit adopted our manifest (and others may have committed on top since)
                return self.finish_commit(manifest)
            # our parent is no longer the pointer, so no one can adopt this manifest any more
            self.delete_json(f"pool/v{version:06d}.json")
            self._drop_part(round, part, new_tasks)
            raise
        return self.finish_commit(manifest)

    def _adoptable(
        self, current: int | None, highest: int, run_id: str, round: int, added: list[str], removed: list[str]
    ) -> PoolVersion | None:
        """An orphan manifest an earlier attempt of this same commit left (protocol step 2)."""
        for v in range(highest, (current or 0), -1):
            doc = self.get_json(f"pool/v{v:06d}.json")
            if doc is None:
                continue
            m = PoolVersion(**doc[0])
            same = (m.parent, m.run_id, m.round, m.added, m.removed) == (current, run_id, round, added, removed)
            if same and all(self._exists(f"{self.table_dir('tasks')}/{f}.parquet") for f in m.task_files):
                return m
        return None

    def _is_committed(self, version: int) -> bool:
        v = self.latest_pool()
        while v is not None and v.version > version and v.parent is not None:
            v = self.pool_version(v.parent)
        return v is not None and v.version == version

    def _move_pointer(self, pointer: tuple[Any, str] | None, manifest: PoolVersion) -> None:
        # run_id, attempt and time make every pointer body (and so its ETag) unique
        latest = {
            "version": manifest.version,
            "run_id": manifest.run_id,
            "attempt": manifest.attempt,
            "at": datetime.now(timezone.utc).isoformat(),
        }
        if pointer:
            self.put_json("pool/LATEST", latest, if_etag=pointer[1])
        else:
            self.put_json("pool/LATEST", latest, if_absent=True)

    def _drop_part(self, round: int, part: str, new_tasks: list[dict]) -> None:
        if new_tasks:
            try:
                self.fs.delete_file(self._part_path("tasks", round, part))
            except (FileNotFoundError, OSError):
                pass  # a stray part is never read: no manifest lists it

    def finish_commit(self, manifest: PoolVersion) -> PoolVersion:
        """Write the ``pool_versions`` row of a committed version (idempotent: resume calls it
        again when a crash came between the pointer swap and this row)."""
        self.write(
            "pool_versions",
            manifest.round,
            f"v{manifest.version:06d}",
            [
                {
                    "run_id": manifest.run_id,
                    "version": manifest.version,
                    "parent": manifest.parent,
                    "task_count": len(manifest.task_ids),
                    "added": manifest.added,
                    "removed": manifest.removed,
                    "manifest": f"pool/v{manifest.version:06d}.json",
                    "created_at": datetime.fromisoformat(manifest.created_at),
                }
            ],
        )
        return manifest

    def committed_task_files(self) -> list[str]:
        """Paths of every task file a committed manifest lists (what ``tasks`` readers read)."""
        seen: dict[str, None] = {}
        for v in self.committed():
            for f in v.task_files:
                seen.setdefault(f"{self.table_dir('tasks')}/{f}.parquet", None)
        return list(seen)

    def pool_tasks(self, version: PoolVersion | int | None = None) -> pa.Table:
        """The ``tasks`` rows of a pool version (default: the latest), in manifest order."""
        if not isinstance(version, PoolVersion):
            version = self.latest_pool() if version is None else self.pool_version(version)
        if version is None:
            return to_table("tasks", [])
        files = [f"{self.table_dir('tasks')}/{f}.parquet" for f in version.task_files]
        table = ds.dataset(files, schema=TABLES["tasks"], filesystem=self.fs, format="parquet").to_table()
        index = {t: i for i, t in enumerate(version.task_ids)}
        # a task removed and added again sits in two files: the later file holds its row
        last = {t: i for i, t in enumerate(table.column("task_id").to_pylist())}
        keep = sorted(i for t, i in last.items() if t in index)
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


def open_store(uri: str, endpoint_url: str = "", region: str = "", client: S3Client | None = None) -> Store:
    return Store(uri, endpoint_url=endpoint_url, region=region, client=client)
