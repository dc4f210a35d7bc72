"""Tests of the lean decoding step (``coevolve.policy.fast_step``): the engine's greedy tokens
are those of plain transformers ``generate()`` on the same prompts, the step gives the model's
own logits, and models it does not cover keep their forward."""

from __future__ import annotations

import copy

import pytest
import torch

from coevolve.config import PolicyConfig
from coevolve.policy.base import SamplingParams
from coevolve.policy.fast_step import FastStep
from coevolve.policy.local import LocalPolicy


def _hf_greedy(model: torch.nn.Module, prompts: list[list[int]], n: int, pad: int) -> list[list[int]]:
    """``generate()``'s greedy tokens, one prompt at a time (no padding: its reference answer)."""
    out = []
    for p in prompts:
        with torch.inference_mode():
            ids = model.generate(
                input_ids=torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=pad,
            )
        out.append(ids[0, len(p) :].tolist())
    return out


def _greedy_matches_generate(policy: LocalPolicy, prompts: list[list[int]], n: int) -> None:
    assert policy.fast_step is not None, "the model is covered"
    reference = copy.deepcopy(policy.runner)
    reference.set_attn_implementation("sdpa")
    reference.generation_config.eos_token_id = None
    reference.generation_config.temperature = reference.generation_config.top_p = None
    expected = _hf_greedy(reference, prompts, n, policy.pad_id)
    policy.stop_ids, stops = set(), policy.stop_ids
    try:
        policy.prefix_cache.clear()
        got = policy.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=n), list(range(len(prompts))))
    finally:
        policy.stop_ids = stops
    assert [ids for ids, _ in got] == expected


def test_greedy_tokens_match_transformers_generate_on_the_tiny_model(one_thread):
    """Batched (left-padded, rows of different lengths) through the lean step: the same greedy
    tokens as ``generate()`` on each prompt alone, in float32 and in bfloat16."""
    for dtype in ("float32", "bfloat16"):
        policy = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024, dtype=dtype))
        g = torch.Generator().manual_seed(0)
        prompts = [
            torch.randint(3, policy.model.config.vocab_size, (n,), generator=g).tolist() for n in (40, 9, 73, 25)
        ]
        _greedy_matches_generate(policy, prompts, 24)


def test_the_step_gives_the_models_own_logits(one_thread):
    """The same logits, with the step on and off, for every step of a batched generation."""
    prompts = [list(range(40, 40 + n)) for n in (30, 7, 19)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    fast = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024))
    slow = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024), fast_decode=False)
    assert fast.fast_step is not None and slow.fast_step is None
    outs = [p.generate(prompts, sampling, [1, 2, 3]) for p in (fast, slow)]
    assert outs[0] == outs[1]
    assert fast.stats.steps == slow.stats.steps == 12


def test_the_generation_copy_shares_the_fused_weights():
    """In a half-precision copy the projections are views of the fused matrices: no extra memory,
    and the prefill (the model's forward) and the step read the same numbers."""
    policy = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024, dtype="bfloat16"))
    step, runner = policy.fast_step, policy.runner
    assert step is not None and runner is not policy.model
    att = runner.model.layers[0].self_attn
    fused = step.layers[0].qkv
    assert att.q_proj.weight.data_ptr() == fused.data_ptr()
    assert att.k_proj.weight.data_ptr() == fused[att.q_proj.weight.shape[0] :].data_ptr()


def test_models_it_does_not_cover_keep_their_forward():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    assert FastStep.build(gpt2) is None
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64)
    assert FastStep.build(LlamaForCausalLM(LlamaConfig(**small))) is not None
    scaled = LlamaConfig(**small, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    assert FastStep.build(LlamaForCausalLM(scaled)) is None, "rope scaling: the model's own forward"
    assert FastStep.build(LlamaForCausalLM(LlamaConfig(**small, mlp_bias=True))) is None


def test_half_precision_projections_are_prepacked_where_the_cpu_has_bf16(one_thread, monkeypatch):
    """In bfloat16 on a CPU with native bf16 the step multiplies by oneDNN-prepacked weights (and
    by the plain ones elsewhere); the packed step samples exactly what the plain one does."""
    from coevolve.policy import fast_step
    from coevolve.policy.local import cpu_has_native_bf16

    cfg = PolicyConfig(model="tiny", max_context_tokens=1024, dtype="bfloat16")
    prompts = [list(range(40, 40 + n)) for n in (30, 7, 19)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8)
    packed = LocalPolicy(cfg)
    step = packed.fast_step
    assert step is not None and step.packed == cpu_has_native_bf16()
    if step.packed:
        assert step.operands[0][0].is_mkldnn and step.lm_operand.is_mkldnn, "oneDNN-layout copies"
    monkeypatch.setattr(fast_step, "_packed_linear", lambda weight: False)
    plain = LocalPolicy(cfg)
    assert plain.fast_step is not None and not plain.fast_step.packed
    assert packed.generate(prompts, sampling, [1, 2, 3]) == plain.generate(prompts, sampling, [1, 2, 3])


def test_float32_projections_are_prepacked_and_give_the_same_numbers_up_to_rounding(one_thread, monkeypatch):
    """In float32 (what an AVX2 box generates in) the step multiplies by oneDNN-prepacked weights
    wherever the kernel is present: the same greedy tokens as the plain step, log-probs equal up
    to float32 rounding (oneDNN adds in another order than MKL)."""
    from coevolve.policy import fast_step

    cfg = PolicyConfig(model="tiny", max_context_tokens=1024, dtype="float32")
    prompts = [list(range(40, 40 + n)) for n in (30, 7, 19)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    packed = LocalPolicy(cfg)
    assert packed.fast_step is not None and packed.fast_step.packed == torch.backends.mkldnn.is_available()
    if packed.fast_step.packed:
        assert packed.fast_step.operands[0][2].is_mkldnn and packed.fast_step.lm_operand.is_mkldnn
    monkeypatch.setattr(fast_step, "_packed_linear", lambda weight: False)
    plain = LocalPolicy(cfg)
    assert plain.fast_step is not None and not plain.fast_step.packed
    assert packed.generate(prompts, greedy, [1, 2, 3]) == plain.generate(prompts, greedy, [1, 2, 3])
    with torch.inference_mode():
        (_, a), (_, b) = (p.fast_step.prefill([(ids, None) for ids in prompts]) for p in (packed, plain))
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_batched_prefill_gives_the_models_own_kv_and_logits(one_thread):
    """Prompts prefilled together (``FastStep.prefill`` through ``_prefill_many``: one with a
    cached prefix, two sharing an uncached one, a duplicate, one too short to cache) get the KV
    and next-token logits of the model's own forward on each prompt alone, and the shared prefix
    is computed once."""
    policy = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024))
    g = torch.Generator().manual_seed(1)
    vocab = policy.model.config.vocab_size

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    cached, shared = ids(50), ids(60)
    prompts = [cached + ids(20), shared + ids(15), shared + ids(30), ids(9), cached + ids(5)]
    prompts.append(prompts[1])
    policy._prefill_many([cached])
    computed_before = policy.stats.prefill_tokens
    got = policy._prefill_many(prompts)
    # new tokens only: 20 and 5 after the cached prefix, the shared 60 once, 15 + 30 after it, 9
    assert policy.stats.prefill_tokens - computed_before == 20 + 5 + 60 + 15 + 30 + 9
    for p, (kv, logits) in zip(prompts, got):
        with torch.inference_mode():
            out = policy.runner(input_ids=torch.tensor([p]), use_cache=True)
        torch.testing.assert_close(logits, out.logits[0, -1], rtol=1e-4, atol=1e-4)
        assert len(kv) == len(out.past_key_values.layers)
        for (k, v), layer in zip(kv, out.past_key_values.layers):
            torch.testing.assert_close(k, layer.keys, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(v, layer.values, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("counts", "dtype"),
    [((3, 1, 2), "float32"), ((1, 3, 1), "float32"), ((2, 1, 1), "float32"), ((1, 3, 1), "bfloat16")],
)
def test_a_step_where_some_rows_draft_projects_only_the_fed_tokens(one_thread, counts, dtype):
    """Rows feeding some of 3 columns in one step (``fed``): the projections, the MLP and the
    head see the fed tokens only, and each fed token's logits and new keys and values are those
    of the same step with every column computed, whether the drafting rows attend in one padded
    call (two of three rows draft) or on their own (one does)."""
    from coevolve.policy.kv_cache import growing_cache

    policy = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024, dtype=dtype))
    step = policy.fast_step
    g = torch.Generator().manual_seed(2)
    vocab = policy.model.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (12, 12, 12)]
    with torch.inference_mode():
        kv, _ = step.prefill([(p, None) for p in prompts])
    tokens = torch.randint(3, vocab, (3, 3), generator=g)
    positions = 12 + torch.arange(3)[None].expand(3, -1)
    fed = torch.arange(3)[None] < torch.tensor(counts)[:, None]
    causal = torch.arange(3)[None, :] <= torch.arange(3)[:, None]
    mask = torch.cat([torch.ones(3, 3, 12, dtype=torch.bool), causal[None] & fed[:, None, :]], dim=2)[:, None]

    def run(packed: bool):
        cache = growing_cache(
            [(torch.cat([k[li][0] for k in kv]), torch.cat([k[li][1] for k in kv])) for li in range(len(kv[0]))], 64
        )
        seen = []
        linear = step._linear
        step._linear = lambda x, w, b=None: (seen.append(x.shape[0]), linear(x, w, b))[1]
        try:
            with torch.inference_mode():
                logits = step(tokens, positions, cache.layers, mask, fed if packed else None)
        finally:
            step._linear = linear
        return logits, cache.layers, seen

    (full, full_cache, full_rows), (packed, packed_cache, packed_rows) = run(False), run(True)
    assert set(full_rows) == {9} and set(packed_rows) == {sum(counts)}, "every projection over the fed tokens only"
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(packed[fed], full[fed], **tol)
    assert torch.equal(packed[~fed], torch.zeros_like(packed[~fed])), "padding columns: zero logits"
    for a, b in zip(packed_cache, full_cache):
        torch.testing.assert_close(
            a.keys[:, :, 12:].transpose(1, 2)[fed], b.keys[:, :, 12:].transpose(1, 2)[fed], **tol
        )
        torch.testing.assert_close(
            a.values[:, :, 12:].transpose(1, 2)[fed], b.values[:, :, 12:].transpose(1, 2)[fed], **tol
        )
