"""The prefix cache of the local backend: KV of token sequences already computed, reused by
every prompt that starts with one of them.

The system message with the tool block is shared by all samples and steps of a task, and an
episode's next prompt extends its previous prompt and answer, so most of a prompt is usually
found here and only the new tokens are prefilled (``LocalPolicy._prefill``).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

# Prefixes shorter than this are not worth a cache entry.
_MIN_PREFIX = 16


class PrefixCache:
    """LRU store of per-layer (key, value) tensors [1, heads, len, dim] of token sequences, capped in tokens.

    A lookup reuses the longest common prefix with any stored sequence: in a causal model the
    KV of a position depends only on the tokens up to it, so a partial match is as good as a
    whole one (a re-tokenized previous answer that diverges late still saves its start). A
    prompt stored with its next-token logits needs no computation at all when asked again
    (the other samples of a GRPO group).
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor]]]] = (
            OrderedDict()
        )
        self._logits: dict[tuple[int, ...], torch.Tensor] = {}
        self._tokens = 0

    def exact(self, ids: list[int]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor] | None:
        """(kv, next-token logits) of exactly ``ids`` if it was stored with its logits."""
        key = tuple(ids)
        if key not in self._logits:
            return None
        self._entries.move_to_end(key)
        return self._entries[key][1], self._logits[key]

    def longest(self, ids: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """(n, kv): the KV of the longest cached prefix of ``ids``, at most ``len(ids) - 1`` tokens."""
        query = np.asarray(ids)
        best, best_key = 0, None
        for key, (arr, _) in self._entries.items():
            n = min(len(arr), len(query) - 1)
            if n <= best:
                continue
            diff = np.flatnonzero(arr[:n] != query[:n])
            common = int(diff[0]) if len(diff) else n
            if common > best:
                best, best_key = common, key
        if best_key is None or best < _MIN_PREFIX:
            return 0, None
        self._entries.move_to_end(best_key)
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in self._entries[best_key][1]]

    def put(
        self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]], logits: torch.Tensor | None = None
    ) -> None:
        key = tuple(ids)
        if len(key) < _MIN_PREFIX or len(key) > self.max_tokens or key in self._entries:
            return
        self._entries[key] = (np.asarray(ids), kv)
        if logits is not None:
            self._logits[key] = logits
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._logits.pop(old, None)
            self._tokens -= len(old)

    def clear(self) -> None:
        self._entries.clear()
        self._logits.clear()
        self._tokens = 0
