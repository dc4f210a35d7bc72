"""``coevolve bench security``: every attack and clumsy input of issue 29, tried on loopback
against scratch stores, each reported as tried / held / failed.

    from coevolve.bench.security import run_probes, format_table
    rows = run_probes(fast=True)          # the form .ci/run runs
    print(format_table(rows))

A probe is one thing an attacker or a careless user would try (write through ``coevolve sql``,
plant a truncated Parquet part, call ``coevolve serve`` without its key, ...). It makes one or
more attempts; an attempt is *held* when the defence refused it the way it should (a clear error,
nothing written, nothing leaked) and *failed* when it got through. Probes live by area, one module
each (``sql``, ``store``, ``stack``, ``params``, ``serve``); each module exports ``PROBES``.
"""

from __future__ import annotations

import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from coevolve.bench.security.probe import Attempt, Probe, ProbeResult

__all__ = ["Attempt", "Probe", "ProbeResult", "all_probes", "format_table", "run_probes"]


def all_probes() -> list[Probe]:
    from coevolve.bench.security import params, serve, sql, stack, store

    return [p for module in (sql, store, stack, params, serve) for p in module.PROBES]


def run_probes(
    fast: bool = False,
    areas: list[str] | None = None,
    names: list[str] | None = None,
    log: Callable[[str], None] = lambda s: None,
) -> list[ProbeResult]:
    """Run the chosen probes (all by default), each in a scratch directory of its own."""
    probes = [p for p in all_probes() if (not areas or p.area in areas) and (not names or p.name in names)]
    results = []
    for probe in probes:
        result = ProbeResult(probe)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"coevolve-security-{probe.name}-") as work:
            try:
                for attempt in probe.run(Path(work), fast):
                    result.attempts.append(attempt)
                    if not attempt.held:
                        log(f"  FAILED {probe.name}: {attempt.what}: {attempt.detail}")
            except Exception as exc:  # a crashing probe is a finding, reported, never hidden
                result.error = f"{type(exc).__name__}: {exc}"
                log(f"  ERROR {probe.name}: {traceback.format_exc(limit=3)}")
        result.seconds = time.perf_counter() - start
        log(f"{probe.area:>6} {probe.name}: {result.held}/{result.tried} held ({result.seconds:.1f}s)")
        results.append(result)
    return results


def format_table(results: list[ProbeResult]) -> str:
    head = f"{'area':<7} {'probe':<28} {'tried':>5} {'held':>5} {'failed':>6}  attack"
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r.probe.area:<7} {r.probe.name:<28} {r.tried:>5} {r.held:>5} {r.failed:>6}  {r.probe.attack}")
    tried, held = sum(r.tried for r in results), sum(r.held for r in results)
    lines.append(f"{'all':<7} {len(results):<28} {tried:>5} {held:>5} {tried - held:>6}")
    return "\n".join(lines)
