"""Tests of ``coevolve serve`` (a real process on loopback) and ``coevolve bench rollout``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx
from typer.testing import CliRunner

from coevolve.registry import register
from test_rollout import CounterEnv  # tests/ is on sys.path (pytest rootdir-relative import)

register("environment", "test-counter")(CounterEnv)


def test_bench_rollout_prints_both_modes_side_by_side():
    from coevolve.cli import app

    res = CliRunner().invoke(
        app,
        [
            "bench",
            "rollout",
            "--env",
            "test-counter",
            "--category",
            "any",
            "--episodes",
            "4",
            "--samples",
            "2",
            "--batch-size",
            "4",
            "--max-new-tokens",
            "4",
            "--step-limit",
            "2",
            "--threads",
            "0",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "batched (4)" in res.output and "one at a time" in res.output and "1.00x" in res.output
    assert "same seed, same rollouts (batched run repeated): yes" in res.output
    bad = CliRunner().invoke(app, ["bench", "rollout", "--episodes", "5", "--samples", "2"])
    assert bad.exit_code != 0 and "multiple" in bad.output


def test_serve_command_answers_on_loopback():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "coevolve.cli", "serve", "--model", "tiny", "--port", str(port), "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.2)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=30,
            json={"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3
    finally:
        proc.terminate()
        proc.wait(timeout=10)
