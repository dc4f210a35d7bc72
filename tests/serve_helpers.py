"""``coevolve serve --model tiny`` as its own process on a free loopback port, up (or the test
fails with the end of its log) and stopped afterwards: what the server and LLM-stage tests share.
With ``api_key`` the server requires it, given the way an operator should: COEVOLVE_SERVE_API_KEY."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from coevolve.processes import free_port, stop


@contextlib.contextmanager
def served_tiny_model(timeout_s: float = 90, api_key: str | None = None) -> Iterator[str]:
    """Yields the server's OpenAI-compatible base URL (``http://127.0.0.1:<port>/v1``)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "COEVOLVE_SERVE_API_KEY"}
    if api_key:
        env["COEVOLVE_SERVE_API_KEY"] = api_key
    proc = subprocess.Popen(
        [sys.executable, "-m", "coevolve.cli", "serve", "--model", "tiny", "--port", str(port), "--threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout_s
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
            if proc.poll() is not None:
                raise RuntimeError(f"coevolve serve exited: {proc.stderr.read().decode()[-2000:]}")
            if time.time() > deadline:
                raise RuntimeError(f"coevolve serve was not up on port {port} within {timeout_s:g} s")
        yield f"{url}/v1"
    finally:
        stop(proc, timeout_s=20)
