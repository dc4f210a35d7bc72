"""Prompt-lookup drafts (``coevolve.policy.decoder``): a step that verifies drafted tokens emits
what one token per step would (greedy: the same tokens; sampling: the same distribution), and
the KV of rejected drafts is never read again."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from coevolve.config import PolicyConfig
from coevolve.policy.base import SamplingParams
from coevolve.policy.decoder import accept_drafts, draft, sample_next
from coevolve.policy.local import LocalPolicy


def test_draft_is_what_followed_the_latest_earlier_occurrence_of_the_last_tokens():
    assert draft([1, 2, 3, 9, 9, 1, 2, 3, 7, 1, 2, 3], 4) == [7, 1, 2, 3]  # the latest "1 2 3", not the first
    assert draft([5, 1, 2, 8, 6, 2], 3) == [8, 6, 2]  # no earlier "8 6 2" nor "6 2": the last token alone
    assert draft([1, 2, 3, 4], 3) == []  # nothing repeats
    assert draft([4, 4], 2) == [4] and draft([4], 2) == [] and draft([1, 1, 1], 0) == []


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_tokens_are_the_same_with_drafts_kept_and_rejected(one_thread, dtype):
    """Prompts over 6 token ids: every lookup finds a match, and the model often disagrees with
    it, so steps keep some drafts and leave rejected ones in the cache (masked). The tokens are
    those of one token per step, in fewer steps; the KV cached for each finished answer (its
    rejected drafts left out) is the model's own on the prompt and answer.

    Exact equality needs matmuls whose rows do not depend on the batch (a step verifying drafts
    multiplies more rows at once): oneDNN's prepacked linear is such, in float32 everywhere and
    in bfloat16 on CPUs with native bf16; plain ``F.linear`` in bfloat16 elsewhere is not."""
    from coevolve.policy.local import cpu_has_native_bf16

    if dtype == "bfloat16" and not cpu_has_native_bf16():
        pytest.skip("bfloat16 without native bf16 (AVX2): its matmuls are not batch-invariant, near-ties flip")
    outs, stats, policies = {}, {}, {}
    for k in (0, 4):
        policy = policies[k] = LocalPolicy(
            PolicyConfig(model="tiny", max_context_tokens=1024, dtype=dtype, draft_tokens=k)
        )
        policy.stop_ids = set()
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, 9, (n,), generator=g).tolist() for n in (60, 25, 41, 33)]
        got = policy.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=40), [0, 1, 2, 3])
        outs[k], stats[k] = [ids for ids, _ in got], policy.stats
    assert outs[4] == outs[0]
    assert stats[0].drafted == 0 and stats[0].steps == 40
    assert 0 < stats[4].accepted < stats[4].drafted, "some drafts kept, some rejected"
    assert stats[4].steps < 30
    if dtype == "float32":
        policy = policies[4]
        for p, ids in zip(prompts, outs[4]):
            seq = p + ids[:-1]  # the last token is sampled, never fed
            n, kv = policy.prefix_cache.longest(seq + [0])
            assert n == len(seq)
            with torch.inference_mode():
                ref = policy.runner(input_ids=torch.tensor([seq]), use_cache=True).past_key_values.layers
            for (k, v), layer in zip(kv, ref):
                torch.testing.assert_close(k, layer.keys, rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(v, layer.values, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_kept_or_resampled_drafts_have_the_models_distribution(top_p):
    """Draft token 2 of a 5-token vocabulary, verified 20,000 times: the emitted token (the draft
    when kept, else a draw without it) is distributed as the model says (after top-p)."""
    sampling = SamplingParams(temperature=0.7, top_p=top_p)
    logits = torch.tensor([1.0, 0.2, 0.9, -1.0, 0.5])
    n = 20_000
    generators = [torch.Generator().manual_seed(i) for i in range(n)]
    verdicts = accept_drafts(logits.expand(n, 2, 5), [[2]] * n, sampling, generators)
    emitted = [2 if kept else None for kept, _ in verdicts]
    redo = [i for i, e in enumerate(emitted) if e is None]
    tokens, _ = sample_next(logits.expand(len(redo), 5), sampling, [generators[i] for i in redo], [2] * len(redo))
    for i, tok in zip(redo, tokens):
        emitted[i] = tok
    probs = torch.softmax(logits / 0.7, dim=-1)
    if top_p < 1.0:  # the smallest set reaching top_p: tokens 0, 2, 4 here
        probs = probs * torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])
        probs = probs / probs.sum()
    counts = Counter(emitted)
    for tok in range(5):
        assert abs(counts[tok] / n - float(probs[tok])) < 0.012, (tok, counts, probs)
    assert 2 not in tokens, "a rejected draft is never drawn right after"
    kept_logp = [lps[0] for kept, lps in verdicts if kept]
    assert kept_logp and all(lp == pytest.approx(float(torch.log_softmax(logits / 0.7, -1)[2])) for lp in kept_logp)


def test_a_row_whose_drafts_are_rejected_stops_drafting_for_a_while(one_thread, monkeypatch):
    """Drafts that never pay (always the same tokens, which a sampling model rejects) cost each
    row a few verifying steps, then pauses of ``_DRAFT_PAUSE`` steps with one try between them."""
    from coevolve.policy import decoder

    monkeypatch.setattr(decoder, "draft", lambda ids, k: [3] * k)
    policy = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024, draft_tokens=4))
    policy.stop_ids = set()
    prompts = [list(range(10, 10 + n)) for n in (30, 20, 40, 25)]
    policy.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=60), [0, 1, 2, 3])
    stats = policy.stats
    assert stats.accepted <= 2 and stats.steps == 60
    # per row: 4 drafting steps until the average falls under the bar, then one in every 9
    assert 4 * 4 * 4 <= stats.drafted <= 4 * 4 * (4 + 6)


def test_a_draft_rejected_by_rounding_alone_is_still_drawn_when_it_held_all_the_mass():
    """After top-p only the draft is left; a rejection there can only come from float rounding,
    and the draw without it must not fall off the end of the vocabulary."""
    sampling = SamplingParams(temperature=1.0, top_p=0.5)
    logits = torch.tensor([[9.0, 0.0, 0.0, 0.0]])
    tokens, _ = sample_next(logits, sampling, [torch.Generator().manual_seed(0)], exclude=[0])
    assert tokens == [0]
    tokens, _ = sample_next(logits, SamplingParams(temperature=1.0), [torch.Generator().manual_seed(0)], exclude=[0])
    assert tokens[0] in (1, 2, 3)
