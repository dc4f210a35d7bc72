"""The store: tables round-trip, parts replace instead of duplicating, pool versions CAS."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pyarrow.dataset as ds
import pytest

from coevolve.store import ConcurrentCommitError, Store, StoreError


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return Store(str(tmp_path / "store"))
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    return Store(f"s3://{bucket}/prefix", endpoint_url=endpoint)


def test_write_read_partitions_and_replace(store):
    store.write("rollouts", 1, "run-a", [{"run_id": "a", "task_id": "t1", "step": 0}])
    store.write("rollouts", 2, "run-a", [{"run_id": "a", "task_id": "t2", "step": 0}])
    # same part again: replaced, not appended
    store.write("rollouts", 2, "run-a", [{"run_id": "a", "task_id": "t3", "step": 1}])
    table = store.read("rollouts").sort_by("round")
    assert table.column("round").to_pylist() == [1, 2]
    assert table.column("task_id").to_pylist() == ["t1", "t3"]
    only2 = store.read("rollouts", filter=ds.field("round") == 2)
    assert only2.num_rows == 1


def test_unknown_columns_and_tables_are_errors(store):
    with pytest.raises(ValueError, match="no columns"):
        store.write("signals", 1, "x", [{"signal_id": "s", "bogus": 1}])
    with pytest.raises(StoreError, match="unknown table"):
        store.read("nope")


def test_empty_table_reads_with_schema(store):
    table = store.read("candidates")
    assert table.num_rows == 0 and "verdict" in table.column_names and "round" in table.column_names


def test_pool_versions_are_immutable_and_cas(store):
    v1 = store.commit_pool(run_id="r", round_no=0, new_tasks=[{"task_id": "a"}, {"task_id": "b"}], expected_parent=None)
    v2 = store.commit_pool(run_id="r", round_no=1, new_tasks=[{"task_id": "c"}], removed=["a"], expected_parent=1)
    assert (v1.version, v2.version, v2.parent) == (1, 2, 1)
    assert store.pool_tasks().column("task_id").to_pylist() == ["b", "c"]
    assert store.pool_tasks(1).column("task_id").to_pylist() == ["a", "b"]
    # a writer that read v1 as latest loses, with a clear error, and leaves no rows behind
    with pytest.raises(ConcurrentCommitError, match="latest is v2"):
        store.commit_pool(run_id="r", round_no=1, new_tasks=[{"task_id": "d"}], expected_parent=1)
    assert "d" not in store.read("tasks").column("task_id").to_pylist()
    assert store.pool_versions() == [1, 2]


def test_two_concurrent_writers_never_lose_work(store):
    store.commit_pool(run_id="r", round_no=0, new_tasks=[{"task_id": "seed"}], expected_parent=None)
    outcomes: list[str] = []

    def writer(name: str) -> None:
        try:
            store.commit_pool(run_id=name, round_no=1, new_tasks=[{"task_id": name}], expected_parent=1)
            outcomes.append("won")
        except ConcurrentCommitError:
            outcomes.append("lost")

    threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("won") == 1, outcomes
    latest = store.latest_pool()
    assert latest.version == 2 and len(latest.task_ids) == 2
    # the loser's tasks did not leak into the tasks table
    assert sorted(store.read("tasks").column("task_id").to_pylist()) == sorted(latest.task_ids)


def test_conditional_json_writes(store):
    etag = store.put_json("doc.json", {"v": 1}, if_absent=True)
    with pytest.raises(ConcurrentCommitError):
        store.put_json("doc.json", {"v": 2}, if_absent=True)
    store.put_json("doc.json", {"v": 2}, if_etag=etag)
    with pytest.raises(ConcurrentCommitError):
        store.put_json("doc.json", {"v": 3}, if_etag=etag)
    assert store.get_json("doc.json")[0] == {"v": 2}


def test_unreachable_s3_store_fails_fast(s3_endpoint):
    with pytest.raises(StoreError, match="unreachable"):
        Store("s3://no-such-bucket-here/x", endpoint_url=s3_endpoint).check_reachable()


# ----------------------------------------------------------------------------- commit protocol (issue 14)
def _race(first: Store, second: Store, run_first: str, run_second: str) -> None:
    """``first`` commits on v1; while its tasks are written (after it read the pointer),
    ``second`` commits a whole version on v1. ``first`` must lose cleanly."""
    original = first.write

    def write_then_race(table, round_no, part, rows):
        n = original(table, round_no, part, rows)
        if table == "tasks":
            first.write = original
            second.commit_pool(run_id=run_second, round_no=1, new_tasks=[{"task_id": "won"}], expected_parent=1)
        return n

    first.write = write_then_race
    with pytest.raises(ConcurrentCommitError):
        first.commit_pool(run_id=run_first, round_no=1, new_tasks=[{"task_id": "lost"}], expected_parent=1)


@pytest.mark.parametrize("runs", [("r", "r"), ("a", "a2")], ids=["same-run-id", "prefix-run-ids"])
def test_a_losing_commit_never_touches_the_winners_files(tmp_path, runs):
    root = str(tmp_path / "store")
    Store(root).commit_pool(run_id="seed", round_no=0, new_tasks=[{"task_id": "s"}], expected_parent=None)
    _race(Store(root), Store(root), *runs)
    store = Store(root)
    assert store.pool_tasks().column("task_id").to_pylist() == ["s", "won"]
    assert sorted(store.read("tasks").column("task_id").to_pylist()) == ["s", "won"]
    # the loser retries on the new latest and both commits stand
    store.commit_pool(run_id=runs[0], round_no=1, new_tasks=[{"task_id": "lost"}], expected_parent=2)
    assert store.pool_tasks().column("task_id").to_pylist() == ["s", "won", "lost"]
    assert [store.pool_tasks(v).num_rows for v in store.pool_versions()] == [1, 2, 3]


def _commit_until_done(store: Store, run_id: str, task_id: str) -> None:
    while True:
        latest = store.latest_pool()
        try:
            store.commit_pool(
                run_id=run_id, round_no=1, new_tasks=[{"task_id": task_id}], expected_parent=latest.version
            )
            return
        except ConcurrentCommitError:
            continue


def test_threads_with_one_run_id_lose_no_commit(store):
    """Two (and more) threads committing with one run id: every commit lands, every version reads."""
    store.commit_pool(run_id="seed", round_no=0, new_tasks=[{"task_id": "s"}], expected_parent=None)
    stores = [store] + [Store(store.uri, endpoint_url=store.s3_settings.get("endpoint_url", "")) for _ in range(3)]
    threads = [threading.Thread(target=_commit_until_done, args=(s, "same", f"t{i}")) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = store.pool_tasks().column("task_id").to_pylist()
    assert sorted(ids) == ["s", "t0", "t1", "t2", "t3"]
    assert sorted(store.read("tasks").column("task_id").to_pylist()) == sorted(ids)
    for v in store.pool_versions():
        assert store.pool_tasks(v).num_rows == len(store.pool_version(v).task_ids)


_KILL_BEFORE_POINTER = """
import os, signal, sys
from coevolve.store import Store
Store._move_pointer = lambda self, pointer, manifest: os.kill(os.getpid(), signal.SIGKILL)
Store(sys.argv[1]).commit_pool(run_id="run", round_no=1, new_tasks=[{"task_id": "x"}], expected_parent=1)
"""


def _killed_commit(root: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _KILL_BEFORE_POINTER, root], capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]


def test_kill_between_manifest_and_pointer_then_resume_adopts(tmp_path):
    root = str(tmp_path / "store")
    store = Store(root)
    store.commit_pool(run_id="run", round_no=0, new_tasks=[{"task_id": "s"}], expected_parent=None)
    _killed_commit(root)
    assert store.manifest_versions() == [1, 2] and store.pool_versions() == [1]  # an orphan, unread
    assert store.read("tasks").column("task_id").to_pylist() == ["s"]
    # resume: the same commit again adopts the orphan instead of colliding with it
    v = store.commit_pool(run_id="run", round_no=1, new_tasks=[{"task_id": "x"}], expected_parent=1)
    assert v.version == 2 and store.pool_versions() == [1, 2]
    assert store.pool_tasks().column("task_id").to_pylist() == ["s", "x"]
    assert store.read("pool_versions").column("version").to_pylist() == [1, 2]


def test_kill_between_manifest_and_pointer_then_other_writers_number_past(tmp_path):
    root = str(tmp_path / "store")
    store = Store(root)
    store.commit_pool(run_id="run", round_no=0, new_tasks=[{"task_id": "s"}], expected_parent=None)
    _killed_commit(root)
    other = store.commit_pool(run_id="other", round_no=1, new_tasks=[{"task_id": "o"}], expected_parent=1)
    assert other.version == 3 and other.parent == 1
    # the killed run resumes on the new latest; its orphan is never adopted nor read
    again = store.commit_pool(run_id="run", round_no=1, new_tasks=[{"task_id": "x"}], expected_parent=3)
    assert (again.version, again.parent) == (4, 3)
    assert store.pool_versions() == [1, 3, 4]
    assert store.pool_tasks().column("task_id").to_pylist() == ["s", "o", "x"]
    assert sorted(store.read("tasks").column("task_id").to_pylist()) == ["o", "s", "x"]
    assert store.committed_version("run", 1).version == 4


def test_store_s3_client_settings_reach_boto3(s3_endpoint):
    from coevolve.store import S3Client

    store = Store(
        "s3://b/p",
        endpoint_url=s3_endpoint,
        client=S3Client(retry_mode="adaptive", max_attempts=7, connect_timeout_s=2, read_timeout_s=9),
    )
    cfg = store._s3.meta.config
    assert cfg.retries == {"mode": "adaptive", "total_max_attempts": 7}
    assert (cfg.connect_timeout, cfg.read_timeout) == (2, 9)


# ----------------------------------------------------------------------------- recorded parts (issue 29)
ROWS = [{"run_id": "a", "task_id": f"t{i}", "step": i} for i in range(3)]
DAMAGE = {
    "truncated": lambda b: b[: len(b) // 2],
    "zero-filled": lambda b: bytes(len(b)),
    "zero-byte": lambda b: b"",
}


def _bytes(store: Store, path: str) -> bytes:
    with store.fs.open_input_stream(path) as f:
        return f.read()


def _put(store: Store, path: str, body: bytes) -> None:
    with store.fs.open_output_stream(path) as f:
        f.write(body)


def _shown(store: Store, path: str) -> str:
    return f"s3://{path}" if store.is_s3 else path


def _file_of(store: Store, table: str, part: str) -> str:
    return next(f for f in store.table_files(table) if f.rsplit("/", 1)[-1].startswith(f"{part}."))


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_part_is_one_clear_error_naming_its_table_and_path(store, damage):
    from coevolve.sql import connect

    store.write("rollouts", 1, "good", ROWS)
    store.write("rollouts", 1, "bad", ROWS)
    store.write("signals", 1, "s", [{"run_id": "a", "signal_id": "x"}])
    path = _file_of(store, "rollouts", "bad")
    _put(store, path, DAMAGE[damage](_bytes(store, path)))
    for read in (lambda: store.read("rollouts"), lambda: connect(store)):
        with pytest.raises(StoreError) as err:
            read()
        message = str(err.value)
        assert "table rollouts" in message and _shown(store, path) in message and "\n" not in message
    assert store.read("signals").num_rows == 1  # the other tables still read


def test_a_missing_recorded_part_is_an_error_not_fewer_rows(store):
    store.write("rollouts", 1, "gone", ROWS)
    path = _file_of(store, "rollouts", "gone")
    store.fs.delete_file(path)
    with pytest.raises(StoreError, match=r"table rollouts: recorded part .* is missing"):
        store.read("rollouts")


def test_stray_and_foreign_files_in_table_directories_are_never_read(store):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from coevolve.schemas import to_table
    from coevolve.sql import connect, scan

    store.write("signals", 1, "mined", [{"run_id": "a", "signal_id": "x", "signal_type": "rare"}])
    store.write("rollouts", 1, "run", ROWS)
    base = store.table_dir("signals")
    pq.write_table(pa.table({"foreign": [1, 2]}), f"{base}/round=1/foreign.parquet", filesystem=store.fs)
    stray = to_table("rollouts", [{"run_id": "stray", "task_id": "s", "step": 9}])
    for where in ("round=1/stray.parquet", "round=7/stray.parquet", "stray.parquet"):
        store.fs.create_dir(f"{store.table_dir('rollouts')}/{where}".rsplit("/", 1)[0])
        pq.write_table(stray, f"{store.table_dir('rollouts')}/{where}", filesystem=store.fs)
    signals = store.read("signals")
    assert signals.column("signal_id").to_pylist() == ["x"]  # not a row of nulls
    assert sorted(store.read("rollouts").column("run_id").to_pylist()) == ["a"] * 3
    con = connect(store)
    assert con.sql("select count(*) from signals").fetchall() == [(1,)]
    assert con.sql("select count(*) from rollouts where run_id = 'stray'").fetchall() == [(0,)]
    if not store.is_s3:  # polars reads S3 through its own client; the file list is the same
        assert scan(store, "rollouts").collect().height == 3


def test_coevolve_sql_and_report_print_a_damaged_tasks_part_as_one_line(tmp_path):
    from typer.testing import CliRunner

    from coevolve.cli import app

    store = Store(str(tmp_path / "store"))
    store.commit_pool(run_id="r", round_no=0, new_tasks=[{"task_id": "a"}], expected_parent=None)
    path = store.table_files("tasks")[0]
    _put(store, path, _bytes(store, path)[:40])
    result = CliRunner().invoke(app, ["sql", "--store", store.root, "select count(*) from tasks"])
    output = " ".join(result.output.split())
    assert result.exit_code != 0 and output.startswith("error: table tasks:") and "Traceback" not in output
    assert path in output.replace(" ", "")
    report = CliRunner().invoke(app, ["report", "--store", store.root, "--out", str(tmp_path / "report")])
    output = " ".join(report.output.split())
    assert report.exit_code != 0 and output.startswith("error: table tasks:") and "Traceback" not in output


def test_a_crash_between_a_rewrite_and_its_manifest_keeps_the_old_part(store, monkeypatch):
    store.write("rounds", 1, "run", [{"run_id": "old"}])

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed before the manifest update")

    monkeypatch.setattr(store, "_update_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        store.write("rounds", 1, "run", [{"run_id": "new"}])
    monkeypatch.undo()
    assert store.read("rounds").column("run_id").to_pylist() == ["old"]  # the new file is a stray
    assert store.verify() == []
    store.write("rounds", 1, "run", [{"run_id": "new"}])  # the rerun replaces it
    assert store.read("rounds").column("run_id").to_pylist() == ["new"]


def test_a_manifest_swap_that_landed_but_lost_its_answer_is_not_applied_again(store, monkeypatch):
    """The faulty-proxy campaign's loss: writer A's conditional PUT of the manifest lands, its
    answer is lost, the client retries it and gets 412; meanwhile B replaced A's file and deleted
    it. A must not record its (deleted) file again over B's."""
    store.write("rollouts", 1, "run", [{"run_id": "first"}])
    real_put = store.put_json
    raced = []

    def put_then_lose_the_answer(key, obj, **kw):
        etag = real_put(key, obj, **kw)
        if key.endswith("_manifest.json") and not raced:
            raced.append(key)
            store_b = Store(store.uri, endpoint_url=store.s3_settings.get("endpoint_url", ""))
            store_b.write("rollouts", 1, "run", [{"run_id": "second"}])  # replaces A's file, deletes it
            raise ConcurrentCommitError(f"{key} was changed by another writer")  # A's retried PUT: 412
        return etag

    monkeypatch.setattr(store, "put_json", put_then_lose_the_answer)
    store.write("rollouts", 1, "run", [{"run_id": "a-retried"}])
    monkeypatch.undo()
    assert raced
    assert store.read("rollouts").column("run_id").to_pylist() == ["second"]
    assert store.verify() == []


def test_verify_finds_a_changed_checksum(store):
    store.write("rollouts", 1, "run", ROWS)
    path = _file_of(store, "rollouts", "run")
    body = bytearray(_bytes(store, path))
    body[len(body) // 2] ^= 0xFF  # same size, still Parquet at both ends
    _put(store, path, bytes(body))
    problems = store.verify()
    assert len(problems) == 1 and "table rollouts" in problems[0] and "sha256" in problems[0]


def test_an_older_store_is_read_as_before_then_adopted_by_its_first_write(tmp_path, caplog):
    import pyarrow.parquet as pq

    from coevolve.schemas import to_table

    root = tmp_path / "store"
    (root / "tables" / "rollouts" / "round=1").mkdir(parents=True)
    pq.write_table(to_table("rollouts", ROWS), root / "tables" / "rollouts" / "round=1" / "old.parquet")
    store = Store(str(root))
    with caplog.at_level("WARNING", logger="coevolve.store"):
        assert store.read("rollouts").num_rows == 3
    assert "no part manifests" in caplog.text
    store.write("rollouts", 2, "new", ROWS)  # adopts round 1's file, then records its own
    assert (root / "tables" / "_manifests.json").exists()
    assert store.has_part("rollouts", 1, "old") and store.has_part("rollouts", 2, "new")
    (root / "tables" / "rollouts" / "round=3").mkdir()
    pq.write_table(to_table("rollouts", ROWS), root / "tables" / "rollouts" / "round=3" / "late.parquet")
    fresh = Store(str(root))
    assert sorted(fresh.read("rollouts").column("round").to_pylist()) == [1, 1, 1, 2, 2, 2]  # round 3: a stray


def test_local_writes_are_fsynced_before_the_rename_and_before_the_marker(tmp_path, monkeypatch):
    import os

    store = Store(str(tmp_path / "store"))
    store.write("rollouts", 0, "warm", ROWS)  # directories and the store's marker exist
    events: list[tuple[str, str]] = []
    fsync, replace, link = os.fsync, os.replace, os.link

    def on_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def on_replace(src, dst):
        events.append(("rename", str(dst)))
        return replace(src, dst)

    def on_link(src, dst):
        events.append(("rename", str(dst)))
        return link(src, dst)

    monkeypatch.setattr(os, "fsync", on_fsync)
    monkeypatch.setattr(os, "replace", on_replace)
    monkeypatch.setattr(os, "link", on_link)
    store.write("rollouts", 1, "run", ROWS)
    store.mark_stage("run", 1, "train", {"rows": 3})
    monkeypatch.undo()
    part = _file_of(store, "rollouts", "run")
    partition = part.rsplit("/", 1)[0]
    manifest = f"{partition}/_manifest.json"
    marker = f"{store.root}/runs/run/round=1/train.json"

    def at(kind: str, path: str, after: int = -1) -> int:
        return next(i for i, e in enumerate(events) if i > after and e[0] == kind and e[1] == path)

    data_synced = next(i for i, e in enumerate(events) if e[0] == "fsync" and e[1].startswith(f"{part}."))
    renamed = at("rename", part)
    assert data_synced < renamed < at("fsync", partition, renamed)  # file, rename, then directory
    recorded = at("rename", manifest)
    assert at("fsync", partition, renamed) < recorded < at("fsync", partition, recorded)
    marked = at("rename", marker)
    assert at("fsync", partition, recorded) < marked < at("fsync", marker.rsplit("/", 1)[0], marked)
    assert any(e[0] == "fsync" and e[1].startswith(f"{marker}.") for e in events[:marked])


def test_delete_parts_unrecords_then_removes_files_and_strays_of_the_prefix(store):
    import pyarrow.parquet as pq

    from coevolve.schemas import to_table

    for part in ("r-train-s0001", "r-train-s0002", "r-eval"):
        store.write("rollouts", 1, part, [{"run_id": part, "task_id": "t", "step": 0}])
    stray = f"{store.table_dir('rollouts')}/round=1/r-train-s0003.parquet"  # a crashed write's file
    pq.write_table(to_table("rollouts", [{"run_id": "stray"}]), stray, filesystem=store.fs)
    assert store.delete_parts("rollouts", 1, "r-train-s") == 3
    assert store.read("rollouts").column("run_id").to_pylist() == ["r-eval"]
    assert not store.has_part("rollouts", 1, "r-train-s0001") and store.has_part("rollouts", 1, "r-eval")
    names = [i.path.rsplit("/", 1)[-1] for i in store._list(f"{store.table_dir('rollouts')}/round=1")]
    assert [n for n in names if n.startswith("r-train-s")] == []


@pytest.mark.parametrize("body", [b'{"parts": {"run": {"fi', b'{"parts": {"run": {"file": "x"}}}', b"[1, 2]"])
def test_a_damaged_manifest_is_one_clear_error(store, body):
    store.write("signals", 1, "run", [{"run_id": "a", "signal_id": "x"}])
    manifest = f"{store.table_dir('signals')}/round=1/_manifest.json"
    _put(store, manifest, body)
    with pytest.raises(StoreError, match=r"table signals: manifest .*_manifest.json is not"):
        store.read("signals")
