"""The ``local`` policy backend: a transformers causal LM generating for many conversations at once.

    policy = LocalPolicy(PolicyConfig(model="tiny"))
    gens = policy.chat(conversations, tools, SamplingParams(temperature=1.0, seed=0), meta)

Generation is a hand-written loop over ``model.forward`` (not ``generate``) so that it can:

- batch rows of different lengths with left padding and a KV cache;
- start each row from a cached KV of its longest already-computed prefix (the system
  message with the tool block, or the row's whole previous prompt), because prefill is the
  CPU bottleneck: a cached prefix sits at the left of the row, then padding, then the new
  tokens, with explicit position ids so the padding in the middle is invisible;
- draw every row from its own random generator seeded from (seed, task, sample, turn, step),
  so a row's sample does not depend on which other rows share its batch.

Prefix KV entries are computed with batch composition-dependent float rounding, so bitwise
reproducibility holds for the same sequence of calls in a fresh policy (a fresh process).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from typing import Any

import torch

from coevolve.config import PolicyConfig
from coevolve.policy.base import Generation, Message, SamplingParams
from coevolve.policy.models import resolve_model
from coevolve.policy.prompts import render_prompt
from coevolve.registry import register

# Prefixes shorter than this are not worth a cache entry.
_MIN_PREFIX = 16


def row_seed(seed: int | None, meta: dict[str, Any] | None, index: int) -> int:
    """Seed of one row: a hash of the run seed and where the row stands (task, sample, turn, step)."""
    if seed is None:
        return random.getrandbits(31)
    where = json.dumps(meta, sort_keys=True, default=str) if meta else str(index)
    # 31 bits: what OpenAI-compatible endpoints accept, so both backends draw the same seeds.
    return int.from_bytes(hashlib.sha256(f"{seed}|{where}".encode()).digest()[:4], "little") >> 1


def sample_next(logits: torch.Tensor, sampling: SamplingParams, generators: list[torch.Generator]) -> list[int]:
    """One next token per row of ``logits`` [B, V]: greedy at temperature 0, else temperature + top-p."""
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest set whose mass reaches top_p (the first token always stays).
        outside = sorted_p.cumsum(dim=-1) - sorted_p > sampling.top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return [int(torch.multinomial(probs[i], 1, generator=generators[i])) for i in range(len(generators))]


class PrefixCache:
    """LRU store of per-layer (key, value) tensors [1, heads, len, dim] for token prefixes, capped in tokens."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self._tokens = 0

    def longest(self, ids: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """The longest cached prefix of ``ids`` that leaves at least one token to compute."""
        best: tuple[int, ...] | None = None
        for key in self._entries:
            if len(key) < len(ids) and (best is None or len(key) > len(best)) and tuple(ids[: len(key)]) == key:
                best = key
        if best is None:
            return 0, None
        self._entries.move_to_end(best)
        return len(best), self._entries[best]

    def put(self, ids: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        key = tuple(ids)
        if len(key) < _MIN_PREFIX or len(key) > self.max_tokens or key in self._entries:
            return
        self._entries[key] = kv
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._tokens -= len(old)

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0


@register("policy", "local")
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
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
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
        outs = self.generate([p.ids for p in prompts], sampling, seeds, [p.prefix_len for p in prompts])
        gens = []
        for prompt, (ids, finish) in zip(prompts, outs):
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            gens.append(Generation(
                text=text, prompt_tokens=len(prompt.ids), completion_tokens=len(ids),
                finish_reason="context_limit" if prompt.context_limit else finish,
            ))
        return gens

    # ------------------------------------------------------------------ generation
    def _prefill_prefix(self, ids: list[int]) -> None:
        """Compute and cache the KV of a shared prefix (system message + tools) on its own."""
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([ids], device=self.device), use_cache=True, logits_to_keep=1)
        self.prefix_cache.put(ids, [(layer.keys, layer.values) for layer in out.past_key_values.layers])

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        seeds: list[int],
        prefix_lens: list[int] | None = None,
    ) -> list[tuple[list[int], str]]:
        """Sample a continuation of each prompt; returns (generated ids without the stop token, finish).

        ``prefix_lens[i]`` marks a shared prefix of row ``i`` worth caching on its own (the system
        message); finish is "stop" (a stop token) or "length" (``max_new_tokens`` reached).
        """
        for ids, plen in zip(prompts, prefix_lens or [0] * len(prompts)):
            if plen >= _MIN_PREFIX and self.prefix_cache.longest(ids)[0] < plen:
                self._prefill_prefix(ids[:plen])
        hits = [self.prefix_cache.longest(ids) for ids in prompts]
        n = len(prompts)
        plens = [h[0] for h in hits]
        suffixes = [ids[p:] for ids, p in zip(prompts, plens)]
        P, S = max(plens), max(len(s) for s in suffixes)

        # Layout of row i: [pad | cached prefix (p_i) | pad | new tokens (s_i)], attention masked on pads.
        input_ids = torch.full((n, S), self.pad_id, dtype=torch.long)
        position_ids = torch.zeros((n, S), dtype=torch.long)
        mask = torch.zeros((n, P + S), dtype=torch.long)
        for i, (p, suf) in enumerate(zip(plens, suffixes)):
            input_ids[i, S - len(suf):] = torch.tensor(suf)
            position_ids[i, S - len(suf):] = torch.arange(p, p + len(suf))
            mask[i, P - p:P] = 1
            mask[i, P + S - len(suf):] = 1
        cache = None
        if P:
            from transformers import DynamicCache

            ref = next(kv for _, kv in hits if kv is not None)
            layers = []
            for li, (rk, _) in enumerate(ref):
                heads, dim = rk.shape[1], rk.shape[3]
                rows_k, rows_v = [], []
                for p, (_, kv) in zip(plens, hits):
                    k, v = kv[li] if kv is not None else (rk[:, :, :0], rk[:, :, :0])
                    pad = rk.new_zeros((1, heads, P - p, dim))
                    rows_k.append(torch.cat([pad, k], dim=2))
                    rows_v.append(torch.cat([pad, v], dim=2))
                layers.append((torch.cat(rows_k), torch.cat(rows_v)))
            cache = DynamicCache(ddp_cache_data=layers)
        dev = self.device
        out = self.model(
            input_ids=input_ids.to(dev), attention_mask=mask.to(dev), position_ids=position_ids.to(dev),
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        )
        cache = out.past_key_values
        # Remember each row's whole prompt: the next step of the episode extends it.
        for i, (p, suf) in enumerate(zip(plens, suffixes)):
            kv = [
                (torch.cat([l.keys[i:i + 1, :, P - p:P], l.keys[i:i + 1, :, P + S - len(suf):]], dim=2),
                 torch.cat([l.values[i:i + 1, :, P - p:P], l.values[i:i + 1, :, P + S - len(suf):]], dim=2))
                for l in cache.layers
            ]
            self.prefix_cache.put(prompts[i], kv)

        generators = [torch.Generator().manual_seed(s) for s in seeds]
        generated: list[list[int]] = [[] for _ in range(n)]
        finish = ["length"] * n
        active = list(range(n))  # original row index of each row still in the batch
        next_pos = torch.tensor([p + len(s) for p, s in zip(plens, suffixes)])
        logits = out.logits[:, -1]
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
        return [(generated[i], finish[i]) for i in range(n)]
