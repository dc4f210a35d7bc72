"""Config: defaults load, YAML files and overrides apply, mistakes name their field."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevolve.config import ConfigError, RunConfig, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_defaults_are_the_embedded_default():
    cfg = load_config()
    assert cfg.rounds == 2 and cfg.env.name == "bfcl-v3" and cfg.policy.model == "smollm2"
    assert cfg.explore.explorer == "rule" and cfg.abstract.abstractor == "template"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    load_config(path)


def test_overrides_and_round_trip(tmp_path):
    cfg = load_config(CONFIGS / "tiny.yaml", {"rounds": 3, "train.steps": 5, "validate.attempts": 2})
    assert (cfg.rounds, cfg.train.steps, cfg.validate_.attempts) == (3, 5, 2)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    "text, field",
    [
        ("train: {stepz: 1}", "train.stepz"),
        ("train: {steps: many}", "train.steps"),
        ("env: {categories: multi_turn_base}", "env.categories"),
        ("policy: {backend: grpc}", "policy.backend"),
        ("rounds: 0", "rounds"),
        ("- a list", "top level"),
        ("train: [", "not valid YAML"),
    ],
)
def test_bad_configs_name_the_field(tmp_path, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(path)


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("no/such/file.yaml")
