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


# --------------------------------------------------------------------------- issue 29: refused at the door
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("policy.batch_size", 0),
        ("policy.max_new_tokens", -5),
        ("policy.temperature", float("nan")),
        ("policy.temperature", -1),
        ("policy.concurrency", -4),
        ("rounds", 10**30),
        ("rounds", 10_001),
        ("train.lr", float("inf")),
        ("policy.top_p", 0),
        ("s3.read_timeout_s", 0),
    ],
)
def test_numbers_out_of_range_are_refused_naming_the_field(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        load_config(None, {key: value})
    assert "\n" not in str(err.value)


def test_every_ranged_field_states_its_range_in_its_help():
    import dataclasses

    ranged = 0
    for section in dataclasses.fields(RunConfig):
        cls = section.default_factory if callable(section.default_factory) else None
        fields = dataclasses.fields(cls) if cls and dataclasses.is_dataclass(cls) else [section]
        for f in fields:
            if "range" in f.metadata:
                ranged += 1
                assert f"Range: {f.metadata['range']}." in f.metadata["help"], f.name
    assert ranged >= 60


def test_a_set_value_that_is_not_yaml_is_one_line_naming_the_key():
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["run", "--set", "train.steps=[1"])
    text = " ".join(result.output.split())
    assert result.exit_code != 0 and text.startswith("error: --set train.steps:") and "Traceback" not in result.output


def test_a_store_path_that_is_a_file_is_refused_before_prefect_starts(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    afile = tmp_path / "store"
    afile.write_text("x")
    result = CliRunner().invoke(app, ["run", "--config", str(CONFIGS / "tiny.yaml"), "--store", str(afile)])
    assert result.exit_code == 2 and "is a file" in " ".join(result.output.split()), result.output


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("explore.explorer", "this:s"),
        ("train.backend", "os:system"),
        ("validate.solver", "os:system"),
        ("env.name", "subprocess:Popen"),
        ("synth.explorer", "builtins:exec"),
    ],
)
def test_a_plugin_path_from_an_override_alone_is_refused(key, path):
    with pytest.raises(ConfigError, match="not allowed"):
        load_config(None, {key: path})


def test_plugin_paths_the_file_or_the_worker_trusts_are_allowed(tmp_path, monkeypatch):
    from coevolve.registry import resolve

    path = "coevolve.explorers.random:RandomExplorer"
    with pytest.raises(ConfigError, match="trust is read from the config file only"):
        load_config(None, {"trust.plugins": [path], "explore.explorer": path})
    trusting = tmp_path / "trusting.yaml"
    trusting.write_text(f"trust: {{plugins: ['{path}']}}\n")
    assert load_config(trusting, {"explore.explorer": path}).explore.explorer == path
    assert resolve("explorer", path).__name__ == "RandomExplorer"
    monkeypatch.setenv("COEVOLVE_PLUGINS", "coevolve.abstractors.template:TemplateAbstractor")
    load_config(None, {"abstract.abstractor": "coevolve.abstractors.template:TemplateAbstractor"})
    with pytest.raises(KeyError, match="trusted"):
        resolve("explorer", "this:s")


def test_api_key_env_names_only_api_key_variables(tmp_path):
    for var in ("AWS_SECRET_ACCESS_KEY", "PATH", "HOME"):
        with pytest.raises(ConfigError, match="policy.api_key_env"):
            load_config(None, {"policy.api_key_env": var})
    assert load_config(None, {"policy.api_key_env": "VLLM_API_KEY"}).policy.api_key_env == "VLLM_API_KEY"
    listed = tmp_path / "listed.yaml"
    listed.write_text("trust: {api_key_envs: [VLLM_KEY]}\npolicy: {api_key_env: VLLM_KEY}\n")
    assert load_config(listed).policy.api_key_env == "VLLM_KEY"


def test_an_override_that_moves_an_endpoint_drops_its_key(tmp_path):
    named = tmp_path / "endpoint.yaml"
    named.write_text("policy: {backend: openai, model: m, base_url: 'http://10.0.0.1/v1'}\n")
    assert load_config(named).policy.api_key_env == "OPENAI_API_KEY"  # the file's own endpoint
    assert load_config(named, {"policy.model": "n"}).policy.api_key_env == "OPENAI_API_KEY"
    moved = load_config(named, {"policy.base_url": "http://127.0.0.1:9/v1", "policy.api_key_env": "OPENAI_API_KEY"})
    assert moved.policy.api_key_env == ""
    assert load_config(None, {"explore.base_url": "http://127.0.0.1:9/v1"}).explore.api_key_env == ""


def test_flows_read_configs_only_from_allowed_folders(tmp_path, monkeypatch):
    from coevolve.config import check_config_path

    assert check_config_path("configs/tiny.yaml") == CONFIGS / "tiny.yaml"
    for path in ("/etc/passwd", "configs/../../../etc/passwd", str(tmp_path / "x.yaml")):
        with pytest.raises(ConfigError, match="outside the allowed folders"):
            check_config_path(path)
    monkeypatch.setenv("COEVOLVE_CONFIG_DIRS", str(tmp_path))
    assert check_config_path(tmp_path / "x.yaml") == tmp_path / "x.yaml"
    with pytest.raises(ConfigError, match="yaml"):
        check_config_path(tmp_path / "credentials")


@pytest.mark.parametrize(
    "text",
    [
        "[default]\naws_access_key_id = AKIA{c}\naws_secret_access_key = {c}\n",
        "aws_secret_access_key: {c}\n",
        "{c}-key: 1\n",
        "train: [{c}\n",
        "rounds: {c}\n",
        "train: {{steps: [{c}]}}\n",
    ],
)
def test_an_error_never_quotes_the_file(tmp_path, text):
    canary = "CANARY-SECRET-42"
    path = tmp_path / "not-a-config.yaml"
    path.write_text(text.format(c=canary))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert canary not in str(err.value) and str(path) in str(err.value)
