"""Run names and config-derived paths are validated before anything is written (issue 14)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from coevolve.config import ConfigError, load_config


@pytest.mark.parametrize(
    "name",
    [
        "..",
        ".",
        "a/b",
        "/etc",
        "/abs/path",
        "a\\b",
        "",
        "-x",
        ".hidden",
        "a b",
        "x" * 129,
        "na\x00me",
        "..\\..",
        "a/../b",
    ],
)
def test_unsafe_run_names_are_rejected(name):
    with pytest.raises(ConfigError, match="run_name"):
        load_config(None, {"run_name": name})


@pytest.mark.parametrize("name", ["nightly", "a2", "run_1.v-2", "X" * 128])
def test_safe_run_names_pass(name):
    assert load_config(None, {"run_name": name}).run_name == name


@pytest.mark.parametrize(
    "key,value",
    [
        ("store", "s3://bucket/a/../../other"),
        ("store", "s3://Bad_Bucket/x"),
        ("store", "s3:///x"),
        ("store", "gs://bucket/x"),
        ("store", "dir\nname"),
        ("train.checkpoint_dir", "s3://bucket/./x"),
        ("train.checkpoint_dir", "s3://bucket//x"),
    ],
)
def test_escaping_locations_are_rejected(key, value):
    with pytest.raises(ConfigError, match=key.split(".")[-1]):
        load_config(None, {key: value})


@pytest.mark.parametrize("key,value", [("s3.retry_mode", "legacy"), ("s3.max_attempts", 0), ("s3.read_timeout_s", 0)])
def test_s3_client_settings_are_checked(key, value):
    with pytest.raises(ConfigError, match=key):
        load_config(None, {key: value})


def test_cli_rejects_a_bad_run_name_before_writing(tmp_path):
    store = tmp_path / "store"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows",
            "run",
            "--config",
            "configs/tiny.yaml",
            "--store",
            str(store),
            "--run-name",
            "..",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "run_name" in proc.stdout + proc.stderr
    assert not store.exists() and not (tmp_path / "checkpoints").exists()
