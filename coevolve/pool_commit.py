"""Pool versions: the immutable manifests of the task pool and the protocol that commits them.

``PoolCommits`` is the half of ``coevolve.store.Store`` that reads and commits pool versions;
it works only through the store's documents (``get_json`` / ``put_json`` with conditional
writes) and tables, so it is the same on a local directory and on S3.

Pool commit protocol (``commit_pool``):

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

import json
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from coevolve.schemas import TABLES, to_table
from coevolve.store_errors import ConcurrentCommitError, StoreError

if TYPE_CHECKING:
    import pyarrow.fs as pafs


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


class PoolCommits:
    """Pool versions of a store: read the committed chain, commit a new version (mixed into ``Store``)."""

    if TYPE_CHECKING:  # what the store supplies (coevolve.store.Store)
        uri: str
        root: str
        fs: pafs.FileSystem

        def get_json(self, key: str) -> tuple[Any, str] | None: ...
        def put_json(self, key: str, obj: Any, *, if_absent: bool = False, if_etag: str | None = None) -> str: ...
        def delete_json(self, key: str) -> None: ...
        def table_dir(self, table: str) -> str: ...
        def write(self, table: str, round_no: int, part: str, rows: list[dict] | pa.Table) -> int: ...
        def has_part(self, table: str, round_no: int, part: str) -> bool: ...
        def delete_parts(self, table: str, round_no: int, prefix: str) -> int: ...
        def part_paths(self, table: str, refs: list[str]) -> list[str]: ...
        def read_files(self, table: str, files: list[str], schema: pa.Schema) -> pa.Table: ...
        def _list(self, path: str, recursive: bool = False) -> Iterator[pafs.FileInfo]: ...

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

    def committed_version(self, run_id: str, round_no: int) -> PoolVersion | None:
        """The committed version that ``run_id`` committed for ``round``, if any (resume)."""
        for v in reversed(self.committed()):
            if v.run_id == run_id and v.round == round_no:
                return v
        return None

    def commit_pool(
        self,
        *,
        run_id: str,
        round_no: int,
        new_tasks: list[dict],
        removed: Sequence[str] = (),
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
        orphan = self._adoptable(current, highest, run_id, round_no, added, removed)
        if orphan is not None:
            self._move_pointer(pointer, orphan)
            return self.finish_commit(orphan)
        attempt = uuid.uuid4().hex
        version = max(highest, current or 0) + 1
        files = list(parent.task_files) if parent else []
        part = f"pool-v{version:06d}-{run_id}-{attempt}"
        if new_tasks:
            self.write("tasks", round_no, part, new_tasks)
            files.append(f"round={round_no}/{part}")
        manifest = PoolVersion(
            version=version,
            parent=current,
            round=round_no,
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
                self._drop_part(round_no, part, new_tasks)  # only this attempt's own file
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
            self._drop_part(round_no, part, new_tasks)
            raise
        return self.finish_commit(manifest)

    def _adoptable(
        self, current: int | None, highest: int, run_id: str, round_no: int, added: list[str], removed: list[str]
    ) -> PoolVersion | None:
        """An orphan manifest an earlier attempt of this same commit left (protocol step 2)."""
        for v in range(highest, (current or 0), -1):
            doc = self.get_json(f"pool/v{v:06d}.json")
            if doc is None:
                continue
            m = PoolVersion(**doc[0])
            same = (m.parent, m.run_id, m.round, m.added, m.removed) == (current, run_id, round_no, added, removed)
            if same:
                try:
                    self.part_paths("tasks", m.task_files)  # every task file present and intact
                except StoreError:
                    continue
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

    def _drop_part(self, round_no: int, part: str, new_tasks: list[dict]) -> None:
        if new_tasks:
            try:
                self.delete_parts("tasks", round_no, part)  # the part's name is unique to this attempt
            except (StoreError, OSError):
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
                seen.setdefault(f, None)
        return self.part_paths("tasks", list(seen)) if seen else []

    def pool_tasks(self, version: PoolVersion | int | None = None) -> pa.Table:
        """The ``tasks`` rows of a pool version (default: the latest), in manifest order."""
        if not isinstance(version, PoolVersion):
            version = self.latest_pool() if version is None else self.pool_version(version)
        if version is None:
            return to_table("tasks", [])
        files = self.part_paths("tasks", version.task_files)
        table = self.read_files("tasks", files, TABLES["tasks"])
        index = {t: i for i, t in enumerate(version.task_ids)}
        # a task removed and added again sits in two files: the later file holds its row
        last = {t: i for i, t in enumerate(table.column("task_id").to_pylist())}
        keep = sorted(i for t, i in last.items() if t in index)
        table = table.take(keep)
        order = sorted(range(table.num_rows), key=lambda i: index[table.column("task_id")[i].as_py()])
        return table.take(order)
