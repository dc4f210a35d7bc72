"""Token-level continuous batching for the local backend (``Decoder``) and its sampler.

Rows join the running batch at the next step (prefilled alone, from the prefix cache) and
leave it the moment their answer ends; all rows decode together, left-padded, in one growing
KV cache (``coevolve.policy.kv_cache``). Every row draws from its own random generator, and
``sample_next`` returns each sampled token's behaviour log-probability with it (what the
trainer optimizes: ``coevolve.policy.base.Generation``).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache

from coevolve.policy.base import SamplingParams
from coevolve.policy.kv_cache import fill_holes, growing_cache

if TYPE_CHECKING:
    from coevolve.policy.local import LocalPolicy


def sample_next(
    logits: torch.Tensor, sampling: SamplingParams, generators: list[torch.Generator]
) -> tuple[list[int], list[float]]:
    """One next token per row of ``logits`` [B, V] and its behaviour log-probability.

    Greedy at temperature 0, else temperature + top-p. Sampling inverts each row's CDF at one
    uniform draw from the row's own generator: exact, and one cheap draw per row instead of a
    ``multinomial`` call per row. The log-probability is that of the temperature-scaled
    distribution, ``log_softmax(logits / temperature)`` in float32 (``log_softmax(logits)`` at
    temperature 0), before top-p truncation: what a trainer recomputes from the same logits.
    """
    scaled = logits.float() / sampling.temperature if sampling.temperature > 0 else logits.float()
    logp = torch.log_softmax(scaled, dim=-1)
    if sampling.temperature <= 0:
        tokens = logits.argmax(dim=-1)
    else:
        probs = logp.exp()
        if sampling.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest set whose mass reaches top_p (the first token always stays).
            outside = sorted_p.cumsum(dim=-1) - sorted_p > sampling.top_p
            sorted_p = sorted_p.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        cdf = probs.cumsum(dim=-1)
        u = torch.cat([torch.rand(1, generator=g) for g in generators]).to(cdf.device)[:, None] * cdf[:, -1:]
        # searchsorted finds the first index whose CDF exceeds u; zero-probability tokens never qualify.
        tokens = torch.searchsorted(cdf, u, right=True).clamp_max(cdf.shape[-1] - 1).squeeze(1)
    picked = logp.gather(-1, tokens[:, None]).squeeze(1)
    return tokens.tolist(), picked.tolist()


@dataclass
class DecodeStats:
    """Where a policy's generation time went (cumulative; ``coevolve bench rollout`` prints it)."""

    prefill_tokens: int = 0  # prompt tokens computed (not found in the prefix cache)
    prefill_s: float = 0.0
    steps: int = 0  # decoding steps (one token for every row in the batch)
    row_steps: int = 0  # sum of the batch size over steps
    decode_s: float = 0.0


@dataclass
class Row:
    key: Hashable
    prompt: list[int]
    generator: torch.Generator
    generated: list[int] = field(default_factory=list)  # sampled ids without the stop token
    logprobs: list[float] = field(default_factory=list)  # behaviour log-prob of each sampled id
    stop: int | None = None  # the stop token sampled last, if any


class Decoder:
    """Token-level continuous batching: rows join (prefilled) and leave (finished) between steps.

        decoder = Decoder(policy, sampling)
        decoder.add([(key, prompt_ids, seed), ...])
        while decoder:
            for key, ids, finish in decoder.step(): ...   # and add more rows whenever

    All rows share one left-padded KV cache whose columns end at the same place; a row that
    joins is prefilled alone (``LocalPolicy._prefill``: only what the prefix cache lacks) and
    padded in; a finished row is cut out, and the leading columns no row needs any more are
    dropped with it. So the batch stays full while requests come and go: with tool-calling
    episodes, a row that stops early is back with its next prompt after one environment step
    instead of idling until the batch's longest message ends.
    """

    def __init__(self, policy: "LocalPolicy", sampling: SamplingParams):
        self.policy, self.sampling = policy, sampling
        self.rows: list[Row] = []
        self.cache: DynamicCache | None = None
        self.lengths = torch.zeros(0, dtype=torch.long)  # tokens in each row's KV (prompt + fed answer)
        self.logits: torch.Tensor | None = None  # next-token logits of each row [B, V]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        return self.cache.layers[0].keys.shape[2] if self.cache is not None else 0

    @torch.inference_mode()
    def add(self, requests: list[tuple[Hashable, list[int], int]]) -> None:
        """Prefill ``(key, prompt ids, seed)`` rows and join them to the batch."""
        if not requests:
            return
        self.policy._check_weights()
        rows = [Row(key, list(ids), torch.Generator().manual_seed(seed)) for key, ids, seed in requests]
        t = time.perf_counter()
        prefills = self.policy._prefill_many([row.prompt for row in rows])
        self.policy.stats.prefill_s += time.perf_counter() - t
        lengths = [len(row.prompt) for row in rows]
        if self.cache is None:  # empty, with room for the first rows' answers
            capacity = 2 * (max(lengths) + self.sampling.max_new_tokens)
            self.cache = growing_cache([(k[:0, :, :0], v[:0, :, :0]) for k, v in prefills[0][0]], capacity)
        for li, layer in enumerate(self.cache.layers):  # each row's own KV into a free row
            layer.add_rows([kv[li] for kv, _ in prefills])
        self.lengths = torch.cat([self.lengths, torch.tensor(lengths)])
        new_logits = torch.stack([logits for _, logits in prefills])
        self.logits = new_logits if self.logits is None else torch.cat([self.logits, new_logits])
        self.rows += rows

    def step(self) -> list[tuple[Hashable, list[int], str]]:
        """Sample one token for every row and feed it; returns the rows that finished, as
        (key, generated ids without the stop token, "stop" | "length")."""
        return [(row.key, row.generated, finish) for row, finish in self.step_rows()]

    @torch.inference_mode()
    def step_rows(self) -> list[tuple[Row, str]]:
        """``step``, returning the finished rows themselves (their sampled ids, stop token and
        behaviour log-probs) with their finish reason."""
        if not self.rows:
            return []
        t = time.perf_counter()
        stats = self.policy.stats
        stats.steps += 1
        stats.row_steps += len(self.rows)
        tokens, logprobs = sample_next(self.logits, self.sampling, [row.generator for row in self.rows])
        finished, keep = [], []
        for j, (row, tok, lp) in enumerate(zip(self.rows, tokens, logprobs)):
            row.logprobs.append(lp)
            if tok in self.policy.stop_ids:
                row.stop = tok
                finished.append((j, "stop"))
                continue
            row.generated.append(tok)
            if len(row.generated) >= self.sampling.max_new_tokens:
                finished.append((j, "length"))
            else:
                keep.append(j)
        for j, _ in finished:
            self._remember(j)
        done = [(self.rows[j], finish) for j, finish in finished]
        if finished:
            keep = self._keep([j for j, _ in finished])
        if self.rows:
            self.logits = self._feed([tokens[j] for j in keep])
            self.lengths = self.lengths + 1
        stats.decode_s += time.perf_counter() - t
        return done

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        """Feed one token per row into the cache; the next-token logits [B, V]. Every row's
        new column is the cache's next one (left padding): the mask lets row j see its last
        ``lengths[j]`` columns and the new one."""
        column = self.width
        mask = torch.arange(column + 1)[None] >= (column - self.lengths)[:, None]
        dev = self.policy.device
        ids = torch.tensor(tokens, device=dev)
        fast = self.policy.fast_step
        if fast is not None:  # coevolve.policy.fast_step: the same arithmetic in fewer operations
            return fast(ids, self.lengths.to(dev), self.cache.layers, mask[:, None, None].to(dev))
        out = self.policy.runner(
            input_ids=ids[:, None],
            attention_mask=mask.long().to(dev),
            position_ids=self.lengths[:, None].to(dev),
            past_key_values=self.cache,
            use_cache=True,
        )
        return out.logits[:, -1]

    def _keep(self, leaving: list[int]) -> list[int]:
        """Take rows ``leaving`` out of the batch: later rows move into their places (one row's
        KV copied each; ``kv_cache.fill_holes``) and leading columns no row still uses are
        dropped. Returns the old index of each row now in the batch, in its new order."""
        moves, order = fill_holes(len(self.rows), leaving)
        self.rows = [self.rows[j] for j in order]
        if not order:
            self.cache, self.logits, self.lengths = None, None, torch.zeros(0, dtype=torch.long)
            return order
        idx = torch.tensor(order)
        self.lengths, self.logits = self.lengths[idx], self.logits[idx]
        trim = self.width - int(self.lengths.max())
        for layer in self.cache.layers:
            layer.move_rows(moves, len(order))
            layer.trim(trim)
        return order

    def _remember(self, j: int) -> None:
        """Cache the KV of row ``j``'s prompt and the answer tokens fed so far: an episode's
        next prompt extends exactly that (``LocalPolicy`` keeps the answer's ids)."""
        row, n = self.rows[j], int(self.lengths[j])
        fed = n - len(row.prompt)
        if fed > 0:
            kv = [(l.keys[j : j + 1, :, -n:].clone(), l.values[j : j + 1, :, -n:].clone()) for l in self.cache.layers]
            self.policy.prefix_cache.put(row.prompt + row.generated[:fed], kv)
