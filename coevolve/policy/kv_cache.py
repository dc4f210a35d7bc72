"""The KV cache the local backend decodes in, and the attention that reads it.

- ``growing_cache``: a transformers ``DynamicCache`` whose layers append in place into a
  preallocated buffer (``_GrowingLayer``) instead of re-concatenating the whole cache at every
  step, and can drop rows and leading columns (``keep``) when the decoder's batch shrinks;
- ``gqa_attention`` (registered with transformers as attention implementation ``coevolve_gqa``,
  which ``LocalPolicy`` selects over sdpa): decoding steps read grouped KV heads without
  copying them; prefill, training and dropout take transformers' sdpa path.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask


def gqa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Masked attention that reads grouped KV heads without copying them.

    transformers' sdpa path expands grouped KV heads to one per query head (a full copy of the
    cache, every layer, every step) whenever an attention mask is given, which is always the
    case for a padded batch. Here the query heads that share a KV head are folded into the
    query length instead: q [B, H, 1, d] -> [B, KV, H/KV, d]. Used for decoding steps only;
    prefill (sdpa's fused kernels are faster there), training and dropout take the sdpa path.
    """
    if torch.is_grad_enabled() or dropout or query.shape[2] > 1:  # sdpa's kernels win on prefill
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    b, h, q, d = query.shape
    kv = key.shape[1]
    rep = h // kv
    folded = query.reshape(b, kv, rep * q, d)
    if key.dtype == torch.float32 or key.device.type != "cpu":
        scores = torch.matmul(folded, key.transpose(-1, -2))
    else:  # CPU half precision: q @ K^T would first copy the cache view, K @ q^T reads it in place
        scores = torch.matmul(key, folded.transpose(-1, -2)).transpose(-1, -2)
    scores = scores * (scaling or d**-0.5)
    if attention_mask is not None:
        mask = attention_mask[:, :, :, : key.shape[2]].repeat(1, 1, rep, 1)  # [B|1, 1, rep*q, L]
        if mask.dtype == torch.bool:
            # A finite fill keeps fully masked rows (padding queries) finite instead of NaN.
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    out = torch.matmul(torch.softmax(scores, dim=-1), value)  # [B, KV, rep*q, d]
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


AttentionInterface.register("coevolve_gqa", gqa_attention)
AttentionMaskInterface.register("coevolve_gqa", sdpa_mask)


class _GrowingLayer(DynamicLayer):
    """A KV cache layer that appends into a preallocated buffer.

    transformers' ``DynamicLayer`` re-concatenates the whole cache at every decoding step,
    which costs O(context) memory traffic per generated token and per row: with small models
    and long tool prompts that copy, not the matmuls, dominates and cancels what batching
    gains. Here each step writes only its new columns; ``keys``/``values`` are views.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        b, h, n, d = keys.shape
        self._k = keys.new_empty((b, h, max(capacity, n), d))
        self._v = values.new_empty((b, h, max(capacity, n), d))
        self._k[:, :, :n], self._v[:, :, :n] = keys, values
        self._n = n
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._views()

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, : self._n], self._v[:, :, : self._n]

    def reserve(self, new: int) -> None:
        """Make room for ``new`` more columns: double when out of room (rare: the capacity
        covers the generation)."""
        if self._n + new > self._k.shape[2]:
            grow = max(new, self._k.shape[2])
            self._k = torch.cat([self._k, self._k.new_empty(self._k.shape[:2] + (grow, self._k.shape[3]))], dim=2)
            self._v = torch.cat([self._v, self._v.new_empty(self._v.shape[:2] + (grow, self._v.shape[3]))], dim=2)

    def advance(self, new: int) -> None:
        """Count ``new`` columns written straight into the buffers (``fast_step.FastStep``)."""
        self._n += new
        self._views()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        new = key_states.shape[-2]
        self.reserve(new)
        self._k[:, :, self._n : self._n + new] = key_states
        self._v[:, :, self._n : self._n + new] = value_states
        self._n += new
        self._views()
        return self.keys, self.values

    def keep(self, indices: torch.Tensor, trim: int = 0) -> None:
        """Keep the rows ``indices``, without the first ``trim`` columns."""
        self._k, self._v = self._k[indices][:, :, trim:], self._v[indices][:, :, trim:]
        self._n -= trim
        self._views()


def growing_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], capacity: int) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [_GrowingLayer(k, v, capacity) for k, v in layers]
    return cache
