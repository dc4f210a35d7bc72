"""What a security probe is and what it found (the runner is ``coevolve.bench.security``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Attempt:
    """One try: what was tried, whether the defence held, and what it answered (or what leaked)."""

    what: str
    held: bool
    detail: str = ""


@dataclass(frozen=True)
class Probe:
    """One line of issue 29's list: ``run(work, fast)`` yields its attempts; ``work`` is an empty
    scratch directory of its own; ``fast`` asks for the quick form (.ci/run)."""

    name: str
    area: str
    attack: str
    run: Callable[[Path, bool], Iterator[Attempt]]


@dataclass
class ProbeResult:
    probe: Probe
    attempts: list[Attempt] = field(default_factory=list)
    error: str | None = None  # the probe itself crashed: counted as failed, never as held
    seconds: float = 0.0

    @property
    def tried(self) -> int:
        return len(self.attempts) + (1 if self.error else 0)

    @property
    def held(self) -> int:
        return sum(a.held for a in self.attempts)

    @property
    def failed(self) -> int:
        return self.tried - self.held
