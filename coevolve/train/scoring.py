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
"""

from __future__ import annotations

from typing import Any

import torch

from coevolve.train.sequences import TokenSequence


def pack(seqs: list[TokenSequence], pad_id: int, advantages: list[float] | None = None) -> dict[str, Any]:
    """Right-pad ``seqs`` into ``input_ids`` [B, T] (``attention_mask`` [B, T] only when lengths
    differ: an unpadded batch takes the causal fast path) and flatten what the loss needs over
    the N sampled tokens: ``rows``, ``cols`` [N] (the predicting position: ``cols + 1`` is the
    sampled token), ``targets`` [N], ``old_logp`` [N] float32 and ``adv`` [N] (each sequence's
    advantage, 0 when ``advantages`` is None)."""
    width = max(len(s.ids) for s in seqs)
    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    padded = any(len(s.ids) != width for s in seqs)
    attention = torch.zeros((len(seqs), width), dtype=torch.long) if padded else None
    rows, cols, old, adv = [], [], [], []
    for b, s in enumerate(seqs):
        input_ids[b, : len(s.ids)] = torch.tensor(s.ids, dtype=torch.long)
        if attention is not None:
            attention[b, : len(s.ids)] = 1
        for t in range(1, len(s.ids)):  # nothing predicts the first token
            if s.mask[t]:
                rows.append(b)
                cols.append(t - 1)
                old.append(s.logprobs[t])
                adv.append(advantages[b] if advantages is not None else 0.0)
    rows_t, cols_t = torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)
    return {
        "input_ids": input_ids, "attention_mask": attention, "rows": rows_t, "cols": cols_t,
        "targets": input_ids[rows_t, cols_t + 1], "old_logp": torch.tensor(old, dtype=torch.float32),
        "adv": torch.tensor(adv, dtype=torch.float32),
        "n_tokens": sum(len(s.ids) for s in seqs),
    }


def _decoder_and_head(model: torch.nn.Module) -> tuple[Any, Any] | None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(getattr(base, "config", None), "final_logit_softcapping", None):
        return None
    get_decoder, get_head = getattr(base, "get_decoder", None), getattr(base, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or decoder is base or not isinstance(head, torch.nn.Linear):
        return None
    return decoder, head


def sampled_logprobs(model: torch.nn.Module, batch: dict[str, Any], temperature: float = 1.0) -> torch.Tensor:
    """log p(target) of each sampled token of ``batch`` (``pack``) under ``model``: [N] float32.

    Scored on ``logits / temperature`` (1 when ``temperature`` <= 0), as the sampler recorded
    its behaviour log-probs (``coevolve.policy.local.sample_next``).
    """
    scale = 1.0 / temperature if temperature > 0 else 1.0
    parts = _decoder_and_head(model)
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "use_cache": False}
    if parts is not None:
        decoder, head = parts
        hidden = decoder(**kwargs).last_hidden_state  # [B, T, H]
        logits = head(hidden[batch["rows"], batch["cols"]])  # [N, V]
    else:
        logits = model(**kwargs).logits[batch["rows"], batch["cols"]]
    logits = logits.float() * scale
    picked = logits.gather(-1, batch["targets"][:, None]).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
