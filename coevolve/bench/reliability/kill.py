"""The ``kill`` scenario: a reference run, then a chain of runs on a fresh store, each SIGKILLed at
the next of ``kills`` random points (a store operation of a stage, just before or just after it),
each resuming what the previous left; a last run completes. The final tables must hold exactly the
reference run's keys.

    res = kill_scenario(CampaignConfig(kills=3), Path("/tmp/chaos"), log=print)

The hook (``_KillHook``) runs inside the child run (``child_run``), counting store operations per
stage and killing its own process at the target.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any, Callable

from coevolve.bench.reliability.common import (
    CampaignConfig,
    ScenarioResult,
    compare_keys,
    corrupt_versions,
    last_line,
    run_child,
    table_keys,
)


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
    from coevolve.events import add_listener
    from coevolve.round import run_rounds

    hook = _KillHook(target, trace)
    hook.install()
    add_listener(hook.on_event)
    run_rounds(load_config(config, overrides))
    hook.write_trace()


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
    proc = run_child(cc.config, {**base, "store": str(ref_store)}, None, str(trace), cc.run_timeout_s)
    if proc.returncode != 0:
        res.notes.append(f"reference run failed: {last_line(proc)}")
        return res
    counts = json.loads(trace.read_text())
    reference = table_keys(Store(str(ref_store)))
    points = sample_points(counts, cc.kills, rng)
    store = work / "kill-chaos"
    cfg = {**base, "store": str(store)}
    for i, point in enumerate(points):
        point["report"] = str(work / f"kill-{i}.json")
        proc = run_child(cc.config, cfg, point, None, cc.run_timeout_s)
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
            res.notes.append(f"run {i + 1} failed instead of resuming: {last_line(proc)}")
    proc = run_child(cc.config, cfg, None, None, cc.run_timeout_s)
    if proc.returncode != 0:
        res.survived -= 1
        res.notes.append(f"final resume failed: {last_line(proc)}")
        return res
    chaos = Store(str(store))
    res.rows_lost, res.rows_duplicated, notes = compare_keys(reference, table_keys(chaos))
    res.corrupt_versions, more = corrupt_versions(chaos)
    res.notes += notes + more
    stages = sorted({(p["round"], p["stage"]) for p in points})
    res.notes.append(f"stages hit: {', '.join(f'{r}:{s}' for r, s in stages)}")
    return res
