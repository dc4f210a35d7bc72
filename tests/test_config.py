"""Config: defaults load, YAML files and overrides apply, mistakes name their field."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevolve.config import ConfigError, RunConfig, TrainConfig, load_config

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
    assert (cfg.rounds, cfg.train.steps, cfg.validate.attempts) == (3, 5, 2)
    assert RunConfig.from_dict(cfg.to_dict()) == cfg


def test_an_exponent_float_reads_as_a_float_where_a_float_is_expected(tmp_path):
    # PyYAML (YAML 1.1) reads 6e-3 as the string '6e-3'; a user and YAML 1.2 mean a float
    path = tmp_path / "lr.yaml"
    path.write_text("train: {sft_lr: 6e-3, lr: 1E-4}")
    cfg = load_config(path, {"policy.top_p": "9.5e-1"})
    assert (cfg.train.sft_lr, cfg.train.lr, cfg.policy.top_p) == (6e-3, 1e-4, 0.95)
    with pytest.raises(ConfigError, match=r"train\.lr"):
        load_config(overrides={"train.lr": "fast"})


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


SECTIONS = """
rounds: 2
policy: {model: tiny, max_new_tokens: 96, temperature: 0.7}
for_env:
  agentdojo:
    policy: {model: "tiny:agentdojo", max_new_tokens: 160}
    train: {sft_steps: 400}
"""


def test_a_for_env_section_applies_to_its_environment_only(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(SECTIONS)
    bfcl = load_config(path)
    assert (bfcl.env.name, bfcl.policy.model, bfcl.policy.max_new_tokens, bfcl.train.sft_steps) == (
        "bfcl-v3",
        "tiny",
        96,
        TrainConfig().sft_steps,
    )
    dojo = load_config(path, {"env.name": "agentdojo"})
    assert (dojo.policy.model, dojo.policy.max_new_tokens, dojo.train.sft_steps) == ("tiny:agentdojo", 160, 400)
    assert dojo.policy.temperature == 0.7, "keys the section does not name keep the file's values"
    assert load_config(path, {"env.name": "agentdojo", "policy.max_new_tokens": 200}).policy.max_new_tokens == 200, (
        "a --set wins over the section"
    )
    assert RunConfig.from_dict(dojo.to_dict()) == dojo


@pytest.mark.parametrize(
    "text, message",
    [
        ("for_env: [agentdojo]", "for_env: expected a mapping"),
        ("for_env: {agentdojo: 3}", "for_env.agentdojo: expected a mapping"),
        ("for_env: {other: {train: {stepz: 1}}}", r"for_env\.other: train\.stepz: unknown key"),
        ("for_env: {agentdojo: {env: {name: bfcl-v3}}}", "cannot change the environment"),
    ],
)
def test_bad_for_env_sections_fail_on_any_environment(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)
