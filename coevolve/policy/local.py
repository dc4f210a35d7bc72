"""The ``local`` policy backend: a transformers causal LM generating for many conversations at once.

    policy = LocalPolicy(PolicyConfig(model="tiny"))
    gens = policy.chat(conversations, tools, SamplingParams(temperature=1.0, seed=0), meta)
    stream = policy.stream(sampling)      # what the rollout engine uses: submit / collect

Generation is a hand-written loop over ``model.forward`` (not ``generate``) so that it can:

- batch continuously, token by token (``coevolve.policy.decoder``): a conversation joins
  the running batch at the next step and leaves it the moment its answer ends, so with
  tool-calling episodes the batch stays full instead of idling at the pace of its longest answer;
- start every prompt from the cached KV of its longest already-computed prefix
  (``coevolve.policy.prefix_cache``): the system message with the tool block is shared by all
  samples and steps of a task, and an episode's next prompt extends its previous prompt and answer,
  whose generated token ids are reused as they are rather than re-tokenized (``render``);
  only the new tokens are computed, those of the prompts that join together in one pass over
  the weights (``FastStep.prefill``; one prompt at a time through ``forward`` otherwise), unpadded;
- decode all rows together, left-padded, in a KV cache that appends in place and reads
  grouped KV heads without copying them (``coevolve.policy.kv_cache``), through a lean
  decoding step for Llama-family models (``coevolve.policy.fast_step``: fused projections,
  about 20 operations per layer instead of transformers' ~60; ``fast_decode=False`` or another
  architecture steps through the model's own ``forward``), which also verifies tokens drafted
  by prompt lookup (``policy.draft_tokens``; ``coevolve.policy.decoder``);
- generate in half precision where that is fast (``policy.dtype``: bfloat16 on GPUs and on
  CPUs with native bfloat16, for models of 50M+ parameters) from a copy of the float32
  weights the trainer updates; on a 2-core CPU it makes a SmolLM2 decoding step at batch 8
  cost 1.5x one at batch 1 instead of 1.8x;
- hand back, with each message, what the trainer optimizes: the prompt ids as fed, the
  sampled ids (with the stop token when one was sampled) and each sampled token's
  behaviour log-prob (``decoder.sample_next``; ``coevolve.policy.base.Generation``);
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
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import torch

from coevolve.config import ConfigError, PolicyConfig
from coevolve.policy.base import Generation, Message, Request, SamplingParams, StreamingPolicy, row_seed
from coevolve.policy.decoder import Decoder, DecodeStats, Row
from coevolve.policy.fast_step import FastStep
from coevolve.policy.kv_cache import growing_cache
from coevolve.policy.models import resolve_model
from coevolve.policy.prefix_cache import PrefixCache, common_length
from coevolve.policy.prompts import Prompt, encode_with_answers, render_prompt

# Generated answers whose token ids are kept for re-rendering conversations.
_MAX_ANSWERS = 4096
# New tokens per batched prefill pass (bounds its activations and attention scores).
_PREFILL_TOKENS = 4096
# A prefix shared by prompts of one batch is computed once first when it is this much longer
# than what the prefix cache already holds of them.
_SHARED_PREFIX_GAIN = 32


def _shared_prefixes(prompts: list[list[int]], cache: PrefixCache) -> list[list[int]]:
    """The prefixes that prompts of one batch share with another of them (each prompt's
    longest with its neighbours in sorted order), where that is ``_SHARED_PREFIX_GAIN``
    tokens past what ``cache`` holds of it."""
    ordered = sorted(prompts)
    shared: dict[tuple[int, ...], list[int]] = {}
    for i, ids in enumerate(ordered):
        common = max((common_length(ids, ordered[j]) for j in (i - 1, i + 1) if 0 <= j < len(ordered)), default=0)
        common = min(common, len(ids) - 1)
        if common >= cache.longest(ids)[0] + _SHARED_PREFIX_GAIN:
            shared.setdefault(tuple(ids[:common]), ids[:common])
    return list(shared.values())


def cpu_has_native_bf16() -> bool:
    """The CPU computes in bfloat16 natively (AVX-512 BF16 or AMX) and torch's kernels use
    AVX-512: ``ATEN_CPU_CAPABILITY=avx2`` (with ``ONEDNN_MAX_CPU_ISA=AVX2``) runs such a box as
    an AVX2-only one would, float32 included."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AVX512_BF16", "AMX"):
        return False
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
    return auto_dtype(sum(p.numel() for p in model.parameters()), device)


def auto_dtype(n_params: int, device: torch.device) -> torch.dtype:
    """What 'auto' resolves to for a model of ``n_params`` weights on ``device`` (``generation_dtype``)."""
    if n_params < 50_000_000:
        return torch.float32
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if device.type == "cpu" and cpu_has_native_bf16() else torch.float32


def policy_device(name: str) -> torch.device:
    """``policy.device`` resolved: 'auto' is the first CUDA GPU when torch sees one, else the CPU;
    'cuda' / 'cuda:<i>' must name a GPU torch can see (``ConfigError`` otherwise)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"policy.device is {name!r} but torch {torch.__version__} sees no CUDA GPU "
                "(a CPU-only build, or no driver): set policy.device to 'cpu' or 'auto'"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"policy.device is {name!r} but torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    return device


class LocalPolicy(StreamingPolicy):
    """Policy over a local Hugging Face causal LM. Exposes ``model``, ``tokenizer``, ``model_path``."""

    name = "local"

    def __init__(
        self,
        cfg: PolicyConfig,
        checkpoint: str | None = None,
        *,
        prefix_cache_tokens: int = 32768,
        device: str | None = None,
        fast_decode: bool = True,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.cfg = cfg
        self.model_path = resolve_model(checkpoint or cfg.model)
        self.version = checkpoint or cfg.model
        self.device = policy_device(device or cfg.device)  # the argument, else policy.device
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        # float32 weights: what the local trainer updates in place (LoRA or full)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).to(self.device).eval()
        if self.model.config._attn_implementation == "sdpa":  # keep flash attention where a GPU has it
            self.model.set_attn_implementation("coevolve_gqa")
        self.dtype = generation_dtype(cfg.dtype, self.model, self.device)
        self._runner: torch.nn.Module | None = None
        self._fast: FastStep | None = None
        self.fast_decode = fast_decode  # False: every decoding step through the model's forward
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

    # ------------------------------------------------------------------ Policy (chat: StreamingPolicy)
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
                self._fast = FastStep.build(self.model) if self.fast_decode else None
            else:
                runner = copy.deepcopy(self.model)
                if lora:
                    _merge_lora(runner)
                self._runner = runner.to(self.dtype).eval().requires_grad_(False)
                # a copy: its projections can become views of the fused weights (no extra memory)
                self._fast = FastStep.build(self._runner, share=True) if self.fast_decode else None
        return self._runner

    @property
    def fast_step(self) -> FastStep | None:
        """The lean decoding step over ``runner`` (``coevolve.policy.fast_step``), or None where
        it does not cover the model or ``fast_decode`` is off: the decoder then calls
        ``runner``'s own forward."""
        self.runner  # noqa: B018 (builds the step with the runner)
        return self._fast

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
        cache = growing_cache(kv, len(ids))
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

    def _prefill_many(
        self, prompts: list[list[int]]
    ) -> list[tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]]:
        """``_prefill`` of several prompts: with the lean step, the uncached tokens of all of
        them in batched passes over the weights (``FastStep.prefill``), where one prompt at a
        time reads every weight once per prompt. A prefix that several of them share beyond
        what is cached (the system message and tools of a task's first turn) is computed once,
        first; identical prompts (a GRPO group's samples) are computed once."""
        fast = self.fast_step
        if fast is None:
            return [self._prefill(ids) for ids in prompts]
        done: dict[tuple[int, ...], tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]] = {}
        todo: dict[tuple[int, ...], list[int]] = {}
        for ids in prompts:
            hit = self.prefix_cache.exact(ids)
            if hit is not None:
                done[tuple(ids)] = hit
            else:
                todo[tuple(ids)] = ids
        self._prefill_batched(fast, _shared_prefixes(list(todo.values()), self.prefix_cache), logits=False)
        done.update(self._prefill_batched(fast, list(todo.values()), logits=True))
        return [done[tuple(ids)] for ids in prompts]

    def _prefill_batched(
        self, fast: FastStep, prompts: list[list[int]], logits: bool
    ) -> dict[tuple[int, ...], tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]]:
        """Compute ``prompts`` (their uncached part) in passes of at most ``_PREFILL_TOKENS``
        new tokens, put them in the prefix cache (with their next-token logits if ``logits``)
        and return each one's (KV, next-token logits)."""
        out = {}
        batch: list[tuple[list[int], int, list[tuple[torch.Tensor, torch.Tensor]] | None]] = []
        tokens = 0
        for i, ids in enumerate(prompts):
            p, kv = self.prefix_cache.longest(ids)
            batch.append((ids, p, kv))
            tokens += len(ids) - p
            if tokens >= _PREFILL_TOKENS or i == len(prompts) - 1:
                self.stats.prefill_tokens += tokens
                rows_kv, next_logits = fast.prefill([(ids[p:], kv) for ids, p, kv in batch])
                for (ids, _, _), row_kv, row_logits in zip(batch, rows_kv, next_logits):
                    self.prefix_cache.put(ids, row_kv, row_logits if logits else None)
                    out[tuple(ids)] = (row_kv, row_logits)
                batch, tokens = [], 0
        return out

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

    def _generation(self, row: Row, finish: str) -> Generation:
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
