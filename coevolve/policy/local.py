"""The ``local`` policy backend: a transformers causal LM generating for many conversations at once.

    policy = LocalPolicy(PolicyConfig(model="tiny"))
    gens = policy.chat(conversations, tools, SamplingParams(temperature=1.0, seed=0), meta)

Generation is a hand-written loop over ``model.forward`` (not ``generate``) so that it can:

- start every prompt from the cached KV of its longest already-computed prefix, because
  prefill is the CPU bottleneck: the system message with the tool block is shared by all
  samples and steps of a task, and an episode's next prompt extends its previous prompt and
  answer (``PrefixCache``); only the new tokens are computed, one prompt at a time, so a long
  uncached prompt never pads the others;
- decode all rows together, left-padded, in a KV cache that appends in place
  (``_GrowingLayer``) and reads grouped KV heads without copying them (``gqa_attention``);
- draw every row from its own random generator seeded from (seed, task, sample, turn, step),
  so a row's sample does not depend on which other rows share its batch (up to float
  rounding: padding changes reduction orders in the last bits, which can flip a draw that
  lands on a boundary, rarely, with peaked real-model distributions).

Bitwise reproducibility holds for the same sequence of calls with the same batch size on a
fresh policy (a fresh process): cached KV carries the rounding of the call that made it.
The cache is dropped whenever the weights change (an optimizer step, new LoRA adapters).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from coevolve.config import PolicyConfig
from coevolve.policy import row_seed
from coevolve.policy.base import Generation, Message, SamplingParams
from coevolve.policy.models import resolve_model
from coevolve.policy.prompts import render_prompt

# Prefixes shorter than this are not worth a cache entry.
_MIN_PREFIX = 16


def sample_next(logits: torch.Tensor, sampling: SamplingParams, generators: list[torch.Generator]) -> list[int]:
    """One next token per row of ``logits`` [B, V]: greedy at temperature 0, else temperature + top-p.

    Sampling inverts each row's CDF at one uniform draw from the row's own generator: exact,
    and one cheap draw per row instead of a ``multinomial`` call per row.
    """
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest set whose mass reaches top_p (the first token always stays).
        outside = sorted_p.cumsum(dim=-1) - sorted_p > sampling.top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    cdf = probs.cumsum(dim=-1)
    u = torch.cat([torch.rand(1, generator=g) for g in generators]).to(cdf.device)[:, None] * cdf[:, -1:]
    # searchsorted finds the first index whose CDF exceeds u; zero-probability tokens never qualify.
    return torch.searchsorted(cdf, u, right=True).clamp_max(cdf.shape[-1] - 1).squeeze(1).tolist()


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
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    b, h, q, d = query.shape
    kv = key.shape[1]
    rep = h // kv
    scores = torch.matmul(query.reshape(b, kv, rep * q, d), key.transpose(-1, -2)) * (scaling or d**-0.5)
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

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        new = key_states.shape[-2]
        if self._n + new > self._k.shape[2]:  # out of room: double (rare: capacity covers the generation)
            grow = max(new, self._k.shape[2])
            self._k = torch.cat([self._k, self._k.new_empty(self._k.shape[:2] + (grow, self._k.shape[3]))], dim=2)
            self._v = torch.cat([self._v, self._v.new_empty(self._v.shape[:2] + (grow, self._v.shape[3]))], dim=2)
        self._k[:, :, self._n : self._n + new] = key_states
        self._v[:, :, self._n : self._n + new] = value_states
        self._n += new
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self._views()


def _growing_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], capacity: int) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [_GrowingLayer(k, v, capacity) for k, v in layers]
    return cache


class PrefixCache:
    """LRU store of per-layer (key, value) tensors [1, heads, len, dim] of token sequences, capped in tokens.

    A lookup reuses the longest common prefix with any stored sequence: in a causal model the
    KV of a position depends only on the tokens up to it, so a partial match is as good as a
    whole one (a re-tokenized previous answer that diverges late still saves its start).
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor]]]] = OrderedDict()
        self._tokens = 0

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

    def put(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        key = tuple(ids)
        if len(key) < _MIN_PREFIX or len(key) > self.max_tokens or key in self._entries:
            return
        self._entries[key] = (np.asarray(ids), kv)
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._tokens -= len(old)

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0


class LocalPolicy:
    """Policy over a local Hugging Face causal LM. Exposes ``model``, ``tokenizer``, ``model_path``."""

    name = "local"

    def __init__(
        self,
        cfg: PolicyConfig,
        checkpoint: str | None = None,
        *,
        prefix_cache_tokens: int = 32768,
        device: str | None = None,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        self.model_path = resolve_model(checkpoint or cfg.model)
        self.version = checkpoint or cfg.model
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path).to(self.device).eval()
        if self.model.config._attn_implementation == "sdpa":  # keep flash attention where a GPU has it
            self.model.set_attn_implementation("coevolve_gqa")
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self._cached_weights = self._weights_version()
        gen_eos = self.model.generation_config.eos_token_id
        eos = set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.stop_ids = eos
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(eos)
        limit = getattr(self.model.config, "max_position_embeddings", None) or cfg.max_context_tokens
        self.max_context_tokens = min(cfg.max_context_tokens, limit)

    # ------------------------------------------------------------------ Policy
    def chat(
        self,
        conversations: list[list[Message]],
        tools: list[list[dict[str, Any]]],
        sampling: SamplingParams,
        meta: list[dict[str, Any]] | None = None,
    ) -> list[Generation]:
        """Next assistant message for each conversation (see ``coevolve.policy.base.Policy``)."""
        if not conversations:
            return []
        prompts = [
            render_prompt(
                conv, tl, self.tokenizer, tool_format=self.cfg.tool_format,
                max_context_tokens=self.max_context_tokens, max_new_tokens=sampling.max_new_tokens,
            )
            for conv, tl in zip(conversations, tools)
        ]
        seeds = [row_seed(sampling.seed, meta[i] if meta else None, i) for i in range(len(prompts))]
        outs = self.generate([p.ids for p in prompts], sampling, seeds)
        gens = []
        for prompt, (ids, finish) in zip(prompts, outs):
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            gens.append(Generation(
                text=text, prompt_tokens=len(prompt.ids), completion_tokens=len(ids),
                finish_reason="context_limit" if prompt.context_limit else finish,
            ))
        return gens

    # ------------------------------------------------------------------ generation
    def _weights_version(self) -> tuple[int, int]:
        """Changes whenever a parameter is updated in place (optimizer steps bump ``_version``)
        or added (LoRA adapters), so cached KV of older weights is never reused."""
        params = list(self.model.parameters())
        return len(params), sum(p._version for p in params)

    def _kv_shape(self) -> tuple[int, int, int]:
        cfg = self.model.config.get_text_config(decoder=True)
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cfg.num_hidden_layers, heads, head_dim

    def _prefill(self, ids: list[int]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """KV [1, heads, len, dim] per layer of one prompt, and its next-token logits.

        Starts from the longest cached prefix (the shared system message and tools, the same
        prompt of a sibling sample, or this episode's previous prompt and answer), computes
        only the rest, and caches the result for the next lookups.
        """
        n_layers, heads, head_dim = self._kv_shape()
        p, kv = self.prefix_cache.longest(ids)
        if kv is None:
            empty = torch.zeros((1, heads, 0, head_dim), dtype=next(self.model.parameters()).dtype, device=self.device)
            kv = [(empty, empty)] * n_layers
        cache = _growing_cache(kv, len(ids))
        out = self.model(
            input_ids=torch.tensor([ids[p:]], device=self.device),
            position_ids=torch.arange(p, len(ids), device=self.device)[None],
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        )
        row_kv = [(layer.keys, layer.values) for layer in cache.layers]
        self.prefix_cache.put(ids, row_kv)
        return row_kv, out.logits[0, -1]

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        seeds: list[int],
    ) -> list[tuple[list[int], str]]:
        """Sample a continuation of each prompt; returns (generated ids without the stop token, finish).

        finish is "stop" (a stop token) or "length" (``max_new_tokens`` reached). Prompts are
        prefilled one by one (no padding: a long uncached prompt must not make every row of the
        batch compute that many tokens), then decoded together, left-padded to the longest.
        """
        weights = self._weights_version()
        if weights != self._cached_weights:
            self.prefix_cache.clear()
            self._cached_weights = weights
        n, dev = len(prompts), self.device
        rows = [self._prefill(ids) for ids in prompts]
        lengths = [len(ids) for ids in prompts]
        L = max(lengths)
        layers = []
        for li in range(len(rows[0][0])):
            ks, vs = [], []
            for (kv, _), length in zip(rows, lengths):
                k, v = kv[li]
                pad = k.new_zeros(k.shape[:2] + (L - length, k.shape[3]))
                ks.append(torch.cat([pad, k], dim=2))
                vs.append(torch.cat([pad, v], dim=2))
            layers.append((torch.cat(ks), torch.cat(vs)))
        cache = _growing_cache(layers, L + sampling.max_new_tokens)
        mask = torch.zeros((n, L), dtype=torch.long)
        for i, length in enumerate(lengths):
            mask[i, L - length:] = 1

        def remember(rows_: list[int], batch_pos: list[int]) -> None:
            """Cache the KV of rows (prompt + the generated tokens already fed): the episode's
            next prompt extends exactly that."""
            fed = cache.layers[0].keys.shape[2] - L
            for r, j in zip(rows_, batch_pos):
                if fed:
                    kv = [(l.keys[j:j + 1, :, L - lengths[r]:], l.values[j:j + 1, :, L - lengths[r]:]) for l in cache.layers]
                    self.prefix_cache.put(prompts[r] + generated[r][:fed], [(k.clone(), v.clone()) for k, v in kv])

        generators = [torch.Generator().manual_seed(s) for s in seeds]
        generated: list[list[int]] = [[] for _ in range(n)]
        finish = ["length"] * n
        active = list(range(n))  # original row index of each row still in the batch
        next_pos = torch.tensor(lengths)
        logits = torch.stack([row_logits for _, row_logits in rows])
        for step in range(sampling.max_new_tokens):
            tokens = sample_next(logits, sampling, [generators[r] for r in active])
            keep = []
            for j, (r, tok) in enumerate(zip(active, tokens)):
                if tok in self.stop_ids:
                    finish[r] = "stop"
                else:
                    generated[r].append(tok)
                    keep.append(j)
            if not keep or step == sampling.max_new_tokens - 1:
                break
            if len(keep) < len(active):
                gone = [j for j in range(len(active)) if j not in keep]
                remember([active[j] for j in gone], gone)
                idx = torch.tensor(keep)
                cache.batch_select_indices(idx.to(dev))
                mask, next_pos = mask[idx], next_pos[idx]
                tokens = [tokens[j] for j in keep]
                active = [active[j] for j in keep]
            mask = torch.cat([mask, torch.ones((len(active), 1), dtype=torch.long)], dim=1)
            out = self.model(
                input_ids=torch.tensor(tokens, device=dev)[:, None], attention_mask=mask.to(dev),
                position_ids=next_pos[:, None].to(dev), past_key_values=cache, use_cache=True,
            )
            next_pos = next_pos + 1
            logits = out.logits[:, -1]
        remember(active, list(range(len(active))))
        return [(generated[i], finish[i]) for i in range(n)]
