"""The ``concurrent-local`` / ``concurrent-s3`` scenarios: ``procs`` processes commit ``commits`` pool
versions each, at once, with one shared run id and with one run id each; every commit must land
exactly once and every committed version must read back.

    res = concurrent_scenario("local", "/tmp/pool", "", CampaignConfig(procs=3), Path("/tmp"), log=print)

A committing process is ``python -m coevolve.bench.reliability committer ...`` (``committer``).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from coevolve.bench.reliability.common import CampaignConfig, ScenarioResult, corrupt_versions


def committer(store_uri: str, endpoint: str, run_id: str, tag: str, n: int, go: str, out: str) -> None:
    """One committing process: ``n`` commits of two tasks each, retried on conflicts."""
    from coevolve.store import ConcurrentCommitError, S3Client, Store

    store = Store(
        store_uri, endpoint_url=endpoint, client=S3Client(max_attempts=10, connect_timeout_s=2, read_timeout_s=10)
    )
    Path(f"{out}.ready").write_text("ready")
    while not Path(go).exists():
        time.sleep(0.01)
    done, conflicts, errors = [], 0, []
    for i in range(n):
        tasks = [{"task_id": f"{tag}-c{i}-t{j}", "env": "test", "split": "train"} for j in range(2)]
        for _ in range(500):
            try:
                latest = store.latest_pool()
                store.commit_pool(
                    run_id=run_id, round_no=1, new_tasks=tasks, expected_parent=latest.version if latest else None
                )
                done.append([t["task_id"] for t in tasks])
                break
            except ConcurrentCommitError:
                conflicts += 1
                time.sleep(random.uniform(0, 0.05))
            except Exception as exc:  # a clear failure of this commit, counted, not a crash
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                time.sleep(0.1)
                try:  # the failure may have come after the pointer moved: then it is done
                    if tasks[0]["task_id"] in store.latest_pool().task_ids:
                        done.append([t["task_id"] for t in tasks])
                        break
                except Exception:  # noqa: BLE001 - the store is still failing: retry the commit
                    pass
    Path(out).write_text(json.dumps({"done": done, "conflicts": conflicts, "errors": errors}))


def concurrent_scenario(
    name: str,
    store_uri: str,
    endpoint: str,
    cc: CampaignConfig,
    work: Path,
    log: Callable[[str], None],
    env: dict | None = None,
    modes: tuple[str, ...] = ("same-run-id", "own-run-ids"),
    check_endpoint: str | None = None,
) -> ScenarioResult:
    """``procs`` processes commit at once through ``endpoint``; the checks read through
    ``check_endpoint`` (default the same: a faulty proxy's tests check behind it)."""
    from coevolve.store import Store

    res = ScenarioResult(name)
    store = Store(store_uri, endpoint_url=check_endpoint or endpoint)
    store.commit_pool(run_id="seed", round_no=0, new_tasks=[{"task_id": "seed"}], expected_parent=None)
    wanted: dict[str, list[str]] = {}
    for mode in modes:
        go = work / f"{name}-{mode}-go"
        procs = []
        for p in range(cc.procs):
            tag = f"{mode}-p{p}"
            run_id = "shared" if mode == "same-run-id" else f"run{p}"
            out = work / f"{name}-{tag}.json"
            args = [
                "committer",
                "--store",
                store_uri,
                "--endpoint",
                endpoint,
                "--run-id",
                run_id,
                "--tag",
                tag,
                "--n",
                str(cc.commits),
                "--go",
                str(go),
                "--out",
                str(out),
            ]
            procs.append(
                (
                    subprocess.Popen(
                        [sys.executable, "-m", "coevolve.bench.reliability", *args],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    ),
                    out,
                )
            )
        deadline = time.monotonic() + 120  # every process imported and waits at the barrier
        while time.monotonic() < deadline and not all(Path(f"{out}.ready").exists() for _, out in procs):
            time.sleep(0.05)
        go.write_text("go")
        t0 = time.perf_counter()
        for proc, out in procs:
            _, err = proc.communicate(timeout=cc.run_timeout_s)
            res.tried += cc.commits
            if proc.returncode != 0 or not out.exists():
                res.notes.append(f"committer crashed: {(err or '').strip().splitlines()[-1:]}")
                continue
            report = json.loads(out.read_text())
            for ids in report["done"]:
                wanted[ids[0]] = ids
            res.notes += [f"{out.stem}: {e}" for e in report["errors"][:2]]
            log(
                f"{name} {out.stem}: {len(report['done'])} commits, {report['conflicts']} conflicts retried, "
                f"{len(report['errors'])} errors retried, {time.perf_counter() - t0:.1f}s"
            )
    latest = store.pool_tasks().column("task_id").to_pylist()
    have = set(latest)
    committed = [ids for ids in wanted.values() if all(t in have for t in ids)]
    res.survived = len(committed)
    res.rows_lost = sum(len(ids) for ids in wanted.values()) - sum(len(ids) for ids in committed)
    all_tasks = store.read("tasks").column("task_id").to_pylist()
    res.rows_duplicated = (len(latest) - len(have)) + (len(all_tasks) - len(set(all_tasks)))
    res.corrupt_versions, notes = corrupt_versions(store)
    rows = store.read("pool_versions").num_rows
    if rows != len(store.pool_versions()):
        res.rows_lost += abs(len(store.pool_versions()) - rows)
        notes.append(f"pool_versions rows {rows} != committed versions {len(store.pool_versions())}")
    res.notes += notes
    return res
