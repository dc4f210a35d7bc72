"""pyproject's ranges admit both stacks the project runs on, so that nobody re-pins by accident:
these CPU machines (Python 3.11, the CPU wheel torch 2.13.0 the Makefile installs first) and a
GPU image (Python 3.12, verl[vllm]==0.9.1's torch 2.11.0 and transformers 5.9.0, a CUDA image's
transformers 5.17). The resolution itself is checked by infra/check-gpu-deps.sh (needs PyPI)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DEPS = {r.name: r.specifier for r in map(Requirement, PYPROJECT["project"]["dependencies"])}


@pytest.mark.parametrize(
    "name,version",
    [
        ("torch", "2.13.0"),  # the CPU wheel on these machines' disk (Makefile)
        ("torch", "2.11.0"),  # verl[vllm]==0.9.1 / vllm 0.24.0
        ("transformers", "5.9.0"),  # verl[vllm]==0.9.1
        ("transformers", "5.10.4"),  # the newest verl 0.9.1 itself accepts (<5.11)
        ("transformers", "5.17.0"),  # the GPU machine's image
        ("prefect", "3.9.1"),  # what the Makefile installs here
        ("prefect", "3.7.7"),  # the newest beside vllm 0.24.0 (fastapi <0.137; Prefect 3.8+ needs >=0.139)
    ],
)
def test_core_ranges_admit_the_cpu_and_gpu_stacks(name, version):
    assert Version(version) in DEPS[name], f"{name} {DEPS[name]} refuses {version}"


def test_python_range_admits_311_and_312_and_the_tools_target_its_floor():
    python = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert Version("3.11") in python and Version("3.12") in python
    floor = min(v for v in (Version(f"3.{m}") for m in range(8, 20)) if v in python)
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py3{floor.minor}"
    assert PYPROJECT["tool"]["mypy"]["python_version"] == str(floor)


def test_makefile_installs_an_admitted_torch_before_the_project():
    recipe = (ROOT / "Makefile").read_text()
    torch_at = re.search(r"pip install --quiet torch==([\d.]+)\n", recipe)
    project_at = recipe.find("pip install --quiet -e '.[")
    assert torch_at and 0 <= torch_at.start() < project_at, "the Makefile must install torch before the project"
    assert Version(torch_at.group(1)) in DEPS["torch"]


def test_verl_extra_overlaps_installed_verl_transformers_range():
    try:
        requires = metadata.requires("verl") or []
    except metadata.PackageNotFoundError:
        pytest.skip("verl is not installed (the [verl] extra)")
    verl_tf = next(
        Requirement(r) for r in requires if Requirement(r).name == "transformers" and not Requirement(r).marker
    )
    both = verl_tf.specifier & DEPS["transformers"]
    assert Version("5.9.0") in both and Version(metadata.version("transformers")) in both
