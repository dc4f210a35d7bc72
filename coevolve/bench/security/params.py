"""Security probes: params (see coevolve.bench.security)."""

from __future__ import annotations

from coevolve.bench.security.probe import Probe

PROBES: tuple[Probe, ...] = ()
