"""What the Prefect-facing tests share: rounds that run every stage with almost no work,
a free loopback port, and a real `prefect server start` that is up (or the test fails with
the end of its log) and stopped afterwards."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from coevolve.processes import stop

ROOT = Path(__file__).resolve().parents[1]

# rounds with every stage and almost no work: what is tested is which rounds run, not learning
FAST = {
    "train.steps": 0,
    "train.sft_steps": 0,
    "explore.contexts": 2,
    "explore.runs_per_context": 1,
    "validate.solver": "none",
    "eval.categories": ["multi_turn_base"],
    "eval.step_limit": 1,
    "eval.max_new_tokens": 8,
}


@contextlib.contextmanager
def running_prefect_server(
    command: list[str], port: int, env: dict[str, str], log_path: Path, timeout_s: float
) -> Iterator[None]:
    """Run ``command`` (a `prefect server start ...`) until it answers on ``port``'s health
    endpoint within ``timeout_s``; stop it on exit."""
    import httpx

    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + timeout_s
            while True:
                assert server.poll() is None, log_path.read_text()[-3000:]
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.time() < deadline, f"prefect server did not start in {timeout_s:.0f} s"
                time.sleep(0.5)
            yield
        finally:
            stop(server, timeout_s=20)
