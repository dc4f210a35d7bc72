"""A `coevolve run` killed with SIGKILL takes the Prefect API server it started with it (issue 14)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def test_sigkilled_run_leaves_no_prefect_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1", PREFECT_HOME=str(tmp_path / "prefect"))
    cmd = [sys.executable, "-m", "flows", "run", "--config", "configs/tiny.yaml", "--store", str(tmp_path / "s")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        server = None
        deadline = time.time() + 120
        while server is None and proc.poll() is None and time.time() < deadline:
            for child in psutil.Process(proc.pid).children(recursive=True):
                try:
                    if "uvicorn" in " ".join(child.cmdline()):
                        server = child
                except psutil.Error:
                    continue
            time.sleep(0.2)
        assert server is not None, "the run never started a Prefect API server"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        gone, alive = psutil.wait_procs([server], timeout=15)
        for p in alive:  # a failing run of this test must not leave the orphan either
            p.kill()
        assert not alive, f"Prefect server {server.pid} outlived the killed run"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_summary_printed_to_a_log_keeps_every_column(capsys):
    from flows.cli.run import print_summary

    row = {"round": 1, "pool_size": 160, "eval_reward": 0.085, "synth_score": 0.0, "synth_reward": 0.0604}
    row.update({"t_train": 500.0, "t_total": 900.0, "t_train_load": 30.0, "t_evaluate_rest": 12.5})
    print_summary([row])  # stdout is captured here, not a terminal: a log file's case
    out = capsys.readouterr().out
    heads = "round pool signals cands kept pass partial trainR eval evalR synth synthR".split()
    header = next(line for line in out.splitlines() if line.split()[:2] == ["round", "pool"])
    assert header.split() == heads
    assert "0.06" in out and "12.50" in out  # the last column of the summary and of the split


def test_the_machine_line_names_the_cpu_capability_precision_and_cores(monkeypatch):
    import torch

    import coevolve.policy.local as local
    from coevolve.processes import usable_cores
    from coevolve.timing import machine_line

    capability = torch.backends.cpu.get_cpu_capability()
    monkeypatch.setattr(local, "cpu_has_native_bf16", lambda: True)
    assert machine_line().startswith(f"this machine: CPU {capability}, native bfloat16, {usable_cores()} cores")
    monkeypatch.setattr(local, "cpu_has_native_bf16", lambda: False)
    assert f"CPU {capability}, no native bfloat16 (float32), " in machine_line()
