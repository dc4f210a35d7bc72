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


def common_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    """LRU store of per-layer (key, value) tensors [1, heads, len, dim] of token sequences, capped in tokens.

    A lookup reuses the longest common prefix with any stored sequence: in a causal model the
    KV of a position depends only on the tokens up to it, so a partial match is as good as a
    whole one (a re-tokenized previous answer that diverges late still saves its start). A
    prompt stored with its next-token logits needs no computation at all when asked again
    (the other samples of a GRPO group).

    A sequence that extends a stored one replaces it (its KV starts with the other's), keeping
    the other's logits: an episode's prompts and answers each extend the one before, so the
    cache holds one entry per live conversation instead of one per turn, and a batch of
    long conversations does not push out the very prefixes their next prompts need.
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor]]]] = (
            OrderedDict()
        )
        # sequence -> (the entry holding its KV, its next-token logits)
        self._logits: dict[tuple[int, ...], tuple[tuple[int, ...], torch.Tensor]] = {}
        self._tokens = 0

    def exact(self, ids: list[int]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor] | None:
        """(kv, next-token logits) of exactly ``ids`` if it was stored with its logits."""
        found = self._logits.get(tuple(ids))
        if found is None:
            return None
        owner, logits = found
        self._entries.move_to_end(owner)
        kv = self._entries[owner][1]
        n = len(ids)
        return (kv if len(owner) == n else [(k[:, :, :n], v[:, :, :n]) for k, v in kv]), logits

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
        if len(key) < _MIN_PREFIX or len(key) > self.max_tokens:
            return
        if key not in self._entries:
            for old in [old for old in self._entries if len(old) < len(key) and key[: len(old)] == old]:
                self._drop(old, heir=key)
            self._entries[key] = (np.asarray(ids), kv)
            self._tokens += len(key)
        if logits is not None and key not in self._logits:
            self._logits[key] = (key, logits)
        while self._tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[int, ...], heir: tuple[int, ...] | None = None) -> None:
        """Remove entry ``key``; the logits it held move to ``heir`` (an entry extending it) or go."""
        del self._entries[key]
        self._tokens -= len(key)
        for seq, (owner, logits) in list(self._logits.items()):
            if owner == key:
                if heir is None:
                    del self._logits[seq]
                else:
                    self._logits[seq] = (heir, logits)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._logits.clear()
        self._tokens = 0
