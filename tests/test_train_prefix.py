"""Shared-prefix scoring (``coevolve.train.scoring.plan`` / ``forward_backward``) gives the
same log-probs and the same gradients as scoring every sequence whole, and groups what it
should: a GRPO group's episodes open with the same prompt, so they share it."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from coevolve.policy.models import resolve_model
from coevolve.train.local import attach_lora
from coevolve.train.scoring import attended_keys, causal_keys, computed_tokens, forward_backward, plan
from coevolve.train.sequences import TokenSequence


def _sequences(seed: int = 0) -> list[TokenSequence]:
    """Two 'tasks' with a common system prompt and their own user message, three episodes each
    that diverge after the prompt, plus one unrelated sequence."""
    rng = random.Random(seed)
    system = [rng.randrange(5, 200) for _ in range(60)]
    seqs = []
    for task in range(2):
        user = [rng.randrange(5, 200) for _ in range(10 + task)]
        for _ in range(3):
            answer = [rng.randrange(5, 200) for _ in range(rng.randrange(6, 14))]
            obs = [rng.randrange(5, 200) for _ in range(5)]
            again = [rng.randrange(5, 200) for _ in range(4)]
            ids = system + user + answer + obs + again
            mask = [0] * len(system + user) + [1] * len(answer) + [0] * len(obs) + [1] * len(again)
            seqs.append(TokenSequence(ids=ids, mask=mask, logprobs=[-1.0] * len(ids)))
    other = [rng.randrange(5, 200) for _ in range(40)]
    seqs.append(TokenSequence(ids=other, mask=[0] * 30 + [1] * 10, logprobs=[-1.0] * 40))
    return seqs


def _grads(model: torch.nn.Module, share: bool, seqs: list[TokenSequence], advs: list[float]):
    model.zero_grad(set_to_none=True)
    chunks = plan(seqs, 0, advs, micro_batch_size=1, share_prefix=share, min_prefix=16)
    logps = {}
    for chunk in chunks:
        out = forward_backward(model, chunk, 1.0, lambda lp, b: -(lp * b["adv"]).sum())
        logps.update({m: lp for m, lp in zip(chunk.members, out)})
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return chunks, logps, grads


@pytest.mark.parametrize("lora", [False, True])
def test_shared_prefix_matches_whole_sequences(lora: bool) -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"))
    if lora:
        model = attach_lora(model, 4, 8)
        for n, p in model.named_parameters():  # B starts at zero: give the adapters a value
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.05)
    model.eval()
    seqs = _sequences()
    advs = [0.5, -1.0, 0.3, 1.0, -0.2, 0.8, 0.4]
    plain_chunks, plain_logp, plain_grads = _grads(model, False, seqs, advs)
    shared_chunks, shared_logp, shared_grads = _grads(model, True, seqs, advs)

    # one chunk holds the six episodes of the two tasks; the unrelated sequence stands alone
    assert sorted(len(c.members) for c in shared_chunks) == [1, 6]
    assert [len(c.prefix) for c in shared_chunks if len(c.members) == 6] == [60]
    assert all(not c.prefix for c in plain_chunks)
    for m in range(len(seqs)):
        torch.testing.assert_close(shared_logp[m], plain_logp[m], rtol=1e-4, atol=1e-5)
    assert plain_grads.keys() == shared_grads.keys() and plain_grads
    for name, g in plain_grads.items():
        torch.testing.assert_close(shared_grads[name], g, rtol=1e-3, atol=1e-6, msg=name)


def test_a_group_shares_its_prompt_up_to_the_first_sampled_token() -> None:
    prompt = list(range(10, 50))
    seqs = [
        TokenSequence(ids=prompt + [60 + k, 61, 62], mask=[0] * 40 + [1] * 3, logprobs=[0.0] * 43) for k in range(4)
    ]
    (chunk,) = plan(seqs, 0, None, share_prefix=True, min_prefix=16)
    # the token before the first sampled one predicts it: it stays with the members
    assert len(chunk.prefix) == 39 and chunk.prefix == prompt[:39]
    assert [b["targets"].tolist() for b in chunk.batches] == [[60 + k, 61, 62] for k in range(4)]


def test_attended_keys_count_each_computed_token_once_at_its_position() -> None:
    assert causal_keys(0, 3) == 1 + 2 + 3 and causal_keys(2, 4) == 3 + 4 and causal_keys(5, 5) == 0
    prompt = list(range(10, 50))
    seqs = [
        TokenSequence(ids=prompt + [60 + k] * (2 + k), mask=[0] * 40 + [1] * (2 + k), logprobs=[0.0] * (42 + k))
        for k in range(3)
    ]
    (chunk,) = plan(seqs, 0, None, share_prefix=True, min_prefix=16)
    # the 39-token prefix once (positions 0-38), then each member's 3, 4 and 5 tokens from position 39
    want = causal_keys(0, 39) + causal_keys(39, 42) + causal_keys(39, 43) + causal_keys(39, 44)
    assert attended_keys([chunk]) == want and computed_tokens([chunk]) == 39 + 3 + 4 + 5
    # whole sequences, padded to the longest in one micro-batch: every row computes 44 positions
    (whole,) = plan(seqs, 0, None, share_prefix=False, micro_batch_size=3)
    assert attended_keys([whole]) == 3 * causal_keys(0, 44) > want
