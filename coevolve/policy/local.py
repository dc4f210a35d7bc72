"""The ``local`` policy backend: a transformers causal LM generating for many conversations at once.

    policy = LocalPolicy(PolicyConfig(model="tiny"))
    gens = policy.chat(conversations, tools, SamplingParams(temperature=1.0, seed=0), meta)
    stream = policy.stream(sampling)      # what the rollout engine uses: submit / collect

Generation is a hand-written loop over ``model.forward`` (not ``generate``) so that it can:

- batch continuously, token by token (``Decoder``): a conversation joins the running batch
  at the next step and leaves it the moment its answer ends, so with tool-calling episodes
  the batch stays full instead of idling at the pace of its longest answer;
- start every prompt from the cached KV of its longest already-computed prefix
  (``PrefixCache``): the system message with the tool block is shared by all samples and
  steps of a task, and an episode's next prompt extends its previous prompt and answer,
  whose generated token ids are reused as they are rather than re-tokenized (``render``);
  only the new tokens are computed, one prompt at a time, so a long uncached prompt never
  pads the others;
- decode all rows together, left-padded, in a KV cache that appends in place
  (``_GrowingLayer``) and reads grouped KV heads without copying them (``gqa_attention``);
- generate in half precision where that is fast (``policy.dtype``: bfloat16 on GPUs and on
  CPUs with native bfloat16, for models of 50M+ parameters) from a copy of the float32
  weights the trainer updates; on a 2-core CPU it makes a SmolLM2 decoding step at batch 8
  cost 1.5x one at batch 1 instead of 1.8x;
- hand back, with each message, what the trainer optimizes: the prompt ids as fed, the
  sampled ids (with the stop token when one was sampled) and each sampled token's
  behaviour log-prob (``sample_next``; ``coevolve.policy.base.Generation``);
- draw every row from its own random generator seeded from (seed, task, sample, turn, step),
  so a row's sample does not depend on which other rows share its batch (up to float
  rounding: padding changes reduction orders in the last bits, which can flip a draw that
  lands on a boundary, rarely, with peaked real-model distributions).

Bitwise reproducibility holds for the same sequence of calls with the same batch size on a
fresh policy (a fresh process): cached KV carries the rounding of the call that made it.
The cache and the half-precision copy are dropped whenever the weights change (an
optimizer step, new LoRA adapters).
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from coevolve.config import PolicyConfig
from coevolve.policy.base import row_seed
from coevolve.policy.base import Generation, Message, Request, SamplingParams, chat_through
from coevolve.policy.models import resolve_model
from coevolve.policy.prompts import Prompt, encode_with_answers, render_prompt

# Prefixes shorter than this are not worth a cache entry.
_MIN_PREFIX = 16
# Generated answers whose token ids are kept for re-rendering conversations.
_MAX_ANSWERS = 4096


def _cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _has_lora(model: torch.nn.Module) -> bool:
    return any(hasattr(m, "lora_A") and hasattr(m, "get_base_layer") for m in model.modules())


def _merge_lora(model: torch.nn.Module) -> None:
    """Merge every peft LoRA layer of ``model`` (a copy) into its base layer and put the base
    layer in its place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if hasattr(child, "lora_A") and hasattr(child, "get_base_layer"):
                child.merge()
                setattr(parent, name, child.get_base_layer())


def generation_dtype(name: str, model: torch.nn.Module, device: torch.device) -> torch.dtype:
    """``policy.dtype`` resolved. 'auto' is bfloat16 where it is fast and the model is big enough
    for the halved weight traffic to matter (50M+ parameters: smaller models are bound by
    per-operation overhead, which casts only add to), else float32."""
    if name != "auto":
        return getattr(torch, name)
    if sum(p.numel() for p in model.parameters()) < 50_000_000:
        return torch.float32
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if device.type == "cpu" and _cpu_has_native_bf16() else torch.float32


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

    def keep(self, indices: torch.Tensor, trim: int = 0) -> None:
        """Keep the rows ``indices``, without the first ``trim`` columns."""
        self._k, self._v = self._k[indices][:, :, trim:], self._v[indices][:, :, trim:]
        self._n -= trim
        self._views()


def _growing_cache(layers: list[tuple[torch.Tensor, torch.Tensor]], capacity: int) -> DynamicCache:
    cache = DynamicCache()
    cache.layers = [_GrowingLayer(k, v, capacity) for k, v in layers]
    return cache


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
        # float32 weights: what the local trainer updates in place (LoRA or full)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).to(self.device).eval()
        if self.model.config._attn_implementation == "sdpa":  # keep flash attention where a GPU has it
            self.model.set_attn_implementation("coevolve_gqa")
        self.dtype = generation_dtype(cfg.dtype, self.model, self.device)
        self._runner: torch.nn.Module | None = None
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self._answers: OrderedDict[str, list[int]] = OrderedDict()  # generated text -> its ids
        self.stats = DecodeStats()
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
        return chat_through(self.stream(sampling), conversations, tools, meta)

    def stream(self, sampling: SamplingParams) -> "LocalStream":
        """A ``GenerationStream`` with token-level continuous batching (``Decoder``)."""
        return LocalStream(self, sampling)

    def render(self, messages: list[Message], tools: list[dict[str, Any]], sampling: SamplingParams) -> Prompt:
        """The prompt of a conversation, with the exact ids this policy generated for its
        assistant messages (so the prefix cache finds the previous prompt and answer)."""
        return render_prompt(
            messages,
            tools,
            self.tokenizer,
            tool_format=self.cfg.tool_format,
            max_context_tokens=self.max_context_tokens,
            max_new_tokens=sampling.max_new_tokens,
            assistant_ids=self._answers,
        )

    def encode_chat(self, text: str, answers: list[str]) -> list[int]:
        """Token ids of a rendered chat whose assistant messages are ``answers``: those this
        policy generated keep their ids (``render`` for conversations not yet rendered)."""
        return encode_with_answers(text, self.tokenizer, [(a, self._answers[a]) for a in answers if a in self._answers])

    def answer_text(self, ids: list[int]) -> str:
        """Decode a generated answer and remember its ids for ``render``."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if text:
            self._answers[text] = ids
            self._answers.move_to_end(text)
            while len(self._answers) > _MAX_ANSWERS:
                self._answers.popitem(last=False)
        return text

    # ------------------------------------------------------------------ generation
    def _check_weights(self) -> None:
        """Drop cached KV computed with weights that have changed since."""
        weights = self._weights_version()
        if weights != self._cached_weights:
            self.prefix_cache.clear()
            self._runner = None
            self._cached_weights = weights

    @property
    def runner(self) -> torch.nn.Module:
        """The model generation runs on: ``model`` itself, or a copy (remade after the weights
        change) in ``dtype`` and with any LoRA adapters the trainer injected merged into their
        base weights: a decoding step at a small batch is bound by per-operation overhead, and
        an unmerged adapter turns each projection into four operations."""
        if self._runner is None:
            lora = _has_lora(self.model)
            if self.dtype == torch.float32 and not lora:
                self._runner = self.model
            else:
                runner = copy.deepcopy(self.model)
                if lora:
                    _merge_lora(runner)
                self._runner = runner.to(self.dtype).eval().requires_grad_(False)
        return self._runner

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
        hit = self.prefix_cache.exact(ids)
        if hit is not None:
            return hit
        n_layers, heads, head_dim = self._kv_shape()
        p, kv = self.prefix_cache.longest(ids)
        self.stats.prefill_tokens += len(ids) - p
        if kv is None:
            empty = torch.zeros((1, heads, 0, head_dim), dtype=self.dtype, device=self.device)
            kv = [(empty, empty)] * n_layers
        cache = _growing_cache(kv, len(ids))
        out = self.runner(
            input_ids=torch.tensor([ids[p:]], device=self.device),
            position_ids=torch.arange(p, len(ids), device=self.device)[None],
            past_key_values=cache,
            use_cache=True,
            # An index rather than logits_to_keep=1: the slice that makes is not contiguous, and
            # the output projection then copies its whole weight matrix on every call.
            logits_to_keep=torch.tensor([len(ids) - p - 1], device=self.device),
        )
        row_kv = [(layer.keys, layer.values) for layer in cache.layers]
        logits = out.logits[0, -1]
        self.prefix_cache.put(ids, row_kv, logits)
        return row_kv, logits

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        seeds: list[int],
    ) -> list[tuple[list[int], str]]:
        """Sample a continuation of each prompt; returns (generated ids without the stop token, finish).

        finish is "stop" (a stop token) or "length" (``max_new_tokens`` reached).
        """
        decoder = Decoder(self, sampling)
        decoder.add([(i, ids, seed) for i, (ids, seed) in enumerate(zip(prompts, seeds))])
        out: dict[int, tuple[list[int], str]] = {}
        while decoder:
            out.update((key, (ids, finish)) for key, ids, finish in decoder.step())
        return [out[i] for i in range(len(prompts))]


@dataclass
class DecodeStats:
    """Where a policy's generation time went (cumulative; ``coevolve bench rollout`` prints it)."""

    prefill_tokens: int = 0  # prompt tokens computed (not found in the prefix cache)
    prefill_s: float = 0.0
    steps: int = 0  # decoding steps (one token for every row in the batch)
    row_steps: int = 0  # sum of the batch size over steps
    decode_s: float = 0.0


@dataclass
class _Row:
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
        self.rows: list[_Row] = []
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
        rows = [_Row(key, list(ids), torch.Generator().manual_seed(seed)) for key, ids, seed in requests]
        t = time.perf_counter()
        prefills = [self.policy._prefill(row.prompt) for row in rows]
        self.policy.stats.prefill_s += time.perf_counter() - t
        lengths = [len(row.prompt) for row in rows]
        width = max([self.width, *lengths])

        def padded(x: torch.Tensor) -> torch.Tensor:  # left-pad [1|B, heads, len, dim] to the batch width
            missing = width - x.shape[2]
            return x if not missing else torch.cat([x.new_zeros(x.shape[:2] + (missing, x.shape[3])), x], dim=2)

        layers = []
        for li in range(len(prefills[0][0])):
            old = [(self.cache.layers[li].keys, self.cache.layers[li].values)] if self.cache is not None else []
            pairs = old + [kv[li] for kv, _ in prefills]
            layers.append((torch.cat([padded(k) for k, _ in pairs]), torch.cat([padded(v) for _, v in pairs])))
        self.cache = _growing_cache(layers, width + self.sampling.max_new_tokens)
        self.lengths = torch.cat([self.lengths, torch.tensor(lengths)])
        new_logits = torch.stack([logits for _, logits in prefills])
        self.logits = new_logits if self.logits is None else torch.cat([self.logits, new_logits])
        self.rows += rows

    def step(self) -> list[tuple[Hashable, list[int], str]]:
        """Sample one token for every row and feed it; returns the rows that finished, as
        (key, generated ids without the stop token, "stop" | "length")."""
        return [(row.key, row.generated, finish) for row, finish in self.step_rows()]

    @torch.inference_mode()
    def step_rows(self) -> list[tuple[_Row, str]]:
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
            self._keep(keep)
        if self.rows:
            width = self.width + 1
            mask = torch.arange(width)[None] >= (width - 1 - self.lengths)[:, None]
            dev = self.policy.device
            out = self.policy.runner(
                input_ids=torch.tensor([tokens[j] for j in keep], device=dev)[:, None],
                attention_mask=mask.long().to(dev),
                position_ids=self.lengths[:, None].to(dev),
                past_key_values=self.cache,
                use_cache=True,
            )
            self.lengths = self.lengths + 1
            self.logits = out.logits[:, -1]
        stats.decode_s += time.perf_counter() - t
        return done

    def _keep(self, keep: list[int]) -> None:
        """Cut the batch down to rows ``keep``, dropping leading columns that no kept row uses."""
        self.rows = [self.rows[j] for j in keep]
        if not keep:
            self.cache, self.logits, self.lengths = None, None, torch.zeros(0, dtype=torch.long)
            return
        idx = torch.tensor(keep)
        self.lengths, self.logits = self.lengths[idx], self.logits[idx]
        trim = self.width - int(self.lengths.max())
        for layer in self.cache.layers:
            layer.keep(idx.to(self.policy.device), trim)

    def _remember(self, j: int) -> None:
        """Cache the KV of row ``j``'s prompt and the answer tokens fed so far: an episode's
        next prompt extends exactly that (``LocalPolicy`` keeps the answer's ids)."""
        row, n = self.rows[j], int(self.lengths[j])
        fed = n - len(row.prompt)
        if fed > 0:
            kv = [(l.keys[j : j + 1, :, -n:].clone(), l.values[j : j + 1, :, -n:].clone()) for l in self.cache.layers]
            self.policy.prefix_cache.put(row.prompt + row.generated[:fed], kv)


class LocalStream:
    """``GenerationStream`` of a ``LocalPolicy``: conversations rendered and joined to a ``Decoder``."""

    def __init__(self, policy: LocalPolicy, sampling: SamplingParams):
        self.policy, self.sampling = policy, sampling
        self.decoder = Decoder(policy, sampling)
        self._prompts: dict[Hashable, Prompt] = {}

    def submit(self, requests: list[Request]) -> None:
        rows = []
        for i, req in enumerate(requests):
            if req.key in self._prompts:
                raise ValueError(f"request {req.key!r} is already being generated")
            prompt = self._prompts[req.key] = self.policy.render(req.messages, req.tools, self.sampling)
            rows.append((req.key, prompt.ids, row_seed(self.sampling.seed, req.meta, i)))
        self.decoder.add(rows)

    def collect(self) -> list[tuple[Hashable, Generation]]:
        while self.decoder:
            finished = self.decoder.step_rows()
            if finished:
                return [(row.key, self._generation(row, finish)) for row, finish in finished]
        return []

    def _generation(self, row: _Row, finish: str) -> Generation:
        prompt = self._prompts.pop(row.key)
        ids = row.generated
        return Generation(
            text=self.policy.answer_text(ids),
            prompt_tokens=len(prompt.ids),
            completion_tokens=len(ids),
            finish_reason="context_limit" if prompt.context_limit else finish,
            prompt_ids=list(row.prompt),
            completion_ids=ids + ([row.stop] if row.stop is not None else []),
            completion_logprobs=list(row.logprobs),
        )

    def __len__(self) -> int:
        return len(self.decoder)

    def close(self) -> None:
        self.decoder = Decoder(self.policy, self.sampling)
        self._prompts.clear()
