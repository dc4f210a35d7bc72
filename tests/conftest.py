"""Shared fixtures: an S3 endpoint on loopback (moto) and Prefect's test harness.

Both are session-scoped: moto's server and the Prefect harness each take seconds to start.
"""

from __future__ import annotations

import os

import pytest

from coevolve.processes import free_port

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# test servers never start scheduled runs: deployments/prefect.yaml's nightly schedule would start the
# embedded default (20 minutes, on the repository's own store) whenever the suite runs at 02:00 UTC
os.environ.setdefault("PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED", "false")
os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(os.path.expanduser("~"), ".cache", "coevolve", "bfcl"))


def _pin_xdist_worker() -> None:
    """Under pytest-xdist (``make test`` runs one worker per core), worker N runs on core N only,
    it and every process it starts: torch then uses one thread per worker instead of two workers
    each spinning two threads on the same two cores. More workers than cores: no pinning."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if worker.startswith("gw") and 0 < count <= len(cores):
        os.sched_setaffinity(0, {cores[int(worker[2:]) % count]})


_pin_xdist_worker()


def pytest_collection_modifyitems(config, items):
    """Test files with a test marked ``slow`` come first, the one with the longest ``timeout``
    mark (the learning test, 5-7 minutes on one core) before them all; each file's tests stay
    together and in their order. ``make test`` hands whole files to its two workers in collection
    order (``--dist loadfile --no-loadscope-reorder``): by xdist's default order (most tests
    first) the one-test learning file came last and ran alone while the other worker sat idle."""
    slow: dict[object, float] = {}
    for item in items:
        if item.get_closest_marker("slow"):
            mark = item.get_closest_marker("timeout")
            slow[item.path] = max(slow.get(item.path, 0.0), float(mark.args[0]) if mark and mark.args else 0.0)
    items.sort(key=lambda item: (item.path not in slow, -slow.get(item.path, 0.0)))  # a stable sort


@pytest.fixture(scope="session")
def s3_endpoint():
    """An S3 API on loopback (moto's ThreadedMotoServer) with test credentials in the env."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
    yield f"http://127.0.0.1:{port}"
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_bucket_ids = __import__("itertools").count()


@pytest.fixture
def s3_bucket(s3_endpoint, request):
    """A fresh bucket on the loopback S3 endpoint; yields its name."""
    import boto3

    import re

    name = f"cv-{next(_bucket_ids)}-" + re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def one_thread():
    """One torch intra-op thread for the test: tiny models gain nothing from more, and on a busy
    2-core machine OpenMP threads spinning on each other's barriers make them many times slower."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="session")
def prefect_harness():
    """Prefect's own test harness: a temporary API and database for the session."""
    from prefect.testing.utilities import prefect_test_harness

    # a busy 2-core box needs more than 60 s to start the server
    with prefect_test_harness(server_startup_timeout=180):
        yield


# ----------------------------------------------------------------------------- explore / abstract / validate (issue 6)
@pytest.fixture
def signal_store(tmp_path):
    """Factory: a local store whose pool is the given tasks, with one hand-built signal per
    task (types cycled forgetting / boundary / rare, or as given) of run "t" at round 1,
    and the failing (or pattern) episode of each signal in the rollouts table."""
    counter = __import__("itertools").count()
    return lambda tasks, signal_types=("forgetting", "boundary", "rare"): _seeded_store(
        tmp_path / f"store{next(counter)}", tasks, signal_types
    )


def _seeded_store(root, tasks, signal_types=("forgetting", "boundary", "rare")):
    """A store with a pool of ``tasks`` and one hand-built signal per task (types cycled),
    each with a failing (or pattern) episode in the rollouts."""
    import json as _json

    from coevolve.store import Store

    store = Store(str(root))
    rows = []
    for t in tasks:
        t.split, t.origin, t.run_id = "train", "seed", "t"
        rows.append(t.to_row())
    store.commit_pool(run_id="t", round_no=0, new_tasks=rows, expected_parent=None)
    signals, rollouts = [], []
    for i, t in enumerate(tasks):
        kind = signal_types[i % len(signal_types)]
        calls = [c for turn in t.reference_actions for c in turn]
        if kind == "rare":
            ev = {"task_ids": [t.task_id], "episode_ids": [f"e{i}"], "actions": [calls[0]["name"], calls[1]["name"]]}
            signals.append(
                {
                    "run_id": "t",
                    "signal_id": f"s{i:02d}",
                    "signal_type": kind,
                    "pattern": f"{calls[0]['name']} > {calls[1]['name']}",
                    "score": 1.0,
                    "evidence": _json.dumps(ev),
                    "is_new": True,
                    "rank": i,
                }
            )
        else:
            signals.append(
                {
                    "run_id": "t",
                    "signal_id": f"s{i:02d}",
                    "signal_type": kind,
                    "task_id": t.task_id,
                    "score": 0.5,
                    "evidence": _json.dumps({"failing_episode_id": f"e{i}"}),
                    "is_new": True,
                    "rank": i,
                }
            )
        for step, c in enumerate(calls[:2]):
            rollouts.append(
                {
                    "run_id": "t",
                    "phase": "train",
                    "task_id": t.task_id,
                    "episode_id": f"e{i}",
                    "sample_idx": 0,
                    "turn": 0,
                    "step": step,
                    "action_name": c["name"],
                    "action_args": _json.dumps(c["arguments"]),
                    "observation": "{}",
                    "success": False,
                    "episode_reward": 0.0,
                }
            )
    store.write("signals", 1, "t", signals)
    store.write("rollouts", 1, "t-train", rollouts)
    return store
