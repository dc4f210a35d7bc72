"""A lean decoding step for Llama-family models (Llama, Qwen2, Mistral): one token per row, in
plain torch operations over the decoder's preallocated KV cache.

    step = FastStep.build(runner)         # None for a model it does not cover (the decoder then
    logits = step(tokens, positions, keys, values, width, mask)   # calls the model's forward)

A decoding step of a small model on a CPU is bound by per-operation overhead, not by arithmetic:
transformers' ``forward`` spends most of a SmolLM2 step at batch 8 in Python (modules, kwargs,
cache objects, mask building: about 1,900 operator calls for 30 layers). This step does the same
computation in about 20 operations per layer:

- the query, key and value projections are one matmul, and the gate and up projections another
  (their weights concatenated once per set of weights; the generation copy's own projections are
  made views of those, so fusing adds no memory where the runner is a copy);
- the rotary embedding is computed once per step for all layers, and applied to queries and keys
  together;
- attention reads the grouped KV cache in place under one additive mask made once per step,
  ``scaled_dot_product_attention`` over the query heads folded by KV head (``_attend``);
- the new key and value columns are written straight into the cache buffers;
- where rows verify different numbers of drafts, the projections run over the tokens fed
  (packed), and when few rows draft only those attend with more than one query;
- on a CPU, the projection and output-head weights are reordered once into oneDNN's blocked
  layout (``torch.ops.mkldnn._reorder_linear_weight``): a small-batch matmul then streams its
  weights at close to the memory's bandwidth. In bfloat16 on a CPU with native bf16 (AVX512-BF16
  or AMX) that is about 1.7x faster than ``F.linear`` on the plain layout, with bit-identical
  results; in float32 (an AVX2 CPU's precision) 1.2-2.3x at batch 16 (the output head most),
  with the same numbers up to float32 rounding (oneDNN sums in another order than MKL). Either
  way a row's result does not depend on the other rows of the batch, which MKL's ``F.linear``
  does not promise. Checked when the step is built; a difference beyond rounding, bfloat16
  without native bf16, or a build without the kernel keeps ``F.linear``. The packed copies cost
  one more copy of the weights while the step lives (SmolLM2: 270 MB in bfloat16).

The arithmetic is transformers' own, operation for operation in the same dtype (RMSNorm in
float32, the rotary embedding in the model's dtype), so greedy tokens are the ones
``generate()`` picks (``tests/test_policy_fast_step.py``). Anything it does not cover (another
architecture, rope scaling, sliding windows, biases on the MLP, training mode) keeps the model's
own ``forward``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

# Model types whose decoder layer is: RMSNorm, attention (q/k/v/o projections, q/k/v biases
# allowed, rotary embedding, grouped KV heads), residual, RMSNorm, SiLU-gated MLP, residual.
_COVERED = {"llama", "qwen2", "mistral"}


@dataclass
class _Layer:
    ln1: torch.Tensor  # [D] input RMSNorm weight
    eps1: float
    qkv: torch.Tensor  # [(H + 2 KV) d, D] fused projection weight
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [D, H d]
    ln2: torch.Tensor
    eps2: float
    gate_up: torch.Tensor  # [2 I, D]
    down: torch.Tensor  # [D, I]


# The batch size oneDNN's weight reorder is tuned for; any batch is computed correctly.
_PACK_BATCH = 8


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_BATCH)


def _packed_mm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _packed_linear(sample: torch.Tensor) -> bool:
    """Whether oneDNN's prepacked linear can stand in for ``F.linear`` on weights like ``sample``
    [N, K]: bfloat16 or float32 on a CPU, the kernel present, and on a probe batch the same bits
    (bfloat16) or the same numbers up to float32 rounding (float32: oneDNN sums in another order
    than MKL's ``F.linear``)."""
    if sample.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if sample.dtype not in (torch.bfloat16, torch.float32):
        return False
    try:
        probe = torch.randn(3, sample.shape[1], generator=torch.Generator().manual_seed(0)).to(sample.dtype)
        got = _packed_mm(probe, _pack(sample))
    except (RuntimeError, AttributeError):  # bfloat16 without native bf16 (AVX2), or a build without the op
        return False
    want = F.linear(probe, sample)
    if sample.dtype == torch.bfloat16:
        return torch.equal(got, want)
    return bool(torch.allclose(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max())))


def _fuse(linears: list[torch.nn.Linear], share: bool) -> torch.Tensor:
    """The weights of ``linears`` stacked by output row; with ``share`` each linear's weight is
    replaced by a view of the stacked tensor (no extra memory, and it follows later in-place
    updates of the views)."""
    fused = torch.cat([lin.weight.detach() for lin in linears])
    if share:
        start = 0
        for lin in linears:
            n = lin.weight.shape[0]
            lin.weight = torch.nn.Parameter(fused[start : start + n], requires_grad=False)
            start += n
    return fused


class FastStep:
    """One decoding step of a covered causal LM; see the module docstring."""

    def __init__(self, model: Any, share: bool):
        cfg = model.config.get_text_config(decoder=True)
        inner = model.model
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.embed = inner.embed_tokens.weight
        self.norm, self.norm_eps = inner.norm.weight, inner.norm.variance_epsilon
        self.lm_head = model.lm_head.weight
        rotary = inner.rotary_emb
        self.inv_freq = rotary.inv_freq.float()
        self.rope_scaling = float(rotary.attention_scaling)
        self.layers = []
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            qkv = [att.q_proj, att.k_proj, att.v_proj]
            biases = [lin.bias for lin in qkv]
            self.layers.append(
                _Layer(
                    ln1=layer.input_layernorm.weight,
                    eps1=layer.input_layernorm.variance_epsilon,
                    qkv=_fuse(qkv, share),
                    qkv_bias=torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None,
                    o=att.o_proj.weight,
                    ln2=layer.post_attention_layernorm.weight,
                    eps2=layer.post_attention_layernorm.variance_epsilon,
                    gate_up=_fuse([mlp.gate_proj, mlp.up_proj], share),
                    down=mlp.down_proj.weight,
                )
            )
        self.scaling = float(inner.layers[0].self_attn.scaling)
        # The operands the step multiplies by: the weights above, or their prepacked copies.
        self.packed = bool(self.layers) and _packed_linear(self.layers[0].gate_up)
        pack = _pack if self.packed else (lambda w: w)
        self.operands = [(pack(la.qkv), pack(la.o), pack(la.gate_up), pack(la.down)) for la in self.layers]
        self.lm_operand = pack(self.lm_head)
        self._linear = _packed_mm if self.packed else F.linear

    @staticmethod
    def covers(model: Any) -> bool:
        """Whether ``model`` has exactly the shape this step computes (else: its own forward)."""
        cfg = model.config.get_text_config(decoder=True)
        inner = getattr(model, "model", None)
        if cfg.model_type not in _COVERED or inner is None or not hasattr(model, "lm_head"):
            return False
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", cfg.model_type == "mistral"):
            return False
        rope = getattr(cfg, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default" or getattr(cfg, "hidden_act", "silu") != "silu":
            return False
        if getattr(cfg, "mlp_bias", False) or getattr(cfg, "attention_bias", False) and cfg.model_type != "qwen2":
            return False
        layers = getattr(inner, "layers", [])
        return bool(layers) and all(
            lin.bias is None for layer in layers for lin in (layer.self_attn.o_proj, layer.mlp.down_proj)
        )

    @classmethod
    def build(cls, model: Any, share: bool = False) -> FastStep | None:
        """The step of ``model``, or None where it does not cover it (or cannot read its modules)."""
        try:
            return cls(model, share) if cls.covers(model) else None
        except AttributeError:  # a covered model_type with an unexpected module layout
            return None

    @staticmethod
    def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    def _mlp(self, x: torch.Tensor, layer: _Layer, gate_up_w: torch.Tensor, down_w: torch.Tensor) -> torch.Tensor:
        """The layer's SiLU-gated MLP on its post-attention norm of ``x`` (the residual is the caller's)."""
        gate, up = self._linear(self._rms(x, layer.ln2, layer.eps2), gate_up_w).chunk(2, dim=-1)
        return self._linear(F.silu(gate) * up, down_w)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [N, 1, d] of the rotary embedding at ``positions`` [N], in ``dtype``."""
        freqs = positions[:, None].float() * self.inv_freq[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.rope_scaling).to(dtype)[:, None], (emb.sin() * self.rope_scaling).to(dtype)[:, None]

    def _rotate(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.head_dim // 2
        return qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, additive: torch.Tensor
    ) -> torch.Tensor:
        """Attention of a decoding step's queries ``q`` [B, H, T, d] over the cache's ``keys`` and
        ``values`` [B, KV, L, d] under ``additive`` [B, 1, H/KV T | 1, L]; [B, KV, H/KV T, d] (the
        query heads that share a KV head folded into the query length, head group r, token i
        at r T + i).

        sdpa over the folded queries: on a real AVX2 CPU in float32 (SmolLM2, 30 layers, 1,000
        columns) 1.2-1.6x faster than two matmuls and a softmax (batch 16, one token: 58 vs 90
        ms; batch 8 with 4 drafts: 51 vs 80 ms), where sdpa with ``enable_gqa`` is the slow
        path. In half precision one query a head takes ``enable_gqa`` (grouped KV read in place,
        ~1.5x faster than folding on a CPU with native bf16); drafts stay folded (~2x faster
        than ``enable_gqa`` there)."""
        b, h, t, d = q.shape
        kv = keys.shape[1]
        folded = q.reshape(b, kv, h // kv * t, d)
        if t == 1 and q.dtype != torch.float32:
            return F.scaled_dot_product_attention(
                q, keys, values, attn_mask=additive, scale=self.scaling, enable_gqa=kv != h
            )  # [B, H, 1, d], the same memory as [B, KV, H/KV, d]
        return F.scaled_dot_product_attention(folded, keys, values, attn_mask=additive, scale=self.scaling)

    def _attend_drafting_rows(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, additive: torch.Tensor, counts: list[int]
    ) -> torch.Tensor:
        """``_attend`` for a step where only some rows verify drafts (``counts``: tokens each row
        fed): every row's first query in one call, then each drafting row's other queries over its
        own cache rows (a view, no copy), so the rows that feed one token do not attend with T
        padded queries each (at 1,500 columns, batch 12, 30 layers on an AVX2 CPU: 81 ms where
        one call padded to 5 queries takes 150). ``additive`` [B, 1, T, L], not folded. Returns
        [B, H, T, d], zeros at the padding queries."""
        b, h, t, d = q.shape
        rep = h // keys.shape[1]
        out = q.new_zeros(b, h, t, d)
        out[:, :, :1] = self._attend(q[:, :, :1], keys, values, additive[:, :, :1]).view(b, h, 1, d)
        for j, n in enumerate(counts):
            if n > 1:
                mask = additive[j : j + 1, :, 1:n]
                if n > 2:  # one mask row per folded query
                    mask = mask.repeat(1, 1, rep, 1)
                row = (slice(j, j + 1), slice(None), slice(1, n))
                out[row] = self._attend(q[row], keys[j : j + 1], values[j : j + 1], mask).view(1, h, n - 1, d)
        return out

    def prefill(
        self, chunks: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]] | None]]
    ) -> tuple[list[list[tuple[torch.Tensor, torch.Tensor]]], torch.Tensor]:
        """Several prompts' uncached tokens in one pass over the weights.

        ``chunks``: (new token ids, the KV of the cached prefix they follow: [1, KV, p, d] per
        layer, or None). The projections and the MLP run once over every chunk's tokens together
        (one read of each weight, where prefilling one prompt at a time reads them all once per
        prompt); attention runs per chunk, causal over its prefix and its own tokens. Returns each
        chunk's KV of prefix + new tokens per layer ([1, KV, p + n, d]) and the next-token logits
        after each chunk's last token [R, V].
        """
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        dev = self.embed.device
        lens = [len(ids) for ids, _ in chunks]
        starts = [prefix[0][0].shape[2] if prefix else 0 for _, prefix in chunks]
        ids = torch.tensor([t for c, _ in chunks for t in c], device=dev)
        positions = torch.cat([torch.arange(p, p + n) for p, n in zip(starts, lens)]).to(dev)
        x = F.embedding(ids, self.embed)  # [N, D]
        cos, sin = self._rope(positions, x.dtype)
        # causal over prefix + own tokens (True: attend); without a prefix, sdpa's own causal mask
        masks = [
            (torch.arange(p + n, device=dev)[None] <= (p + torch.arange(n, device=dev))[:, None]) if p else None
            for p, n in zip(starts, lens)
        ]
        out: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in chunks]
        linear = self._linear
        for li, (layer, (qkv_w, o_w, gate_up_w, down_w)) in enumerate(zip(self.layers, self.operands)):
            y = self._rms(x, layer.ln1, layer.eps1)
            qkv = linear(y, qkv_w, layer.qkv_bias).view(-1, h + 2 * kv, d)
            qk = self._rotate(qkv[:, : h + kv], cos, sin).transpose(0, 1)  # [H + KV, N, d]
            v = qkv[:, h + kv :].transpose(0, 1)  # [KV, N, d]
            atts, offset = [], 0
            for r, (n, (_, prefix)) in enumerate(zip(lens, chunks)):
                part = slice(offset, offset + n)
                keys, values = qk[None, h:, part], v[None, :, part]
                if prefix:
                    keys, values = torch.cat([prefix[li][0], keys], 2), torch.cat([prefix[li][1], values], 2)
                else:
                    keys, values = keys.contiguous(), values.contiguous()
                out[r].append((keys, values))
                att = F.scaled_dot_product_attention(
                    qk[None, :h, part],
                    keys,
                    values,
                    attn_mask=masks[r],
                    is_causal=masks[r] is None,
                    scale=self.scaling,
                    enable_gqa=kv != h,
                )  # [1, H, n, d]
                atts.append(att[0].transpose(0, 1).reshape(n, h * d))
                offset += n
            x = x + linear(torch.cat(atts), o_w)
            x = x + self._mlp(x, layer, gate_up_w, down_w)
        last = torch.tensor(lens, device=dev).cumsum(0) - 1
        x = self._rms(x[last], self.norm, self.norm_eps)
        return out, linear(x, self.lm_operand)

    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        caches: list[Any],
        mask: torch.Tensor,
        fed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, T, V] after each of ``tokens`` [B, T] at ``positions`` [B, T]: T is 1 for
        a plain decoding step, more where drafted tokens are verified (``decoder``).

        ``caches``: one ``kv_cache._GrowingLayer`` per layer, ``width`` columns wide; the new
        keys and values are appended to it (T columns), and attention reads its ``width + T``
        columns under ``mask`` [B, 1, T, width + T] (True: attend).

        ``fed`` [B, T] (True: a token the row fed; the others pad a row that drafted less than T):
        the projections, the MLP and the output head run over the fed tokens only, packed, so a
        step where one row verifies 4 drafts costs the projections of 5 + (B - 1) tokens, not
        5 B. Padding columns get keys and values of zeros (masked, never read) and logits of
        zeros (never read).
        """
        b, t = tokens.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        flat = tokens.reshape(-1)
        rows = None  # the flat [B T] index of each fed token, when some columns are padding
        counts: list[int] = []  # then: the tokens each row fed
        if fed is not None and t > 1 and not bool(fed.all()):
            rows = fed.reshape(-1).nonzero().squeeze(1).to(tokens.device)
            flat, counts = flat[rows], fed.sum(1).tolist()
        n = flat.shape[0]
        x = F.embedding(flat, self.embed)  # [N, D]
        cos, sin = self._rope(positions.reshape(-1) if rows is None else positions.reshape(-1)[rows], x.dtype)
        additive = torch.zeros(mask.shape, dtype=x.dtype, device=x.device).masked_fill_(~mask, float("-inf"))
        # Rows padded to T: when at most half the rows verify drafts, those alone attend with
        # their extra queries (``_attend_drafting_rows``); else one call over every row.
        split = bool(counts) and sum(n > 1 for n in counts) * 2 <= b
        if t > 1 and not split:  # one mask row per folded query: head group r, token i at r * T + i
            additive = additive.repeat(1, 1, h // kv, 1)
        linear = self._linear
        for layer, (qkv_w, o_w, gate_up_w, down_w), cache in zip(self.layers, self.operands, caches):
            y = self._rms(x, layer.ln1, layer.eps1)
            qkv = linear(y, qkv_w, layer.qkv_bias).view(n, h + 2 * kv, d)
            qkv[:, : h + kv] = self._rotate(qkv[:, : h + kv], cos, sin)
            if rows is not None:  # back to [B T, ...], zeros in the padding columns
                qkv = qkv.new_zeros(b * t, h + 2 * kv, d).index_copy_(0, rows, qkv)
            qkv = qkv.view(b, t, h + 2 * kv, d).transpose(1, 2)  # [B, H + 2 KV, T, d]
            keys, values = cache.update(qkv[:, h : h + kv], qkv[:, h + kv :])  # [B, KV, width + T, d]
            if split:
                att = self._attend_drafting_rows(qkv[:, :h], keys, values, additive, counts).transpose(1, 2)
            else:
                att = self._attend(qkv[:, :h], keys, values, additive).view(b, h, t, d).transpose(1, 2)
            att = att.reshape(b * t, h * d)
            x = x + linear(att if rows is None else att[rows], o_w)
            x = x + self._mlp(x, layer, gate_up_w, down_w)
        logits = linear(self._rms(x, self.norm, self.norm_eps), self.lm_operand)
        if rows is not None:
            logits = logits.new_zeros(b * t, logits.shape[-1]).index_copy_(0, rows, logits)
        return logits.view(b, t, -1)
