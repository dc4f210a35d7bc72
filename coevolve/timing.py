"""Where a stage's time went: named wall-clock parts, summed.

    splits = Splits()
    with splits.part("load"):
        policy = load_policy(...)
    splits.add("decode", stats.decode_s)
    splits.seconds          # {"load": 2.31, "decode": 40.2}, rounded to the millisecond

Stages put their parts into their marker (``split``) and ``coevolve.round.record_round``
writes them to ``rounds`` as ``t_<stage>_<part>`` columns (``SPLIT_COLUMNS``). ``machine_line``
names what the machine computes on, printed beside timings (``coevolve run``, ``bench floor``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

# stage -> its parts, as ``rounds`` columns t_<stage>_<part> (coevolve.schemas.ROUNDS)
SPLIT_COLUMNS: dict[str, tuple[str, ...]] = {
    "train": ("load", "sft", "rollouts", "update", "checkpoint"),
    "validate": ("pass1", "pass2"),
    "evaluate": ("load", "prefill", "decode", "rest"),
}


class Splits:
    """Seconds per named part; a part timed twice adds up."""

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    @property
    def seconds(self) -> dict[str, float]:
        return {k: float(f"{v:.3f}") for k, v in self._seconds.items()}


def machine_line() -> str:
    """What this machine computes on, printed beside a run's timings: the CPU instruction set
    torch dispatches to, whether it computes in bfloat16 natively (the default model then
    generates and trains in bfloat16, else float32), the cores this process may use, a GPU."""
    import torch

    from coevolve.policy.local import cpu_has_native_bf16
    from coevolve.processes import usable_cores

    bf16 = "native bfloat16" if cpu_has_native_bf16() else "no native bfloat16 (float32)"
    line = f"this machine: CPU {torch.backends.cpu.get_cpu_capability()}, {bf16}, {usable_cores()} cores"
    if torch.cuda.is_available():
        line += f", GPU {torch.cuda.get_device_name(0)}"
    return line
