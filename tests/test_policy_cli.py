"""Tests of ``coevolve serve`` (a real process on loopback) and ``coevolve bench rollout``."""

from __future__ import annotations


import httpx
from typer.testing import CliRunner

from coevolve.registry import register
from serve_helpers import served_tiny_model
from test_rollout import CounterEnv  # tests/ is on sys.path (pytest rootdir-relative import)

register("environment", "test-counter")(CounterEnv)


def test_bench_rollout_prints_both_modes_side_by_side():
    from coevolve.cli import app

    res = CliRunner().invoke(
        app,
        [
            "bench",
            "rollout",
            "--env",
            "test-counter",
            "--category",
            "any",
            "--episodes",
            "4",
            "--samples",
            "2",
            "--batch-size",
            "4",
            "--max-new-tokens",
            "4",
            "--step-limit",
            "2",
            "--threads",
            "0",
            "--limit-tokens",
            "6",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "batched (4)" in res.output and "one at a time" in res.output and "1.00x" in res.output
    assert "same seed, same rollouts (batched run repeated): yes" in res.output
    # the same prompts through plain transformers generate() and against the bandwidth bound
    assert "generation limits: 4 prompts" in res.output and "6 new tokens each" in res.output
    for label in ("coevolve engine", "without lean step", "transformers generate()", "bandwidth bound"):
        assert label in res.output, res.output
    bad = CliRunner().invoke(app, ["bench", "rollout", "--episodes", "5", "--samples", "2"])
    assert bad.exit_code != 0 and "multiple" in bad.output


def test_serve_command_answers_on_loopback():
    with served_tiny_model(timeout_s=60) as url:
        r = httpx.post(
            f"{url}/chat/completions",
            timeout=30,
            json={"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3


def test_generation_limits_count_the_same_tokens_for_engine_and_generate():
    import torch

    from coevolve.bench.limits import kv_bytes_per_token, limits, weight_bytes
    from coevolve.config import PolicyConfig
    from coevolve.policy import load_policy

    policy = load_policy(PolicyConfig(model="tiny"))
    prompts = [list(range(5, 40)), list(range(7, 20)), list(range(3, 60))]
    out = limits(policy, prompts, new_tokens=5, echo=lambda _: None)
    assert out["engine"]["decode_tokens"] == 3 * 5 and out["generate"]["decode_tokens"] == 3 * 4
    # the same engine without the lean decoding step, measured in the same run
    assert out["engine_forward"]["decode_tokens"] == 3 * 5 and policy.fast_step is not None
    # and with prompt-lookup drafts off: every token from a step of its own
    one = out["engine_one_token_per_step"]
    assert one["decode_tokens"] == 3 * 5 and one["steps"] == 5 and policy.cfg.draft_tokens == 4
    assert out["engine"]["prefill_tokens"] == out["generate"]["prefill_tokens"] == sum(map(len, prompts))
    assert out["bound"]["decode_tok_s"] > 0 and out["bound"]["bandwidth_gb_s"] > 0
    assert out["decode_vs_generate"] > 0 and 0 < out["decode_vs_bound"]
    # a tied matrix is read once per step
    tied = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight
    assert weight_bytes(tied) == 10 * 4 * 4
    cfg = policy.model.config
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    assert kv_bytes_per_token(policy.model, torch.float32) == per_token
