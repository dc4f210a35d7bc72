"""The fault campaign's runner: the scenarios of a ``CampaignConfig`` one after the other, a
table of what each tried, survived, lost, duplicated or corrupted, and every process the campaign
started accounted for at the end (``leftover`` processes are reported and killed).

    coevolve bench reliability --kills 3 --fuzz 20000 --scenarios kill,fuzz   # a quick look
    results = run_campaign(CampaignConfig(scenarios=["fuzz"], fuzz=20_000))
    print(format_table(results))
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from coevolve.bench.reliability.common import REPO, CampaignConfig, ScenarioResult
from coevolve.bench.reliability.concurrent import concurrent_scenario
from coevolve.bench.reliability.faults import fault_scenario
from coevolve.bench.reliability.fuzz import fuzz_outputs
from coevolve.bench.reliability.kill import kill_scenario
from coevolve.bench.reliability.parts import damaged_parts_scenario, torn_writes_scenario
from coevolve.bench.reliability.s3_faults import MotoS3


def _leftovers() -> list[Any]:
    import psutil

    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


def run_campaign(cc: CampaignConfig, log: Callable[[str], None] = print) -> list[ScenarioResult]:
    """Run the scenarios of ``cc``; returns one result per scenario."""
    work = Path(cc.workdir).resolve() if cc.workdir else Path(tempfile.mkdtemp(prefix="coevolve-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    if cc.config and not Path(cc.config).is_absolute():  # children run from the repository root
        here, repo = Path(cc.config).resolve(), REPO / cc.config
        cc.config = str(here if here.is_file() else repo)
    results: list[ScenarioResult] = []
    moto = MotoS3() if {"concurrent-s3", "s3-faults", "damaged-parts-s3"} & set(cc.scenarios) else None
    scenarios: dict[str, Callable[[], ScenarioResult]] = {
        "kill": lambda: kill_scenario(cc, work, log),
        "concurrent-local": lambda: concurrent_scenario(
            "concurrent-local", str(work / "concurrent-local"), "", cc, work, log
        ),
        "concurrent-s3": lambda: concurrent_scenario(
            "concurrent-s3", f"s3://{moto.bucket('concurrent')}/pool", moto.url, cc, work, log
        ),
        "s3-faults": lambda: fault_scenario(cc, moto, work, log),
        "damaged-parts": lambda: damaged_parts_scenario("damaged-parts", str(work / "damaged-parts"), cc, log),
        "damaged-parts-s3": lambda: damaged_parts_scenario(
            "damaged-parts-s3", f"s3://{moto.bucket('damaged-parts')}/store", cc, log, endpoint=moto.url
        ),
        "torn-writes": lambda: torn_writes_scenario(cc, work, log),
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
