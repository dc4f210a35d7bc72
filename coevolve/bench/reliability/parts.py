"""The ``damaged-parts`` and ``torn-writes`` scenarios: table parts damaged or planted by hand, and
runs SIGKILLed between a part's write and its stage marker (issue 29, item 2).

    res = damaged_parts_scenario("damaged-parts", "/tmp/chaos/parts", CampaignConfig(), log=print)
    res = torn_writes_scenario(CampaignConfig(kills=20), Path("/tmp/chaos"), log=print)

Both use a synthetic run (``write_run``): per round, stages that write deterministic parts of
every table and then their marker, as ``coevolve.round`` does, with no model (seconds, not minutes).

- ``damaged-parts``: for every table, a recorded part truncated, zero-filled (same size), emptied
  and deleted (each must be refused by ``Store.read`` and the DuckDB views with an error naming the
  table and the file, then restored), and a foreign-schema file and a stray part of the right
  schema planted in a recorded partition and in a new one (readers must return exactly the
  reference rows). Tried = faults; survived = faults handled so; rows lost = rows a reader silently
  dropped; duplicated = rows a planted file added.
- ``torn-writes``: a chain of ``kills`` runs of ``write_run`` in child processes, each SIGKILLed
  before or after a random one of the store's internal steps of a write (the part file written,
  the manifest updated, the old file deleted) or of a marker, each resuming (and so rewriting the
  parts of) what the previous left; after every
  kill the store must verify clean (``Store.verify``: every recorded part present, of its size and
  checksum) and every table must read; a last run completes and must hold the reference's keys.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from coevolve.bench.reliability.common import (
    REPO,
    CampaignConfig,
    ScenarioResult,
    compare_keys,
    corrupt_versions,
    last_line,
    table_keys,
)

STAGES = ("train", "signals", "explore", "abstract", "commit", "evaluate")


def _stage_rows(stage: str, run_id: str, round_no: int) -> dict[str, list[dict]]:
    """The rows a synthetic stage writes, per table (two parts of rollouts for train)."""
    if stage == "train":
        steps = [
            {"run_id": run_id, "phase": "train", "episode_id": f"e{e}", "turn": 0, "step": s, "task_id": f"t{e}"}
            for e in range(4)
            for s in range(3)
        ]
        return {"rollouts": steps, "train_steps": [{"run_id": run_id, "step": s} for s in range(2)]}
    if stage == "signals":
        return {"signals": [{"run_id": run_id, "signal_id": f"s{i}", "signal_type": "rare"} for i in range(3)]}
    if stage == "explore":
        return {"explorations": [{"run_id": run_id, "signal_id": "s0", "run_idx": 0, "step": s} for s in range(4)]}
    if stage == "abstract":
        return {"candidates": [{"run_id": run_id, "candidate_id": f"c{i}", "verdict": "keep"} for i in range(3)]}
    if stage == "evaluate":
        return {"rounds": [{"run_id": run_id}]}
    return {}


def write_run(store: Any, run_id: str, rounds: int) -> None:
    """A synthetic run of ``rounds`` rounds: each stage writes its parts (rollouts in two), then its
    marker; a stage whose marker exists is skipped; the commit stage resumes as ``coevolve.round``'s."""
    for round_no in range(1, rounds + 1):
        for stage in STAGES:
            if store.stage_done(run_id, round_no, stage) is not None:
                continue
            if stage == "commit":
                if store.committed_version(run_id, round_no) is None:
                    latest = store.latest_pool()
                    tasks = [{"task_id": f"{run_id}-r{round_no}-t{i}", "env": "bench"} for i in range(2)]
                    store.commit_pool(
                        run_id=run_id,
                        round_no=round_no,
                        new_tasks=tasks,
                        expected_parent=latest.version if latest else None,
                    )
                else:
                    store.finish_commit(store.committed_version(run_id, round_no))
            for table, rows in _stage_rows(stage, run_id, round_no).items():
                if table == "rollouts":
                    store.write(table, round_no, f"{run_id}-{stage}-a", rows[: len(rows) // 2])
                    store.write(table, round_no, f"{run_id}-{stage}-b", rows[len(rows) // 2 :])
                else:
                    store.write(table, round_no, f"{run_id}-{stage}", rows)
            store.mark_stage(run_id, round_no, stage, {"stage": stage})


# ----------------------------------------------------------------------------- damaged parts
def _damages() -> dict[str, Callable[[bytes], bytes | None]]:
    return {
        "truncated": lambda b: b[: len(b) // 2],
        "zero-filled": lambda b: bytes(len(b)),
        "zero-byte": lambda b: b"",
        "deleted": lambda b: None,
    }


def _refused(store: Any, table: str, path: str) -> str | None:
    """None when ``Store.read`` and ``coevolve.sql.connect`` both refuse ``table`` with an error
    naming it and ``path``; else what happened instead."""
    from coevolve.sql import connect
    from coevolve.store import StoreError

    shown = f"s3://{path}" if store.is_s3 else path
    for name, read in (("Store.read", lambda: store.read(table)), ("DuckDB views", lambda: connect(store))):
        try:
            read()
        except StoreError as exc:
            if f"table {table}" not in str(exc) or shown not in str(exc):
                return f"{name}: error names neither table nor file: {str(exc)[:160]}"
            continue
        except Exception as exc:  # noqa: BLE001 - a raw library error is the finding
            return f"{name}: raw {type(exc).__name__}: {str(exc)[:160]}"
        return f"{name}: read without an error"
    return None


def damaged_parts_scenario(
    name: str, store_uri: str, cc: CampaignConfig, log: Callable[[str], None], endpoint: str = ""
) -> ScenarioResult:
    """Damage, delete and plant parts of every table of a synthetic run's store (see the module)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from coevolve.schemas import TABLES, to_table
    from coevolve.store import Store

    res = ScenarioResult(name)
    store = Store(store_uri, endpoint_url=endpoint)
    write_run(store, "bench", max(1, cc.rounds))
    reference = table_keys(store)
    tables = [t for t in TABLES if store.table_files(t)]
    for table in tables:
        path = store.table_files(table)[0]
        with store.fs.open_input_stream(path) as f:
            body = f.read()
        for kind, damage in _damages().items():
            res.tried += 1
            bad = damage(body)
            if bad is None:
                store.fs.delete_file(path)
            else:
                with store.fs.open_output_stream(path) as f:
                    f.write(bad)
            why = _refused(store, table, path)
            with store.fs.open_output_stream(path) as f:
                f.write(body)
            if why is None:
                res.survived += 1
            else:
                res.notes.append(f"{kind} {table} part: {why}")
        foreign = pa.table({"foreign_id": ["x", "y"], "n": [1, 2]})
        stray = to_table(table, store.read(table).drop_columns(["round"]).slice(0, 1))
        for what, planted in (("foreign-schema file", foreign), ("stray part", stray)):
            for where in ("round=1", "round=99"):
                res.tried += 1
                directory = f"{store.table_dir(table)}/{where}"
                store.fs.create_dir(directory)
                target = f"{directory}/planted-{what.split()[0]}.parquet"
                pq.write_table(planted, target, filesystem=store.fs)
                try:
                    lost, dup, notes = compare_keys(reference, table_keys(store))
                    views = connect_count(store, table)
                    if lost or dup or notes or views != store.read(table).num_rows:
                        res.rows_lost += lost
                        res.rows_duplicated += dup + max(0, views - store.read(table).num_rows)
                        res.notes.append(f"{what} in {table}/{where}: read ({notes[:1]}, views {views})")
                    else:
                        res.survived += 1
                except Exception as exc:  # noqa: BLE001 - a reader that fails on a stray is a finding
                    res.notes.append(f"{what} in {table}/{where}: {type(exc).__name__}: {str(exc)[:160]}")
                store.fs.delete_file(target)
    lost, dup, notes = compare_keys(reference, table_keys(store))
    res.rows_lost += lost
    res.rows_duplicated += dup
    res.notes += notes
    res.corrupt_versions, more = corrupt_versions(store)
    res.notes += more + [f"tables damaged and planted: {', '.join(tables)}"]
    log(f"{name}: {res.survived}/{res.tried} faults refused or ignored as they should be")
    return res


def connect_count(store: Any, table: str) -> int:
    """Rows of ``table`` through the DuckDB views."""
    from coevolve.sql import connect

    return int(connect(store).sql(f"select count(*) from {table}").fetchall()[0][0])


# ----------------------------------------------------------------------------- torn writes
class _TornHook:
    """In a child run: counts the store's internal write steps and markers; SIGKILLs itself at
    the target (``{"op": n, "when": "before" | "after", "name": None or a step's name}``): at
    the first step (of that name) from the ``n``-th on."""

    OPS = ("_put_file", "_update_manifest", "_delete_quietly", "mark_stage")

    def __init__(self, target: dict | None):
        self.target = target
        self.n = 0
        self.names: list[str] = []

    def install(self) -> None:
        from coevolve.store import Store

        for name in self.OPS:
            original = getattr(Store, name)

            def wrapped(store: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                self._maybe_die("before", _name)
                out = _original(store, *args, **kwargs)
                self._maybe_die("after", _name)
                self.n += 1
                self.names.append(_name)
                return out

            setattr(Store, name, wrapped)

    def _maybe_die(self, when: str, name: str) -> None:
        t = self.target
        if t is not None and t["when"] == when and self.n >= t["op"] and t.get("name") in (None, name):
            Path(t["report"]).write_text(json.dumps({"op": self.n, "name": name, "when": when}))
            os.kill(os.getpid(), signal.SIGKILL)


def torn_child(store_uri: str, rounds: int, target: dict | None, trace: str | None) -> None:
    """One run of the torn-writes scenario (its own process): ``write_run`` with the hook."""
    from coevolve.store import Store

    hook = _TornHook(target)
    hook.install()
    write_run(Store(store_uri), "bench", rounds)
    if trace:
        Path(trace).write_text(json.dumps(hook.names))


def _torn_run(store: str, rounds: int, target: dict | None, trace: str | None, timeout_s: float) -> Any:
    args = ["torn", "--store", store, "--rounds", str(rounds)]
    if target:
        args += ["--target", json.dumps(target)]
    if trace:
        args += ["--trace", trace]
    cmd = [sys.executable, "-m", "coevolve.bench.reliability", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)


def torn_writes_scenario(cc: CampaignConfig, work: Path, log: Callable[[str], None]) -> ScenarioResult:
    """Kill a synthetic run between a part's write and its marker, over and over (see the module)."""
    from coevolve.store import Store

    res = ScenarioResult("torn-writes")
    rounds = max(1, cc.rounds)
    ref, trace = work / "torn-reference", work / "torn-reference-ops.json"
    proc = _torn_run(str(ref), rounds, None, str(trace), cc.run_timeout_s)
    if proc.returncode != 0:
        res.notes.append(f"reference run failed: {last_line(proc)}")
        return res
    ops = json.loads(trace.read_text())
    reference = table_keys(Store(str(ref)))
    rng = random.Random(cc.seed)
    # each run of the chain dies after a random number of its own steps: about two kills per
    # reference run's worth of steps, so the chain advances and its resumes rewrite parts. The
    # first four points each wait for a kind of step, so that every kind is hit: a marker (just
    # before it: the stage's parts are all recorded), then the resume's rewrite deleting a part's
    # old file, then a part's file and a manifest update
    span = max(2, 2 * len(ops) // max(1, cc.kills))
    kinds = [("mark_stage", "before"), ("_delete_quietly", None), ("_put_file", None), ("_update_manifest", None)]
    points: list[dict[str, Any]] = []
    for i in range(cc.kills):
        name, when = kinds[i] if i < len(kinds) else (None, None)
        points.append(
            {
                "op": 0 if name == "_delete_quietly" else rng.randrange(span),
                "when": when or rng.choice(["before", "after"]),
                "name": name,
            }
        )
    store_dir = work / "torn-chaos"
    for i, point in enumerate(points):
        point["report"] = str(work / f"torn-{i}.json")
        res.tried += 1
        proc = _torn_run(str(store_dir), rounds, point, None, cc.run_timeout_s)
        if proc.returncode not in (0, -signal.SIGKILL):
            res.notes.append(f"run {i + 1} failed instead of resuming: {last_line(proc)}")
            continue
        hit = json.loads(Path(point["report"]).read_text()) if proc.returncode == -signal.SIGKILL else None
        store = Store(str(store_dir))
        try:
            problems = store.verify()
            table_keys(store)  # every table reads
        except Exception as exc:  # noqa: BLE001 - a store that no longer reads is the finding
            problems = [f"{type(exc).__name__}: {str(exc)[:200]}"]
        if problems:
            res.notes.append(f"after kill {i + 1} ({hit}): {problems[0]}")
            continue
        res.survived += 1
        if hit:
            log(f"torn-writes kill {i + 1}/{len(points)}: op {hit['op']} ({hit['name']}, {hit['when']})")
        else:
            res.notes.append(f"point {i + 1} not reached: the run completed first")
    proc = _torn_run(str(store_dir), rounds, None, None, cc.run_timeout_s)
    if proc.returncode != 0:
        res.survived -= 1
        res.notes.append(f"final resume failed: {last_line(proc)}")
        return res
    chaos = Store(str(store_dir))
    res.rows_lost, res.rows_duplicated, notes = compare_keys(reference, table_keys(chaos))
    res.corrupt_versions, more = corrupt_versions(chaos)
    res.notes += notes + more + chaos.verify()
    kinds_hit = sorted(
        {json.loads(Path(p["report"]).read_text())["name"] for p in points if Path(p["report"]).exists()}
    )
    res.notes.append(f"{len(ops)} write steps and markers in the run; kinds hit: {', '.join(kinds_hit)}")
    return res
