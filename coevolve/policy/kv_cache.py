"""The KV cache the local backend decodes in, and the attention that reads it.

- ``growing_cache``: a transformers ``DynamicCache`` whose layers append in place into
  preallocated buffers (``_GrowingLayer``) instead of re-concatenating the whole cache at every
  step, and let rows join (``add_rows``) and leave (``move_rows``, ``fill_holes``) a running
  batch by copying those rows' own columns, never the whole cache;
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


def _buffer(like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialized KV buffer (tests fill it with NaN to prove nothing unwritten is read)."""
    return like.new_empty(shape)


class _GrowingLayer(DynamicLayer):
    """A KV cache layer over preallocated row and column buffers, so that a decoding batch
    copies only what changes.

    transformers' ``DynamicLayer`` re-concatenates the whole cache at every decoding step, which
    costs O(context) memory traffic per generated token and per row; and a batch whose rows come
    and go (``coevolve.policy.decoder``) would copy the whole cache each time one did. Here:

    - the buffers are ``[row capacity, heads, column capacity, dim]``; the cache is the view of
      the first ``rows`` rows and the columns ``[start, end)`` (every row's columns end at
      ``end``; a shorter row's leading columns hold stale values its attention mask hides);
    - a step writes only its new columns (``update``);
    - a row that joins is written into the next free row (``add_rows``), and a row that
      leaves is overwritten by a later one (``move_rows``): each copies one row's columns;
    - leading columns no row needs any more are dropped by moving ``start`` (``trim``).

    Every value inside the view is finite (written, or zeroed when it comes into view without
    being written), so a masked column contributes exactly nothing; the buffers themselves are
    allocated uninitialized. Running out of columns, or a row joining that is longer than
    the room left of the cache's end, moves the live columns into new buffers with room to
    spare on both sides (``_margin`` on the left); running out of rows doubles them: all rare.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        b, h, n, d = keys.shape
        self._k = _buffer(keys, (b, h, max(capacity, n), d))
        self._v = _buffer(values, (b, h, max(capacity, n), d))
        self._k[:, :, :n], self._v[:, :, :n] = keys, values
        self._rows, self._start, self._n = b, 0, n
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._views()

    def _views(self) -> None:
        self.keys = self._k[: self._rows, :, self._start : self._n]
        self.values = self._v[: self._rows, :, self._start : self._n]

    def _resize(self, rows: int, columns: int, shift: int = 0) -> None:
        """New buffers of ``rows`` x ``columns`` holding the live view from column ``shift``."""
        width = self._n - self._start
        shape = (rows, self._k.shape[1], columns, self._k.shape[3])
        k, v = _buffer(self._k, shape), _buffer(self._v, shape)
        live = (slice(None, self._rows), slice(None), slice(self._start, self._n))
        k[: self._rows, :, shift : shift + width], v[: self._rows, :, shift : shift + width] = (
            self._k[live],
            self._v[live],
        )
        self._k, self._v = k, v
        self._start, self._n = shift, shift + width
        self._views()

    def reserve(self, new: int) -> None:
        """Make room for ``new`` more columns at the end: the live columns move towards the
        front (keeping a left margin, ``_margin``), or the buffers double when that is not room
        enough."""
        if self._n + new <= self._k.shape[2]:
            return
        width = self._n - self._start
        left = _margin(width)
        self._resize(self._k.shape[0], max(self._k.shape[2], 2 * (left + width + new)), left)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        new = key_states.shape[-2]
        self.reserve(new)
        self._k[: self._rows, :, self._n : self._n + new] = key_states
        self._v[: self._rows, :, self._n : self._n + new] = value_states
        self._n += new
        self._views()
        return self.keys, self.values

    def add_rows(self, rows: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Append rows (``(keys, values)`` [1, heads, length, dim] each), their columns ending at
        the cache's end; the view widens to the longest of them if needed."""
        longest = max(k.shape[2] for k, _ in rows)
        total = self._rows + len(rows)
        if total > self._k.shape[0] or longest > self._n:  # rare: no free row, or no room on the left
            width = self._n - self._start
            # where the live columns go: far enough right for this row, with a margin for the
            # longer ones to come (an episode's next prompt extends its last)
            shift = self._start if longest <= self._n else longest - width + _margin(longest)
            self._resize(
                max(self._k.shape[0], max(8, 2 * total) if total > self._k.shape[0] else 0),
                max(self._k.shape[2], 2 * (shift + width)),
                shift,
            )
        start = min(self._start, self._n - longest)
        for buf in (self._k, self._v):  # what comes into view without being written: zeros
            buf[: self._rows, :, start : self._start] = 0
            for i, (k, _) in enumerate(rows):
                buf[self._rows + i, :, start : self._n - k.shape[2]] = 0
        for i, (k, v) in enumerate(rows):
            self._k[self._rows + i, :, self._n - k.shape[2] : self._n] = k[0]
            self._v[self._rows + i, :, self._n - v.shape[2] : self._n] = v[0]
        self._rows, self._start = total, start
        self._views()

    def move_rows(self, moves: list[tuple[int, int]], rows: int) -> None:
        """Copy row ``src`` over row ``dst`` for each ``(src, dst)`` (the live columns only),
        then keep the first ``rows`` rows."""
        for src, dst in moves:
            self._k[dst, :, self._start : self._n] = self._k[src, :, self._start : self._n]
            self._v[dst, :, self._start : self._n] = self._v[src, :, self._start : self._n]
        self._rows = rows
        self._views()

    def trim(self, columns: int) -> None:
        """Drop the first ``columns`` live columns (no row needs them any more)."""
        self._start += columns
        self._views()


def _margin(width: int) -> int:
    """Spare columns kept left of the live ones when the buffers are reallocated: rows longer
    than the batch's width join without another reallocation (a tool-calling episode's prompts
    grow turn by turn; without it, evaluation copied the whole cache about 30 times)."""
    return width // 2


def fill_holes(n: int, leaving: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """How ``n`` rows shrink to the ``n - len(leaving)`` that stay, moving as few as possible:
    each leaving row among the first ``n - len(leaving)`` is overwritten by a staying row from
    the end. Returns ``(moves, order)``: the ``(src, dst)`` copies and, for each row after
    them, the index it had before."""
    gone = set(leaving)
    size = n - len(gone)
    tail = [i for i in range(n - 1, size - 1, -1) if i not in gone]  # staying rows past the end
    order = list(range(size))
    moves = []
    for hole in sorted(i for i in gone if i < size):
        src = tail.pop()
        moves.append((src, hole))
        order[hole] = src
    return moves, order


def growing_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], capacity: int) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [_GrowingLayer(k, v, capacity) for k, v in layers]
    return cache
