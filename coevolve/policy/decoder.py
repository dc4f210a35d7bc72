"""Token-level continuous batching for the local backend (``Decoder``) and its sampler.

Rows join the running batch at the next step (prefilled together, from the prefix cache) and
leave it the moment their answer ends; all rows decode together, left-padded, in one growing
KV cache (``coevolve.policy.kv_cache``). Every row draws from its own random generator, and
``sample_next`` returns each sampled token's behaviour log-probability with it (what the
trainer optimizes: ``coevolve.policy.base.Generation``).

With the lean step (``fast_step``), a step also verifies tokens drafted by prompt lookup
(``draft``: what followed the latest earlier occurrence of the row's last tokens): the row
feeds its sampled token and its drafts, and keeps each draft with the probability the model
gives it, in order (``accept_drafts``: speculative sampling with a point-mass draft, so what
is emitted has exactly the model's distribution; greedy keeps the drafts the argmax agrees
with). A tool call copies names and values from its context, so one step often emits
several tokens. Rejected drafts leave masked columns in the KV cache (``Decoder.valid``).
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from transformers import DynamicCache

from coevolve.policy.base import SamplingParams
from coevolve.policy.kv_cache import fill_holes, growing_cache

if TYPE_CHECKING:
    from coevolve.policy.local import LocalPolicy


def _distribution(logits: torch.Tensor, sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs of the temperature-scaled distribution, sampling probabilities after top-p)
    of ``logits`` [..., V], both float32."""
    scaled = logits.float() / sampling.temperature if sampling.temperature > 0 else logits.float()
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    if sampling.temperature > 0 and sampling.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest set whose mass reaches top_p (the first token always stays).
        outside = sorted_p.cumsum(dim=-1) - sorted_p > sampling.top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return logp, probs


def sample_next(
    logits: torch.Tensor,
    sampling: SamplingParams,
    generators: list[torch.Generator],
    exclude: list[int | None] | None = None,
) -> tuple[list[int], list[float]]:
    """One next token per row of ``logits`` [B, V] and its behaviour log-probability.

    Greedy at temperature 0, else temperature + top-p. Sampling inverts each row's CDF at one
    uniform draw from the row's own generator: exact, and one cheap draw per row instead of a
    ``multinomial`` call per row. The log-probability is that of the temperature-scaled
    distribution, ``log_softmax(logits / temperature)`` in float32 (``log_softmax(logits)`` at
    temperature 0), before top-p truncation: what a trainer recomputes from the same logits.
    ``exclude``: per row, a token that must not be drawn (a draft just rejected there: what is
    drawn instead comes from the rest of the distribution, renormalized).
    """
    logp, probs = _distribution(logits, sampling)
    barred = [(j, tok) for j, tok in enumerate(exclude or []) if tok is not None]
    if sampling.temperature <= 0:
        scores = logits.float()
        for j, tok in barred:
            scores[j, tok] = float("-inf")
        tokens = scores.argmax(dim=-1)
    else:
        for j, tok in barred:
            if float(probs[j].sum() - probs[j, tok]) > 0:  # else it held all the mass: rejected by rounding only
                probs[j, tok] = 0.0
        cdf = probs.cumsum(dim=-1)
        u = torch.cat([torch.rand(1, generator=g) for g in generators]).to(cdf.device)[:, None] * cdf[:, -1:]
        # searchsorted finds the first index whose CDF exceeds u; zero-probability tokens never qualify.
        tokens = torch.searchsorted(cdf, u, right=True).clamp_max(cdf.shape[-1] - 1).squeeze(1)
    picked = logp.gather(-1, tokens[:, None]).squeeze(1)
    return tokens.tolist(), picked.tolist()


def accept_drafts(
    logits: torch.Tensor, drafts: list[list[int]], sampling: SamplingParams, generators: list[torch.Generator]
) -> list[tuple[int, list[float]]]:
    """How many of each row's ``drafts`` are kept, and their behaviour log-probabilities.

    ``logits`` [B, T, V]: position i of row j predicts the token after its i-th fed token (the
    sampled one, then the drafts). Draft i is kept with the probability the model gives it there
    (after temperature and top-p), one uniform draw from the row's generator each, stopping at
    the first rejection: speculative sampling with a draft distribution that is a point mass,
    whose accept-or-resample emits exactly the model's distribution (the resample, from the
    distribution without the rejected draft, is the next ``sample_next`` with ``exclude``).
    Greedy keeps the drafts equal to the argmax.
    """
    longest = max((len(d) for d in drafts), default=0)
    if longest == 0:
        return [(0, []) for _ in drafts]
    ids = torch.tensor([d + [0] * (longest - len(d)) for d in drafts], device=logits.device)  # [B, K]
    logp, probs = _distribution(logits[:, :longest], sampling)
    draft_logp = logp.gather(-1, ids[..., None]).squeeze(-1).tolist()
    if sampling.temperature <= 0:
        agree = (logits[:, :longest].argmax(dim=-1) == ids).tolist()
    else:
        chance = (probs.gather(-1, ids[..., None]).squeeze(-1) / probs.sum(dim=-1)).tolist()  # top-p renormalized
    out = []
    for j, draft in enumerate(drafts):
        kept = 0
        while kept < len(draft):
            if sampling.temperature <= 0:
                ok = agree[j][kept]
            else:
                ok = torch.rand(1, generator=generators[j]).item() < chance[j][kept]
            if not ok:
                break
            kept += 1
        out.append((kept, draft_logp[j][:kept]))
    return out


def draft(ids: list[int], k: int, ngram: int = 3) -> list[int]:
    """Prompt lookup: up to ``k`` tokens that followed the latest earlier occurrence of the last
    ``ngram`` tokens of ``ids`` (else of the last ``ngram - 1``, ..., 1)."""
    if k <= 0 or len(ids) < 2:
        return []
    seq = np.asarray(ids)
    for n in range(min(ngram, len(ids) - 1), 0, -1):
        # windows starting at 0 .. len - n - 1: every occurrence that has a token after it
        hit = np.ones(len(seq) - n, dtype=bool)
        for i in range(n):
            hit &= seq[i : len(seq) - n + i] == seq[len(seq) - n + i]
        found = np.flatnonzero(hit)
        if len(found):
            start = int(found[-1]) + n
            return seq[start : start + k].tolist()
    return []


# A row's drafts cost the step their projections (``fast_step`` packs the fed tokens) and their
# queries' attention over the row's cache (over every row's, padded, when most rows draft): a row
# that keeps fewer drafts than this (a running average over its steps that drafted) stops drafting
# for ``_DRAFT_PAUSE`` steps, then tries again. Per row, so that what a row samples never depends
# on the other rows of its batch; when no row drafts, the step feeds one token per row.
_DRAFT_MIN_GAIN = 0.3
_DRAFT_PAUSE = 8


@dataclass
class DecodeStats:
    """Where a policy's generation time went (cumulative; ``coevolve bench rollout`` prints it)."""

    prefill_tokens: int = 0  # prompt tokens computed (not found in the prefix cache)
    prefill_s: float = 0.0
    steps: int = 0  # decoding steps (one sampled token for every row in the batch, and its drafts)
    row_steps: int = 0  # sum of the batch size over steps
    drafted: int = 0  # drafted tokens verified
    accepted: int = 0  # drafted tokens kept (emitted without a step of their own)
    decode_s: float = 0.0


@dataclass
class Row:
    key: Hashable
    prompt: list[int]
    generator: torch.Generator
    generated: list[int] = field(default_factory=list)  # sampled ids without the stop token
    logprobs: list[float] = field(default_factory=list)  # behaviour log-prob of each sampled id
    stop: int | None = None  # the stop token sampled last, if any
    gain: float = 1.0  # drafts kept per step that drafted (running average)
    pause: int = 0  # steps left without drafts


class Decoder:
    """Token-level continuous batching: rows join (prefilled) and leave (finished) between steps.

        decoder = Decoder(policy, sampling)
        decoder.add([(key, prompt_ids, seed), ...])
        while decoder:
            for key, ids, finish in decoder.step(): ...   # and add more rows whenever

    All rows share one left-padded KV cache whose columns end at the same place; a row that
    joins is prefilled (``LocalPolicy._prefill_many``: only what the prefix cache lacks) and
    padded in; a finished row is cut out, and the leading columns no row needs any more are
    dropped with it. So the batch stays full while requests come and go: with tool-calling
    episodes, a row that stops early is back with its next prompt after one environment step
    instead of idling until the batch's longest message ends. ``valid`` [B, width] marks the
    columns each row attends to: its own (not the padding on its left, not drafts it rejected).
    """

    def __init__(self, policy: "LocalPolicy", sampling: SamplingParams):
        self.policy, self.sampling = policy, sampling
        self.rows: list[Row] = []
        self.cache: DynamicCache | None = None
        self.lengths = torch.zeros(0, dtype=torch.long)  # tokens in each row's KV (prompt + fed answer)
        self.valid = torch.zeros(0, 0, dtype=torch.bool)  # [B, width]: the columns each row attends to
        self.logits: torch.Tensor | None = None  # next-token logits of each row [B, V]
        self.exclude: list[int | None] = []  # per row: the draft just rejected (not to be drawn next)

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
        before = self.width
        for li, layer in enumerate(self.cache.layers):  # each row's own KV into a free row
            layer.add_rows([kv[li] for kv, _ in prefills])
        width = self.width
        columns = torch.arange(width)
        self.valid = torch.cat(
            [
                torch.cat([torch.zeros(len(self.rows), width - before, dtype=torch.bool), self.valid], dim=1),
                columns[None] >= width - torch.tensor(lengths)[:, None],
            ]
        )
        self.lengths = torch.cat([self.lengths, torch.tensor(lengths)])
        new_logits = torch.stack([logits for _, logits in prefills])
        self.logits = new_logits if self.logits is None else torch.cat([self.logits, new_logits])
        self.exclude += [None] * len(rows)
        self.rows += rows

    def step(self) -> list[tuple[Hashable, list[int], str]]:
        """Sample one token for every row (and keep the drafts verified with it) and feed it;
        returns the rows that finished, as (key, generated ids without the stop token,
        "stop" | "length")."""
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
        generators = [row.generator for row in self.rows]
        tokens, logprobs = sample_next(self.logits, self.sampling, generators, self.exclude)
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
            fed = [[tokens[j]] + self._draft(row) for j, row in zip(keep, self.rows)]
            self._verify(fed, self._feed(fed))
        stats.decode_s += time.perf_counter() - t
        return done

    def _verify(self, fed: list[list[int]], logits: torch.Tensor) -> None:
        """Keep what each row's drafts earned (``accept_drafts`` on ``logits`` [B, T, V], after
        feeding ``fed``: the sampled token, then the drafts): the kept drafts join the answer,
        the columns past them are masked for good, and the next token comes from the logits
        after the last kept one (without the rejected draft)."""
        stats = self.policy.stats
        drafts = [f[1:] for f in fed]
        verdicts = accept_drafts(logits[:, :-1], drafts, self.sampling, [row.generator for row in self.rows])
        for row, d, (n, logprobs) in zip(self.rows, drafts, verdicts):
            row.generated += d[:n]
            row.logprobs += logprobs
            stats.drafted += len(d)
            stats.accepted += n
            if d:
                row.gain = 0.7 * row.gain + 0.3 * n
                if row.gain < _DRAFT_MIN_GAIN:  # not paying: a pause, then one step's gain decides
                    row.pause, row.gain = _DRAFT_PAUSE, _DRAFT_MIN_GAIN
        self.exclude = [d[n] if n < len(d) else None for d, (n, _) in zip(drafts, verdicts)]
        kept = torch.tensor([n for n, _ in verdicts])
        t_fed = logits.shape[1]
        self.valid[:, self.width - t_fed :] &= torch.arange(t_fed)[None] <= kept[:, None]
        self.lengths = self.lengths + 1 + kept
        self.logits = logits[torch.arange(len(self.rows)), kept]

    def _draft(self, row: Row) -> list[int]:
        """Prompt-lookup drafts for ``row`` (none past its budget, none from a stop token on)."""
        room = min(self.policy.cfg.draft_tokens, self.sampling.max_new_tokens - len(row.generated) - 1)
        if room <= 0 or self.policy.fast_step is None:  # the model's own forward takes one token per row
            return []
        if row.pause:
            row.pause -= 1
            return []
        out = []
        for tok in draft(row.prompt + row.generated, room):
            if tok in self.policy.stop_ids:
                break
            out.append(tok)
        return out

    def _feed(self, fed: list[list[int]]) -> torch.Tensor:
        """Feed each row's tokens (its sampled one, then its drafts; T = the most any row feeds,
        shorter rows padded) into the cache's next T columns; the logits after each [B, T, V].
        Row j attends to its ``valid`` columns and, causally, to the new ones it fed."""
        t_fed = max(len(f) for f in fed)
        column = self.width
        n_fed = torch.tensor([len(f) for f in fed])
        new = torch.arange(t_fed)[None] < n_fed[:, None]  # [B, T]: the row fed this column
        self.valid = torch.cat([self.valid, new], dim=1)
        dev = self.policy.device
        ids = torch.tensor([f + [self.policy.pad_id] * (t_fed - len(f)) for f in fed], device=dev)
        positions = (self.lengths[:, None] + torch.arange(t_fed)[None]).to(dev)
        fast = self.policy.fast_step
        if fast is not None:  # coevolve.policy.fast_step: the same arithmetic in fewer operations
            causal = torch.arange(t_fed)[None, :] <= torch.arange(t_fed)[:, None]  # [T query, T key]
            mask = torch.cat(
                [self.valid[:, None, :column].expand(-1, t_fed, -1), causal[None] & new[:, None, :]], dim=2
            )
            return fast(ids, positions, self.cache.layers, mask[:, None].to(dev), new.to(dev))
        out = self.policy.runner(  # one token per row (no drafts without the lean step)
            input_ids=ids,
            attention_mask=self.valid.long().to(dev),
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        return out.logits

    def _keep(self, leaving: list[int]) -> list[int]:
        """Take rows ``leaving`` out of the batch: later rows move into their places (one row's
        KV copied each; ``kv_cache.fill_holes``) and leading columns no row still uses are
        dropped. Returns the old index of each row now in the batch, in its new order."""
        moves, order = fill_holes(len(self.rows), leaving)
        self.rows = [self.rows[j] for j in order]
        self.exclude = [self.exclude[j] for j in order]
        if not order:
            self.cache, self.logits, self.lengths = None, None, torch.zeros(0, dtype=torch.long)
            self.valid = torch.zeros(0, 0, dtype=torch.bool)
            return order
        idx = torch.tensor(order)
        self.lengths, self.logits, self.valid = self.lengths[idx], self.logits[idx], self.valid[idx]
        used = self.valid.any(dim=0)
        trim = int(used.int().argmax()) if bool(used.any()) else self.width
        self.valid = self.valid[:, trim:]
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
            cols = self.valid[j].nonzero().squeeze(1)
            if int(cols[0]) == self.width - n:  # contiguous (no rejected drafts among them): a slice
                kv = [
                    (l.keys[j : j + 1, :, -n:].clone(), l.values[j : j + 1, :, -n:].clone()) for l in self.cache.layers
                ]
            else:
                kv = [(l.keys[j : j + 1, :, cols], l.values[j : j + 1, :, cols]) for l in self.cache.layers]
            self.policy.prefix_cache.put(row.prompt + row.generated[:fed], kv)
