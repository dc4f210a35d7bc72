"""How far generation is from its references: plain ``transformers`` ``generate()`` and the
machine's memory-bandwidth bound, on the same prompts and token budgets, in one process.

    figures = limits(policy, prompts, new_tokens=64, echo=print)

Three measurements on ``prompts`` (a batch of real rollout prompts, token ids), each after a
warm-up:

- **the engine**: ``LocalPolicy.generate`` (continuous batching over ``coevolve.policy.decoder``)
  from a cold prefix cache, every row generating exactly ``new_tokens`` (stop tokens ignored);
  prefill and decode seconds from its ``DecodeStats``; where the lean decoding step
  (``coevolve.policy.fast_step``) covers the model, again with every step through the model's
  own ``forward`` ("without lean step"), so the step's gain is measured in the same run, and
  with prompt-lookup drafts off ("one token per step"): the bound below is for one token per
  row and step, which verified drafts can pass;
- **generate()**: ``transformers``' ``generate`` on the same model weights (the engine's
  generation copy: same dtype, adapters merged) with sdpa attention and its own KV cache, the
  batch left-padded, sampling, ``min_new_tokens = max_new_tokens = new_tokens``; prefill is a
  ``max_new_tokens=1`` call, decode is the rest of the full call;
- **the bound**: a decoding step must read every weight once and each row's KV cache; the
  bandwidth a large tensor copy reaches here (read + write, best of 5) over those bytes is the
  most tokens/s the batch can decode.
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, cast

import torch


def copy_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s a tensor copy reaches (bytes read + bytes written over the best of ``repeats``)."""
    n = megabytes * 2**20 // 4
    src, dst = torch.ones(n), torch.empty(n)
    dst.copy_(src)  # touch the pages
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * n * 4 / best


def matmul_flops(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s a square matrix product of side ``n`` in ``dtype`` reaches here (2 n^3 over the
    best of ``repeats``, torch's current threads): what a compute-bound pass such as the
    trainer's update can do per second at most, in practice."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # warm-up: kernel selection, packing buffers
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def linear_params(model_name_or_config: Any) -> int:
    """Weights of a decoder's per-token projections (attention q, k, v, o and the MLP's gate,
    up and down, every layer; not the embedding nor the output head), from its config: a
    token costs 2 FLOPs per weight forward and as many again for its gradient backward."""
    cfg = _text_config(model_name_or_config)
    d, head_dim = cfg.hidden_size, _head_dim(cfg)
    q = cfg.num_attention_heads * head_dim
    kv = (getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads) * head_dim
    return cfg.num_hidden_layers * (2 * d * q + 2 * d * kv + 3 * d * cfg.intermediate_size)


def attention_width(model_name_or_config: Any) -> int:
    """Query width summed over a decoder's layers (layers x heads x head dimension), from its
    config: each key a token attends to costs it 4 FLOPs per unit of width forward (2 for its
    score, 2 for weighing its value), and 8 more backward (the gradients of the scores, the
    values, the query and the key)."""
    cfg = _text_config(model_name_or_config)
    return cfg.num_hidden_layers * cfg.num_attention_heads * _head_dim(cfg)


def head_params(model_name_or_config: Any) -> int:
    """Weights of a decoder's output head (vocabulary x hidden), from its config: each token
    whose next-token distribution is computed costs 2 FLOPs per weight."""
    cfg = _text_config(model_name_or_config)
    return cfg.vocab_size * cfg.hidden_size


def _head_dim(cfg: Any) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _text_config(model_name_or_config: Any) -> Any:
    cfg = model_name_or_config
    if isinstance(cfg, str):
        from transformers import AutoConfig

        from coevolve.policy.models import resolve_model

        cfg = AutoConfig.from_pretrained(resolve_model(cfg))
    return cfg.get_text_config(decoder=True)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters, a tied matrix counted once."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()
    return sum(seen.values())


def kv_bytes_per_token(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """KV cache bytes one token of context holds (every layer, keys and values)."""
    cfg = cast(Any, model).config.get_text_config(decoder=True)
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * heads * _head_dim(cfg) * torch.empty(0, dtype=dtype).element_size()


def _engine(policy: Any, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    from coevolve.policy.base import SamplingParams
    from coevolve.policy.decoder import DecodeStats

    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    stop_ids = policy.stop_ids
    policy.stop_ids = set()  # every row generates exactly new_tokens, as generate() is told to
    try:
        policy.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=4), [0, 1])  # warm-up
        policy.prefix_cache.clear()
        stats = policy.stats = DecodeStats()
        out = policy.generate(prompts, sampling, list(range(len(prompts))))
    finally:
        policy.stop_ids = stop_ids
        policy.prefix_cache.clear()
    assert all(len(ids) == new_tokens for ids, _ in out), "the engine stopped early"
    return {
        "prefill_s": stats.prefill_s,
        "decode_s": stats.decode_s,
        "prefill_tokens": stats.prefill_tokens,
        "decode_tokens": stats.row_steps + stats.accepted,  # a kept draft is a token without a step
        "steps": stats.steps,
    }


def _engine_one_token_per_step(policy: Any, prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """``_engine`` with prompt-lookup drafts off (``policy.draft_tokens`` 0)."""
    drafts = policy.cfg.draft_tokens
    policy.cfg.draft_tokens = 0
    try:
        return _engine(policy, prompts, new_tokens)
    finally:
        policy.cfg.draft_tokens = drafts


def _generate(model: torch.nn.Module, prompts: list[list[int]], new_tokens: int, pad_id: int) -> dict[str, float]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def run(n: int) -> float:
        t = time.perf_counter()
        out = cast(Any, model).generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            pad_token_id=pad_id,
        )
        assert out.shape[1] == width + n, "generate() stopped early"
        return time.perf_counter() - t

    with torch.inference_mode():
        run(2)  # warm-up
        prefill = run(1)
        full = run(new_tokens)
    return {
        "prefill_s": prefill,
        "decode_s": max(full - prefill, 1e-9),
        "prefill_tokens": sum(len(p) for p in prompts),
        "decode_tokens": len(prompts) * (new_tokens - 1),
    }


def limits(
    policy: Any, prompts: list[list[int]], *, new_tokens: int = 64, echo: Callable[[str], Any] = print
) -> dict[str, Any]:
    """Measure and print the engine, ``generate()`` and the bandwidth bound on ``prompts``.

    Returns ``{"engine": {...}, "generate": {...}, "bound": {...}}``, each with ``prefill_tok_s``
    and ``decode_tok_s`` (the bound: decode only), and the ratios ``decode_vs_generate``,
    ``decode_vs_bound``, ``prefill_vs_generate``."""
    if not prompts or new_tokens < 2:
        raise ValueError("limits: needs prompts and new_tokens >= 2")
    engine = _engine(policy, prompts, new_tokens)
    single = None
    if getattr(policy, "fast_step", None) is not None and getattr(policy.cfg, "draft_tokens", 0) > 0:
        single = _engine_one_token_per_step(policy, prompts, new_tokens)
    forward = None
    if getattr(policy, "fast_step", None) is not None:  # the same engine stepping through the model's forward
        policy.fast_decode, policy._runner = False, None
        try:
            forward = _engine(policy, prompts, new_tokens)
        finally:
            policy.fast_decode, policy._runner = True, None
    reference = copy.deepcopy(policy.runner)
    reference.set_attn_implementation("sdpa")
    reference.generation_config.eos_token_id = None  # no stop token: exactly new_tokens, as the engine
    gen = _generate(reference, prompts, new_tokens, policy.pad_id)
    del reference

    bandwidth = copy_bandwidth()
    batch = len(prompts)
    context = sum(len(p) for p in prompts) / batch + new_tokens / 2  # mean context over the decode
    step_bytes = weight_bytes(policy.runner) + batch * context * kv_bytes_per_token(policy.runner, policy.dtype)
    bound = batch * bandwidth / step_bytes

    def rates(m: dict[str, float]) -> dict[str, float]:
        return {
            **m,
            "prefill_tok_s": m["prefill_tokens"] / m["prefill_s"] if m["prefill_s"] else 0.0,
            "decode_tok_s": m["decode_tokens"] / m["decode_s"],
        }

    out: dict[str, Any] = {
        "engine": rates(engine),
        "generate": rates(gen),
        "bound": {"decode_tok_s": bound, "bandwidth_gb_s": bandwidth / 1e9, "step_mb": step_bytes / 1e6},
    }
    if single is not None:
        out["engine_one_token_per_step"] = rates(single)
    if forward is not None:
        out["engine_forward"] = rates(forward)
    e, g = out["engine"], out["generate"]
    out["decode_vs_generate"] = e["decode_tok_s"] / g["decode_tok_s"]
    out["decode_vs_bound"] = e["decode_tok_s"] / bound
    out["prefill_vs_generate"] = e["prefill_tok_s"] / g["prefill_tok_s"] if g["prefill_tok_s"] else 0.0

    echo(
        f"generation limits: {batch} prompts (mean {sum(len(p) for p in prompts) / batch:.0f} tokens), "
        f"{new_tokens} new tokens each, {str(policy.dtype).removeprefix('torch.')}, "
        f"CPU {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads"
    )
    echo(f"{'':<24}{'prefill tok/s':>14}{'decode tok/s':>14}{'vs generate()':>15}{'vs bound':>10}")
    rows = [("coevolve engine", e)]
    if single is not None:
        rows.append(("  one token per step", out["engine_one_token_per_step"]))
    if forward is not None:
        rows.append(("  without lean step", out["engine_forward"]))
    for label, m in (*rows, ("transformers generate()", g)):
        echo(
            f"{label:<24}{m['prefill_tok_s']:>14.0f}{m['decode_tok_s']:>14.1f}"
            f"{m['decode_tok_s'] / g['decode_tok_s']:>14.2f}x{m['decode_tok_s'] / bound:>9.0%}"
        )
    echo(
        f"{'bandwidth bound':<24}{'-':>14}{bound:>14.1f}{bound / g['decode_tok_s']:>14.2f}x{1:>9.0%}"
        f"   ({bandwidth / 1e9:.1f} GB/s copy; {step_bytes / 1e6:.0f} MB read per decoding step: "
        f"weights + the batch's KV cache)"
    )
    if single is not None:
        echo(
            f"drafts: {e['decode_tokens'] / e['steps'] / batch:.2f} tokens per row and step "
            f"(prompt lookup, policy.draft_tokens={policy.cfg.draft_tokens}); the bound is one token per step"
        )
    return out
