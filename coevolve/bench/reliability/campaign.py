"""Fault campaign: kill runs anywhere, commit concurrently, break S3, fuzz model output.

``coevolve bench reliability`` (``make chaos``) runs these scenarios and prints, per
scenario, tried / survived / rows lost / rows duplicated / corrupt pool versions:

- ``kill``: a reference run of ``rounds`` rounds, then a chain of runs on a fresh store,
  each SIGKILLed at the next of ``kills`` random points (a store operation of a stage,
  just before or just after it: inside table writes, markers, pool commits between
  manifest and pointer, ...), each resuming what the previous left; a last run completes.
  Points cover every stage of ``coevolve.round.STAGES`` (whatever they are) and the seeding
  before them. The final tables must hold exactly the reference run's keys.
- ``concurrent-local`` / ``concurrent-s3``: ``procs`` processes commit ``commits`` pool
  versions each, at once, with one shared run id and with one run id each; on a local
  store and on S3 (moto on loopback). Every commit must land exactly once and every
  committed version must read back.
- ``s3-faults``: the same S3 commits, then ``fault_rounds`` rounds of a run, through a
  loopback proxy that answers 5xx, resets connections (before or after forwarding) and
  stalls, at ``fault_rate``; a run either completes or fails with a clear error, and reruns
  complete with the reference run's keys.
- ``fuzz``: ``fuzz`` mutated model outputs through the tool-call parser and the BFCL
  environment's dispatcher: 0 uncaught exceptions.

The S3 pieces (moto on loopback, the faulty proxy) live in ``coevolve.bench.reliability.s3_faults``.
Every process the campaign starts is accounted for at the end (``leftover`` processes are
reported and killed). Library entry point: ``run_campaign(CampaignConfig(...))``; a child
process of the kill scenario is ``python -m coevolve.bench.reliability.campaign child ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from coevolve.bench.reliability.s3_faults import FaultProxy, MotoS3

# Key columns of each table: a row is lost when the reference run has its key and the
# chaos run does not; duplicated when a key occurs twice. Tables the schema lacks are skipped.
KEYS: dict[str, tuple[str, ...]] = {
    "rollouts": ("run_id", "round", "phase", "episode_id", "turn", "step"),
    "signals": ("run_id", "round", "signal_id"),
    "explorations": ("run_id", "round", "signal_id", "run_idx", "step"),
    "candidates": ("run_id", "round", "candidate_id"),
    "tasks": ("task_id",),
    "pool_versions": ("run_id", "round"),
    "rounds": ("run_id", "round"),
}

# A small run: seconds per stage with the tiny model on 2 cores.
SMALL_RUN: dict[str, Any] = {
    "train.sft_steps": 4,
    "train.steps": 1,
    "train.group_size": 2,
    "train.tasks_per_step": 1,
    "synth.scenarios": 2,
    "synth.contexts_per_scenario": 1,
    "eval.scenarios": 1,
    "eval.categories": ["multi_turn_base"],
    "eval.step_limit": 2,
    "eval.max_new_tokens": 24,
    "env.step_limit": 2,
    "policy.max_new_tokens": 24,
    "explore.runs_per_context": 1,
    "explore.steps_per_run": 2,
}


@dataclass
class CampaignConfig:
    scenarios: list[str] = field(
        default_factory=lambda: ["kill", "concurrent-local", "concurrent-s3", "s3-faults", "fuzz"]
    )
    config: str | None = "configs/tiny.yaml"  # run config of the kill and fault runs
    overrides: dict[str, Any] = field(default_factory=lambda: dict(SMALL_RUN))
    rounds: int = 2  # rounds of the kill scenario's runs
    kills: int = 20  # SIGKILL points of the kill scenario
    procs: int = 4  # concurrent committing processes
    commits: int = 5  # commits per process
    fault_rate: float = 0.1  # share of S3 requests the proxy breaks
    fault_rounds: int = 1  # rounds of the run through the faulty proxy (0 = commits only)
    fuzz: int = 1_000_000  # fuzzed model outputs
    seed: int = 0
    workdir: str = ""  # where stores live ('' = a temporary directory)
    run_timeout_s: float = 1800.0  # one child run's wall-clock limit


@dataclass
class ScenarioResult:
    scenario: str
    tried: int = 0
    survived: int = 0
    rows_lost: int = 0
    rows_duplicated: int = 0
    corrupt_versions: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (
            self.tried > 0
            and self.survived == self.tried
            and self.rows_lost == 0
            and self.rows_duplicated == 0
            and self.corrupt_versions == 0
        )


# ============================================================================ store checks
def table_keys(store: Any, max_round: int | None = None) -> dict[str, list[tuple]]:
    """Per table, the key tuples of its rows (duplicates kept), rows of rounds <= max_round."""
    import pyarrow.dataset as ds

    from coevolve.schemas import TABLES

    out: dict[str, list[tuple]] = {}
    for table, cols in KEYS.items():
        if table not in TABLES or not set(cols) <= set(TABLES[table].names) | {"round"}:
            continue
        filt = (ds.field("round") <= max_round) if max_round is not None else None
        t = store.read(table, filter=filt, columns=list(cols))
        out[table] = list(zip(*(t.column(c).to_pylist() for c in cols))) if t.num_rows else []
    return out


def compare_keys(reference: dict[str, list[tuple]], got: dict[str, list[tuple]]) -> tuple[int, int, list[str]]:
    """(rows lost, rows duplicated, notes) of ``got`` against ``reference``."""
    lost = dup = 0
    notes = []
    for table, ref in reference.items():
        have = got.get(table, [])
        missing = set(ref) - set(have)
        extra = set(have) - set(ref)
        lost += len(missing)
        dup += len(have) - len(set(have))
        if missing:
            notes.append(f"{table}: {len(missing)} keys missing, e.g. {sorted(missing, key=str)[0]}")
        if extra:
            notes.append(f"{table}: {len(extra)} keys the reference lacks, e.g. {sorted(extra, key=str)[0]}")
    return lost, dup, notes


def corrupt_versions(store: Any) -> tuple[int, list[str]]:
    """Committed pool versions that do not read back exactly (rows = manifest ids)."""
    bad, notes = 0, []
    try:
        versions = store.committed()
    except Exception as exc:  # a broken chain is itself corruption
        return 1, [f"pool chain unreadable: {type(exc).__name__}: {exc}"]
    for v in versions:
        try:
            ids = store.pool_tasks(v).column("task_id").to_pylist()
            if ids != v.task_ids:
                raise ValueError(f"{len(ids)} rows for {len(v.task_ids)} ids")
        except Exception as exc:
            bad += 1
            notes.append(f"v{v.version}: {type(exc).__name__}: {str(exc)[:120]}")
    return bad, notes


# ============================================================================ kill scenario
def _position(round_: int, stage: str) -> tuple[int, int]:
    from coevolve.round import STAGES

    return (round_, STAGES.index(stage) if stage in STAGES else len(STAGES))


class _KillHook:
    """In a child run: counts store operations per stage; SIGKILLs itself at the target."""

    OPS = ("write", "put_json", "delete_json", "delete_parts")

    def __init__(self, target: dict | None, trace: str | None):
        self.target = target
        self.trace = trace
        self.where = (0, -1)  # seeding, before any stage
        self.stage = "seed"
        self.n = 0
        self.counts: dict[str, int] = {}

    def on_event(self, event: str, round_: int, stage: str, info: dict) -> None:
        if event == "start":
            self.where, self.stage, self.n = _position(round_, stage), stage, 0

    def _hit(self, when: str) -> bool:
        t = self.target
        if t is None or t["when"] != when:
            return False
        return (*self.where, self.n) >= (t["round"], t["stage_idx"], t["op"])

    def _die(self, op: str) -> None:
        Path(self.target["report"]).write_text(
            json.dumps(
                {"stage": self.stage, "round": self.where[0], "op": self.n, "name": op, "when": self.target["when"]}
            )
        )
        os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        from coevolve.store import Store

        for name in self.OPS:
            original = getattr(Store, name)

            def wrapped(store, *args, _original=original, _name=name, **kwargs):
                if self._hit("before"):
                    self._die(_name)
                out = _original(store, *args, **kwargs)
                key = f"{self.where[0]}:{self.stage}"
                self.counts[key] = self.counts.get(key, 0) + 1
                if self._hit("after"):
                    self._die(_name)
                self.n += 1
                return out

            setattr(Store, name, wrapped)

    def write_trace(self) -> None:
        if self.trace:
            Path(self.trace).write_text(json.dumps(self.counts))


def child_run(config: str | None, overrides: dict[str, Any], target: dict | None, trace: str | None) -> None:
    """One run of the kill scenario (in its own process): ``run_rounds`` with the hook."""
    from coevolve.config import load_config
    from coevolve.round import add_listener, run_rounds

    hook = _KillHook(target, trace)
    hook.install()
    add_listener(hook.on_event)
    run_rounds(load_config(config, overrides))
    hook.write_trace()


def _child(args: list[str], timeout_s: float, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "coevolve.bench.reliability.campaign", *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=Path(__file__).resolve().parents[3]
    )


def _run_child(
    config: str | None,
    overrides: dict,
    target: dict | None,
    trace: str | None,
    timeout_s: float,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    args = ["child", "--overrides", json.dumps(overrides)]
    if config:
        args += ["--config", config]
    if target:
        args += ["--target", json.dumps(target)]
    if trace:
        args += ["--trace", trace]
    return _child(args, timeout_s, env)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = [x for x in (proc.stderr or "").strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else f"exit code {proc.returncode}"


def sample_points(counts: dict[str, int], n: int, rng: random.Random) -> list[dict]:
    """``n`` kill points over the reference run's store operations: every stage gets one
    (while points last), the rest fall uniformly over all operations; in pipeline order."""
    ops = []
    for key, k in counts.items():
        r, stage = key.split(":", 1)
        ops += [(int(r), stage, i) for i in range(k)]
    by_stage: dict[tuple, list] = {}
    for op in ops:
        by_stage.setdefault(op[:2], []).append(op)
    chosen = [rng.choice(v) for v in by_stage.values()][:n]
    rest = [op for op in ops if op not in chosen]
    chosen += rng.sample(rest, min(len(rest), n - len(chosen)))
    points = [
        {
            "round": r,
            "stage": s,
            "stage_idx": _position(r, s)[1] if s != "seed" else -1,
            "op": i,
            "when": rng.choice(["before", "after"]),
        }
        for r, s, i in chosen
    ]
    return sorted(points, key=lambda p: (p["round"], p["stage_idx"], p["op"], p["when"] == "after"))


def kill_scenario(cc: CampaignConfig, work: Path, log: Callable[[str], None]) -> ScenarioResult:
    from coevolve.store import Store

    res = ScenarioResult("kill")
    rng = random.Random(cc.seed)
    base = {**cc.overrides, "rounds": cc.rounds}
    ref_store, trace = work / "kill-reference", work / "kill-reference-ops.json"
    log(f"kill: reference run ({cc.rounds} rounds)")
    proc = _run_child(cc.config, {**base, "store": str(ref_store)}, None, str(trace), cc.run_timeout_s)
    if proc.returncode != 0:
        res.notes.append(f"reference run failed: {_last_line(proc)}")
        return res
    counts = json.loads(trace.read_text())
    reference = table_keys(Store(str(ref_store)))
    points = sample_points(counts, cc.kills, rng)
    store = work / "kill-chaos"
    cfg = {**base, "store": str(store)}
    for i, point in enumerate(points):
        point["report"] = str(work / f"kill-{i}.json")
        proc = _run_child(cc.config, cfg, point, None, cc.run_timeout_s)
        res.tried += 1
        if proc.returncode == -signal.SIGKILL:
            hit = json.loads(Path(point["report"]).read_text())
            log(
                f"kill {i + 1}/{len(points)}: round {hit['round']} {hit['stage']} op {hit['op']} "
                f"({hit['name']}, {hit['when']})"
            )
            res.survived += 1  # the run before it (a resume, from the second on) got this far
        elif proc.returncode == 0:
            res.survived += 1
            res.notes.append(f"point {point} not reached: the run completed first")
        else:
            res.notes.append(f"run {i + 1} failed instead of resuming: {_last_line(proc)}")
    proc = _run_child(cc.config, cfg, None, None, cc.run_timeout_s)
    if proc.returncode != 0:
        res.survived -= 1
        res.notes.append(f"final resume failed: {_last_line(proc)}")
        return res
    chaos = Store(str(store))
    res.rows_lost, res.rows_duplicated, notes = compare_keys(reference, table_keys(chaos))
    res.corrupt_versions, more = corrupt_versions(chaos)
    res.notes += notes + more
    stages = sorted({(p["round"], p["stage"]) for p in points})
    res.notes.append(f"stages hit: {', '.join(f'{r}:{s}' for r, s in stages)}")
    return res


# ============================================================================ concurrent commits
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
                    run_id=run_id, round=1, new_tasks=tasks, expected_parent=latest.version if latest else None
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
    store.commit_pool(run_id="seed", round=0, new_tasks=[{"task_id": "seed"}], expected_parent=None)
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
                        [sys.executable, "-m", "coevolve.bench.reliability.campaign", *args],
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


# ============================================================================ S3 faults
def fault_scenario(cc: CampaignConfig, moto: MotoS3, work: Path, log: Callable[[str], None]) -> ScenarioResult:
    from coevolve.config import load_config
    from coevolve.round import STAGES
    from coevolve.store import Store

    proxy = FaultProxy(moto.url, cc.fault_rate, seed=cc.seed)
    try:
        bucket = moto.bucket("faults")
        res = concurrent_scenario(
            "s3-faults", f"s3://{bucket}/commits", proxy.url, cc, work, log, check_endpoint=moto.url
        )
        if cc.fault_rounds:
            base = {**cc.overrides, "rounds": cc.fault_rounds}
            ref_store = work / "kill-reference"  # the kill scenario's reference run, when it ran
            run_name = load_config(cc.config, base).run_name
            if cc.rounds < cc.fault_rounds or not Store(str(ref_store)).stage_done(
                run_name, cc.fault_rounds, STAGES[-1]
            ):
                log(f"s3-faults: reference run ({cc.fault_rounds} round) on a local store")
                ref_store = work / "faults-reference"
                proc = _run_child(cc.config, {**base, "store": str(ref_store)}, None, None, cc.run_timeout_s)
                if proc.returncode != 0:
                    res.notes.append(f"reference run failed: {_last_line(proc)}")
                    return res
            reference = table_keys(Store(str(ref_store)), max_round=cc.fault_rounds)
            cfg = {**base, "store": f"s3://{bucket}/run", "s3.endpoint_url": proxy.url, "s3.max_attempts": 8}
            res.tried += 1
            completed = False
            for attempt in range(4):
                proc = _run_child(cc.config, cfg, None, None, cc.run_timeout_s)
                if proc.returncode == 0:
                    completed = True
                    break
                res.notes.append(f"run attempt {attempt + 1} failed clearly: {_last_line(proc)}")
            if not completed:  # the rerun with the faults gone must complete
                proc = _run_child(cc.config, {**cfg, "s3.endpoint_url": moto.url}, None, None, cc.run_timeout_s)
                completed = proc.returncode == 0
                if not completed:
                    res.notes.append(f"rerun without faults failed: {_last_line(proc)}")
            if completed:
                res.survived += 1
                store = Store(f"s3://{bucket}/run", endpoint_url=moto.url)
                lost, dup, notes = compare_keys(reference, table_keys(store))
                bad, more = corrupt_versions(store)
                res.rows_lost += lost
                res.rows_duplicated += dup
                res.corrupt_versions += bad
                res.notes += notes + more
        res.notes.append("proxy: " + ", ".join(f"{k} {v}" for k, v in proxy.counts.items()))
        return res
    finally:
        proxy.close()


# ============================================================================ fuzz
def fuzz_outputs(n: int, seed: int = 0, log: Callable[[str], None] = lambda s: None) -> ScenarioResult:
    """``n`` mutated model outputs through ``parse_tool_calls`` and a BFCL episode's ``step``."""
    from coevolve.envs.bfcl import BfclEnvironment
    from coevolve.policy.parsing import parse_tool_calls

    res = ScenarioResult("fuzz")
    rng = random.Random(seed)
    env = BfclEnvironment(step_timeout_s=5.0)
    tasks = env.load_tasks(["multi_turn_base"], limit=8)
    names = sorted({d["name"] for t in tasks for d in env.function_docs(t)})
    good = [
        json.dumps({"name": c["name"], "arguments": c["arguments"]})
        for t in tasks
        for turn in t.reference_actions
        for c in turn
    ] or ['{"name": "ls", "arguments": {}}']
    values = [
        None,
        True,
        0,
        -1,
        10**30,
        1e308,
        float("nan"),
        "",
        "a" * 300,
        "../..",
        [],
        {},
        [1, "x"],
        {"a": {"b": []}},
    ]
    pieces = [
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        "[",
        "]",
        '"',
        ":",
        ",",
        "\\",
        "```json",
        "\x00",
        "\u202e",
        '"name"',
        '"arguments"',
        "null",
        "NaN",
        "Infinity",
        "1e999",
        "\n",
    ]
    episode, t0 = None, time.perf_counter()
    for i in range(n):
        if i % 200 == 0:
            episode = env.episode(tasks[(i // 200) % len(tasks)])
        kind = rng.random()
        if kind < 0.3:  # a valid call, byte-mutated
            text = list(f"<tool_call>{rng.choice(good)}</tool_call>")
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(len(text) + 1)
                op = rng.random()
                if op < 0.4 and text:
                    del text[min(pos, len(text) - 1)]
                elif op < 0.8:
                    text.insert(pos, rng.choice(pieces))
                else:
                    text.insert(pos, chr(rng.randrange(0x20, 0x2FFF)))
            text = "".join(text)
        elif kind < 0.8:  # a well-formed call with random name and arguments
            args = {
                rng.choice(["folder", "file_name", "a", "b", "content", "x" * rng.randint(1, 40)]): rng.choice(values)
                for _ in range(rng.randint(0, 4))
            }
            name = rng.choice(names) if rng.random() < 0.8 else rng.choice(["__init__", "_load_scenario", "eval", "x"])
            try:
                body = json.dumps({"name": name, "arguments": args})
            except ValueError:
                body = '{"name": "ls"}'
            text = f"<tool_call>{body}</tool_call>" * rng.randint(1, 2)
        else:  # random structure
            text = "".join(rng.choice(pieces + ["cd", "ls", "x", " "]) for _ in range(rng.randint(0, 40)))
        res.tried += 1
        try:
            parsed = parse_tool_calls(text)
            for call in parsed.calls:
                obs = episode.step(call)
                if not isinstance(obs.content, str):
                    raise TypeError(f"observation content is {type(obs.content).__name__}")
            if episode.finish_reason:
                episode = env.episode(tasks[i % len(tasks)])
            res.survived += 1
        except Exception as exc:  # noqa: BLE001 - counting them is the point
            if len(res.notes) < 5:
                res.notes.append(f"{type(exc).__name__}: {str(exc)[:150]} on {text[:80]!r}")
        if (i + 1) % 100_000 == 0:
            log(f"fuzz: {i + 1:,} outputs, {res.tried - res.survived} uncaught, {time.perf_counter() - t0:.0f}s")
    return res


# ============================================================================ the campaign
def _leftovers() -> list[Any]:
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


def run_campaign(cc: CampaignConfig, log: Callable[[str], None] = print) -> list[ScenarioResult]:
    """Run the scenarios of ``cc``; returns one result per scenario."""
    work = Path(cc.workdir).resolve() if cc.workdir else Path(tempfile.mkdtemp(prefix="coevolve-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    if cc.config and not Path(cc.config).is_absolute():  # children run from the repository root
        here, repo = Path(cc.config).resolve(), Path(__file__).resolve().parents[3] / cc.config
        cc.config = str(here if here.is_file() else repo)
    results: list[ScenarioResult] = []
    moto = MotoS3() if {"concurrent-s3", "s3-faults"} & set(cc.scenarios) else None
    scenarios: dict[str, Callable[[], ScenarioResult]] = {
        "kill": lambda: kill_scenario(cc, work, log),
        "concurrent-local": lambda: concurrent_scenario(
            "concurrent-local", str(work / "concurrent-local"), "", cc, work, log
        ),
        "concurrent-s3": lambda: concurrent_scenario(
            "concurrent-s3", f"s3://{moto.bucket('concurrent')}/pool", moto.url, cc, work, log
        ),
        "s3-faults": lambda: fault_scenario(cc, moto, work, log),
        "fuzz": lambda: fuzz_outputs(cc.fuzz, cc.seed, log),
    }
    unknown = set(cc.scenarios) - set(scenarios)
    if unknown:
        raise ValueError(f"unknown scenarios {sorted(unknown)}; scenarios: {', '.join(scenarios)}")
    try:
        for name in cc.scenarios:
            t0 = time.perf_counter()
            log(f"== {name}")
            try:
                res = scenarios[name]()
            except Exception as exc:  # noqa: BLE001 - one broken scenario must not hide the others
                res = ScenarioResult(name, notes=[f"scenario crashed: {type(exc).__name__}: {str(exc)[:300]}"])
            res.seconds = time.perf_counter() - t0
            results.append(res)
            log(format_table([res]))
    finally:
        if moto is not None:
            moto.stop()
        left = _leftovers()
        for p in left:
            p.kill()
        if left and results:
            results[-1].notes.append(f"{len(left)} leftover processes killed: {[p.pid for p in left]}")
    return results


def format_table(results: list[ScenarioResult]) -> str:
    """The campaign's table (plain text, any width) and each scenario's notes below it."""
    heads = ("scenario", "tried", "survived", "rows lost", "rows duplicated", "corrupt versions", "seconds")
    rows = [
        (
            r.scenario,
            f"{r.tried:,}",
            f"{r.survived:,}",
            str(r.rows_lost),
            str(r.rows_duplicated),
            str(r.corrupt_versions),
            f"{r.seconds:.0f}",
        )
        for r in results
    ]
    widths = (
        [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(heads)] if rows else [len(h) for h in heads]
    )
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(heads), line(["-" * w for w in widths])] + [line(r) for r in rows]
    out += [f"  {r.scenario}: {note}" for r in results for note in r.notes]
    return "\n".join(out)


def _main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m coevolve.bench.reliability.campaign")
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("child")
    c.add_argument("--config")
    c.add_argument("--overrides", default="{}")
    c.add_argument("--target")
    c.add_argument("--trace")
    m = sub.add_parser("committer")
    for a in ("store", "endpoint", "run-id", "tag", "go", "out"):
        m.add_argument(f"--{a}", default="")
    m.add_argument("--n", type=int, default=1)
    args = parser.parse_args(argv)
    if args.cmd == "child":
        child_run(args.config, json.loads(args.overrides), json.loads(args.target) if args.target else None, args.trace)
    else:
        committer(args.store, args.endpoint, args.run_id, args.tag, args.n, args.go, args.out)


if __name__ == "__main__":
    _main(sys.argv[1:])
