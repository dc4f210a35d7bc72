"""The store: tables round-trip, parts replace instead of duplicating, pool versions CAS."""

from __future__ import annotations

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
    v1 = store.commit_pool(run_id="r", round=0, new_tasks=[{"task_id": "a"}, {"task_id": "b"}], expected_parent=None)
    v2 = store.commit_pool(run_id="r", round=1, new_tasks=[{"task_id": "c"}], removed=["a"], expected_parent=1)
    assert (v1.version, v2.version, v2.parent) == (1, 2, 1)
    assert store.pool_tasks().column("task_id").to_pylist() == ["b", "c"]
    assert store.pool_tasks(1).column("task_id").to_pylist() == ["a", "b"]
    # a writer that read v1 as latest loses, with a clear error, and leaves no rows behind
    with pytest.raises(ConcurrentCommitError, match="latest is v2"):
        store.commit_pool(run_id="r", round=1, new_tasks=[{"task_id": "d"}], expected_parent=1)
    assert "d" not in store.read("tasks").column("task_id").to_pylist()
    assert store.pool_versions() == [1, 2]


def test_two_concurrent_writers_never_lose_work(store):
    store.commit_pool(run_id="r", round=0, new_tasks=[{"task_id": "seed"}], expected_parent=None)
    outcomes: list[str] = []

    def writer(name: str) -> None:
        try:
            store.commit_pool(run_id=name, round=1, new_tasks=[{"task_id": name}], expected_parent=1)
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
