"""Log-probabilities of the sampled tokens only: the trainer's forward pass.

A causal LM's own forward computes logits for every position, [B, T, V], and a full-vocab
float32 log-softmax over them is the largest tensor of a training step (SmolLM2: 49,152
logits per token). GRPO needs only log p(sampled token) at the positions the model wrote,
so ``sampled_logprobs`` runs the model's decoder to its last hidden states, gathers the
rows of the predicting positions, applies the output head to those alone and takes
``logit[target] - logsumexp(logits)`` in float32: the same numbers, a fraction of the
memory traffic (prompt and observation tokens never reach the head).

    batch = pack(seqs, pad_id)                            # a micro-batch of TokenSequences
    logp = sampled_logprobs(model, batch, temperature)    # [N] float32, with grad
    batch["old_logp"], batch["adv"]                       # [N] aligned with logp

Works for models whose logits are the output embedding applied to the decoder's last
hidden state (Llama, Qwen2/3, Mistral, SmolLM2, ...), plain or wrapped by peft; others
(e.g. logit soft-capping) fall back to the full forward.

Shared prompts (``plan`` with ``share_prefix``): a GRPO group's episodes, and SFT examples
of one tool set, open with the same context tokens (the system message with the tool block,
~800 of a SmolLM2 sequence's ~1,100). ``plan`` groups sequences by that common prefix;
``forward_backward`` runs the prefix once, with grad, and every member's remainder on top
of the prefix's key/value cache, one member at a time. The members' gradients flow back
into the cache, are summed there and then through the prefix once: the same loss and the
same gradient as scoring every sequence whole, for the prefix's compute once instead of
once per member.

    for chunk in plan(seqs, pad_id, advantages, micro_batch_size=1, share_prefix=True):
        forward_backward(model, chunk, temperature, loss_fn)     # loss_fn(logp, batch) -> loss
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from collections.abc import Iterator
from typing import Any, Callable, cast

import torch

from coevolve.policy.prefix_cache import common_length
from coevolve.train.sequences import TokenSequence


def pack(
    seqs: list[TokenSequence],
    pad_id: int,
    advantages: list[float] | None = None,
    *,
    device: torch.device | str | None = None,
) -> dict[str, Any]:
    """Right-pad ``seqs`` into ``input_ids`` [B, T] (``attention_mask`` [B, T] only when lengths
    differ: an unpadded batch takes the causal fast path) and flatten what the loss needs over
    the N sampled tokens: ``rows``, ``cols`` [N] (the predicting position: ``cols + 1`` is the
    sampled token), ``targets`` [N], ``old_logp`` [N] float32 and ``adv`` [N] (each sequence's
    advantage, 0 when ``advantages`` is None). Every tensor is built on ``device`` (default the
    CPU): the model's device (``model_device``), so that a CUDA model is fed CUDA tensors."""
    width = max(len(s.ids) for s in seqs)
    padded = any(len(s.ids) != width for s in seqs)
    ids_rows, attention_rows = [], []
    rows, cols, old, adv = [], [], [], []
    for b, s in enumerate(seqs):
        ids_rows.append(list(s.ids) + [pad_id] * (width - len(s.ids)))
        attention_rows.append([1] * len(s.ids) + [0] * (width - len(s.ids)))
        for t in range(1, len(s.ids)):  # nothing predicts the first token
            if s.mask[t]:
                rows.append(b)
                cols.append(t - 1)
                old.append(s.logprobs[t])
                adv.append(advantages[b] if advantages is not None else 0.0)
    input_ids = torch.tensor(ids_rows, dtype=torch.long, device=device)
    rows_t = torch.tensor(rows, dtype=torch.long, device=device)
    cols_t = torch.tensor(cols, dtype=torch.long, device=device)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.tensor(attention_rows, dtype=torch.long, device=device) if padded else None,
        "rows": rows_t,
        "cols": cols_t,
        "targets": input_ids[rows_t, cols_t + 1],
        "old_logp": torch.tensor(old, dtype=torch.float32, device=device),
        "adv": torch.tensor(adv, dtype=torch.float32, device=device),
        "n_tokens": sum(len(s.ids) for s in seqs),
    }


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s parameters (where ``pack`` must build its batches)."""
    return next(model.parameters()).device


@contextlib.contextmanager
def compute_precision(dtype: torch.dtype, model: torch.nn.Module) -> Iterator[None]:
    """The context ``model``'s forward/backward passes run in to compute in ``dtype`` over float32
    weights: torch autocast (matmuls and attention in ``dtype``, reductions such as softmax and
    the loss's log-sum-exp in float32; gradients and the optimizer's state stay float32); nothing
    for float32.

    Autocast casts a weight to ``dtype`` at every use and keeps the cast only for weights that
    require a gradient, so a frozen projection (LoRA's base weights) would be cast again by
    every forward pass: about an eighth of a CPU update step. Inside the context each frozen
    float32 linear weight holds its ``dtype`` copy instead (the same cast autocast makes, so the
    same numbers) and gets its float32 values back on exit. The output head keeps float32: it
    is scored outside autocast (``sampled_logprobs``)."""
    if dtype == torch.float32:
        yield
        return
    base: Any = cast(Any, model).get_base_model() if hasattr(model, "get_base_model") else model  # peft
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    head_weight = getattr(head, "weight", None)
    frozen = [
        (m.weight, m.weight.data)
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
        and not m.weight.requires_grad
        and m.weight.dtype == torch.float32
        and m.weight is not head_weight
    ]
    try:
        for weight, data in frozen:
            weight.data = data.to(dtype)
        with torch.autocast(model_device(model).type, dtype=dtype):
            yield
    finally:
        for weight, data in frozen:
            weight.data = data


def _decoder_and_head(model: torch.nn.Module) -> tuple[Any, Any] | None:
    base = cast(Any, model).get_base_model() if hasattr(model, "get_base_model") else model  # peft
    if getattr(getattr(base, "config", None), "final_logit_softcapping", None):
        return None
    get_decoder, get_head = getattr(base, "get_decoder", None), getattr(base, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or decoder is base or not isinstance(head, torch.nn.Linear):
        return None
    return decoder, head


def sampled_logprobs(
    model: torch.nn.Module,
    batch: dict[str, Any],
    temperature: float = 1.0,
    past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """log p(target) of each sampled token of ``batch`` (``pack``) under ``model``: [N] float32.

    Scored on ``logits / temperature`` (1 when ``temperature`` <= 0), as the sampler recorded
    its behaviour log-probs (``coevolve.policy.decoder.sample_next``). ``past``: per-layer
    ``(keys, values)`` of a context that precedes every row of ``batch`` (a shared prefix;
    ``batch`` then holds one unpadded sequence and positions continue after the prefix).
    """
    scale = 1.0 / temperature if temperature > 0 else 1.0
    device = batch["input_ids"].device
    if device != model_device(model):
        raise ValueError(
            f"the batch is on {device} and the model on {model_device(model)}: build it with "
            "pack(..., device=model_device(model)) (plan takes the same device)"
        )
    parts = _decoder_and_head(model)
    kwargs: dict[str, Any] = {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "use_cache": False,
    }
    if past is not None:
        from transformers import DynamicCache

        offset, width = past[0][0].shape[2], batch["input_ids"].shape[1]
        kwargs.update(
            past_key_values=DynamicCache(ddp_cache_data=list(past)),
            use_cache=True,
            position_ids=torch.arange(offset, offset + width, device=device)[None],
        )
        if parts is None:
            raise ValueError("a shared prefix needs a decoder + output head model")
    if parts is not None:
        decoder, head = parts
        hidden = decoder(**kwargs).last_hidden_state  # [B, T, H]
        # the head in the weights' precision even under autocast (compute_precision): a bfloat16 logit of ~15
        # is off by up to 0.06, as much as the log-prob differences GRPO's ratio measures
        with torch.autocast(device.type, enabled=False):
            logits = head(hidden[batch["rows"], batch["cols"]].to(head.weight.dtype))  # [N, V]
    else:
        logits = model(**kwargs).logits[batch["rows"], batch["cols"]]
    logits = logits.float() * scale
    picked = logits.gather(-1, batch["targets"][:, None]).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


# --------------------------------------------------------------------------- shared prefixes
@dataclass
class Chunk:
    """A unit of forward work: ``batches`` (``pack`` micro-batches) that all continue ``prefix``
    (context ids, empty when nothing is shared); ``members`` indexes the planned sequences."""

    prefix: list[int]
    batches: list[dict[str, Any]]
    members: list[int]


def _context_head(seq: TokenSequence) -> int:
    """How many leading tokens are pure context: a shared prefix may take at most the tokens
    before the one that precedes the first sampled token (that one's hidden state predicts it)."""
    first = seq.mask.index(1) if 1 in seq.mask else len(seq.ids)
    return max(0, first - 1)


def plan(
    seqs: list[TokenSequence],
    pad_id: int,
    advantages: list[float] | None = None,
    *,
    micro_batch_size: int = 1,
    share_prefix: bool = True,
    min_prefix: int = 32,
    device: torch.device | str | None = None,
) -> list[Chunk]:
    """Chunks of forward work over ``seqs`` (see the module docstring).

    ``share_prefix``: sequences are sorted by their ids so that those with a common context
    prefix sit together, and a run of neighbours becomes one chunk while sharing pays: a
    sequence joins when ``(n - 1) x (P - p) <= p`` (the prefix P of the n members shrinks to p,
    which the others then recompute, against the p tokens the newcomer saves). Members are
    scored one at a time (no padding). Otherwise: micro-batches of ``micro_batch_size``
    sequences in the given order, no prefix. Batches are built on ``device`` (``pack``).
    """
    adv = advantages if advantages is not None else [0.0] * len(seqs)
    if not share_prefix:
        return [
            Chunk(
                [],
                [pack(seqs[i : i + micro_batch_size], pad_id, adv[i : i + micro_batch_size], device=device)],
                list(range(i, min(i + micro_batch_size, len(seqs)))),
            )
            for i in range(0, len(seqs), micro_batch_size)
        ]
    order = sorted(range(len(seqs)), key=lambda i: seqs[i].ids)
    groups: list[tuple[int, list[int]]] = []  # (prefix length, members)
    for i in order:
        head = _context_head(seqs[i])
        if groups:
            length, members = groups[-1]
            shared = min(length, head, common_length(seqs[members[-1]].ids, seqs[i].ids))
            if shared >= min_prefix and (len(members) - 1) * (length - shared) <= shared:
                groups[-1] = (shared, members + [i])
                continue
        groups.append((head, [i]))
    chunks = []
    for length, members in groups:
        if len(members) == 1 or length < min_prefix:  # nothing shared: the plain path
            length = 0
        prefix = seqs[members[0]].ids[:length]
        batches = [
            pack(
                [
                    TokenSequence(
                        ids=seqs[m].ids[length:], mask=seqs[m].mask[length:], logprobs=seqs[m].logprobs[length:]
                    )
                ],
                pad_id,
                [adv[m]],
                device=device,
            )
            for m in members
        ]
        chunks.append(Chunk(prefix, batches, members))
    return chunks


def computed_tokens(chunks: list[Chunk]) -> int:
    """Tokens the forward passes of ``chunks`` compute: each shared prefix once, every batch whole."""
    return sum(len(c.prefix) + sum(int(b["input_ids"].numel()) for b in c.batches) for c in chunks)


def causal_keys(start: int, end: int) -> int:
    """Keys that the tokens at positions ``start`` .. ``end - 1`` attend to under a causal mask
    (the one at position p reads p + 1)."""
    return (end * (end + 1) - start * (start + 1)) // 2


def attended_keys(chunks: list[Chunk]) -> int:
    """Keys the computed tokens of ``chunks`` attend to (causal: the token at position p reads
    p + 1): each shared prefix once, each batch's rows after their prefix, padding included (as
    ``computed_tokens``). Attention's work grows with it (``coevolve.bench.floor``)."""
    total = 0
    for c in chunks:
        p = len(c.prefix)
        total += causal_keys(0, p)
        for b in c.batches:
            rows, width = b["input_ids"].shape
            total += rows * causal_keys(p, p + width)
    return total


def forward_backward(
    model: torch.nn.Module,
    chunk: Chunk,
    temperature: float,
    loss_fn: Callable[[torch.Tensor, dict[str, Any]], torch.Tensor] | None,
) -> list[torch.Tensor]:
    """Score ``chunk`` and, with ``loss_fn(logp, batch) -> loss``, backpropagate each batch's
    loss (gradients accumulate in the parameters; the caller steps the optimizer). Returns the
    detached log-probs of each batch. Without ``loss_fn`` nothing keeps a graph (reference or
    evaluation scoring: call it under ``torch.no_grad()``)."""
    out: list[torch.Tensor] = []
    if not chunk.prefix:
        for batch in chunk.batches:
            logp = sampled_logprobs(model, batch, temperature)
            if loss_fn is not None:
                loss_fn(logp, batch).backward()
            out.append(logp.detach())
        return out
    parts = _decoder_and_head(model)
    if parts is None:
        raise ValueError("a shared prefix needs a decoder + output head model; plan with share_prefix=False")
    decoder = parts[0]
    prefix_ids = torch.tensor([chunk.prefix], device=model_device(model))
    cache = decoder(input_ids=prefix_ids, use_cache=True).past_key_values
    kv = [(layer.keys, layer.values) for layer in cache.layers]
    grads = loss_fn is not None and torch.is_grad_enabled()
    # members attach to leaf copies of the prefix's cache: their gradients gather there, and
    # flow through the prefix's graph once at the end
    leaves = [(k.detach().requires_grad_(grads), v.detach().requires_grad_(grads)) for k, v in kv]
    for batch in chunk.batches:
        logp = sampled_logprobs(model, batch, temperature, past=leaves)
        if loss_fn is not None:
            loss_fn(logp, batch).backward()
        out.append(logp.detach())
    if grads:
        pairs = [
            (t, leaf.grad)
            for (k, v), (lk, lv) in zip(kv, leaves)
            for t, leaf in ((k, lk), (v, lv))
            if leaf.grad is not None and t.requires_grad
        ]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    return out
