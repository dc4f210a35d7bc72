"""Tests of the verified model cache (``coevolve.policy.models``): a second load hits the cache
and gives identical weights; a corrupt entry is rebuilt, not trusted; SmolLM2's entry is keyed
by the GGUF's content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from coevolve.policy import models


@pytest.fixture
def counted_build(tmp_path, monkeypatch):
    """The tiny model's recipe under a verified cache entry, counting its builds."""
    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "_verified", set())  # a fresh process: nothing checked yet
    builds = []

    def build(out: Path) -> None:
        builds.append(out)
        models._build_tiny(out)

    def resolve() -> Path:
        return Path(models._build_cached("verified-tiny", build, verify=True))

    return resolve, builds


def _weights(path: Path) -> dict:
    # cloned: load_file maps the file, which the tests then damage
    return {k: v.clone() for k, v in load_file(str(path / "model.safetensors")).items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)


def test_a_second_load_hits_the_cache_with_identical_weights(counted_build, monkeypatch):
    resolve, builds = counted_build
    path = resolve()
    first = _weights(path)
    manifest = json.loads((path / models.MANIFEST).read_text())["sha256"]
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest)
    assert resolve() == path and len(builds) == 1
    monkeypatch.setattr(models, "_verified", set())  # another process: checks the files again
    assert resolve() == path and len(builds) == 1, "an intact entry is not rebuilt"
    assert _same(_weights(path), first)


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "drop the manifest", "edit the config"])
def test_a_corrupt_entry_is_rebuilt_not_trusted(counted_build, monkeypatch, damage):
    resolve, builds = counted_build
    path = resolve()
    first = _weights(path)
    weights = path / "model.safetensors"
    if damage == "flip a byte":
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF  # inside the last tensor: still loads, silently wrong
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "drop the manifest":
        (path / models.MANIFEST).unlink()
    else:
        (path / "config.json").write_text((path / "config.json").read_text().replace("4096", "8192"))
    monkeypatch.setattr(models, "_verified", set())  # a later process
    assert resolve() == path and len(builds) == 2, "the damaged entry was rebuilt"
    assert _same(_weights(path), first)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], "nothing left aside"


def test_smollm2_entries_are_keyed_by_the_ggufs_content(tmp_path, monkeypatch):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"one")
    monkeypatch.setattr(models, "smollm2_gguf", lambda: gguf)
    one = models.smollm2_cache_name()
    assert one.startswith(models.SMOLLM2_DIR + "-") and one == models.smollm2_cache_name()
    gguf.write_bytes(b"two")
    assert models.smollm2_cache_name() != one, "another GGUF is another entry"
