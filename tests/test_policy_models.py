"""Tests of model sources and policy loading: the tiny test model, local directories, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevolve.config import PolicyConfig
from coevolve.policy import load_policy
from coevolve.policy.models import resolve_model
from coevolve.registry import names


def test_tiny_model_builds_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path))
    path = Path(resolve_model("tiny"))
    assert path.parent == tmp_path
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in path.iterdir()
    }
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temporary build left behind"
    from coevolve.policy import models

    def no_rebuild(out, *args, **kwargs):
        raise AssertionError("a cached model is not rebuilt")

    with monkeypatch.context() as patched:
        patched.setattr(models, "_build_tiny", no_rebuild)
        assert resolve_model("tiny") == str(path)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == "qwen2" and 0.5e6 < model.num_parameters() < 3e6
    assert tok.convert_ids_to_tokens(tok.encode("<tool_call>{}</tool_call>"))[0] == "<tool_call>"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[{"name": "ls"}], tokenize=False, add_generation_prompt=True
    )
    assert "<tools>" in text and text.endswith("<|im_start|>assistant\n")


def test_local_directories_pass_through_and_unknown_names_fail(tmp_path):
    tiny = resolve_model("tiny")
    assert resolve_model(tiny) == tiny
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        resolve_model("no-such-model")
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model(str(tmp_path))


def test_load_policy_by_backend_name():
    assert {"local", "openai"} <= set(names("policy"))
    policy = load_policy(PolicyConfig(model="tiny"))
    assert policy.version == "tiny" and policy.model_path == resolve_model("tiny")
    assert policy.model.config.model_type == "qwen2" and policy.tokenizer.eos_token == "<|im_end|>"
    again = load_policy(PolicyConfig(model="smollm2"), checkpoint=policy.model_path)
    assert again.version == policy.model_path, "a checkpoint overrides cfg.model"
    with pytest.raises(ValueError, match="base_url"):
        load_policy(PolicyConfig(backend="openai", model="tiny"))


def test_tiny_for_an_environment_learns_its_domain_text(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from coevolve.envs import agentdojo
    from coevolve.policy.prompts import render_tools

    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path))
    plain, dojo = resolve_model("tiny"), resolve_model("tiny:agentdojo")
    assert Path(dojo).name.startswith("tiny-qwen2-v3-agentdojo-") and Path(dojo).parent == tmp_path
    assert resolve_model("tiny:agentdojo") == dojo, "cached by its corpus"
    assert resolve_model("tiny:bfcl-v3") == plain, "an environment without domain text gets plain tiny"
    with pytest.raises(FileNotFoundError, match="unknown environment 'nowhere'"):
        resolve_model("tiny:nowhere")

    block = render_tools(agentdojo.tool_docs("travel"), "compact")
    lengths = {p: len(AutoTokenizer.from_pretrained(p)(block).input_ids) for p in (plain, dojo)}
    assert lengths[dojo] < 0.6 * lengths[plain], lengths
