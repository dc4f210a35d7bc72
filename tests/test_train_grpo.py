"""GRPO's tensor functions: advantages, clipped loss (per sequence and flat), KL."""

from __future__ import annotations

import pytest
import torch

from coevolve.train.grpo import clipped_pg_loss, group_advantages, kl_penalty, masked_mean


def test_group_advantages_normalize_within_each_group():
    adv = group_advantages([1.0, 0.0, 1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b", "c", "c"])
    assert adv[:4].tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-3)
    # a group with one outcome teaches nothing: zeros, not noise from a zero std
    assert adv[4:].tolist() == [0.0, 0.0]
    unscaled = group_advantages([1.0, 0.0, 0.0, 0.0], ["a"] * 4, scale=False)
    assert unscaled.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_clipped_loss_ignores_masked_tokens_and_clips_the_ratio():
    old = torch.zeros(2, 4)
    logp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]])
    adv = torch.tensor([1.0, -1.0])
    loss, stats = clipped_pg_loss(logp, old, adv, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(0.0)  # ratio 1: -(+1 -1 -1 +1)... = mean(-A) = 0
    loss.backward()
    grad = logp.grad
    assert (grad[mask == 0] == 0).all()  # prompts and observations get no gradient
    assert (grad[0][mask[0] == 1] < 0).all() and (grad[1][mask[1] == 1] > 0).all()
    # beyond the clip range with a positive advantage the gradient vanishes
    far = torch.full((1, 2), 1.0, requires_grad=True)
    loss2, stats2 = clipped_pg_loss(far, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), clip_eps=0.2)
    loss2.backward()
    assert far.grad.abs().sum() == 0 and stats2["clip_frac"] == 1.0
    assert stats["clip_frac"] == 0.0 and stats["ratio"] == pytest.approx(1.0)


def test_kl_is_zero_at_the_reference_and_positive_elsewhere():
    mask = torch.ones(1, 3)
    same = torch.tensor([[-1.0, -2.0, -0.5]])
    assert kl_penalty(same, same, mask).item() == pytest.approx(0.0)
    assert kl_penalty(same + 0.3, same, mask).item() > 0


def test_denominator_makes_micro_batches_sum_to_the_batch_mean():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1, 0], [1, 1]]).float()
    whole = masked_mean(values, mask)
    parts = masked_mean(values[:1], mask[:1], denom=3.0) + masked_mean(values[1:], mask[1:], denom=3.0)
    assert whole.item() == pytest.approx(parts.item()) == pytest.approx(8 / 3)


def test_flat_tokens_take_one_advantage_each():
    logp = torch.zeros(3, requires_grad=True)
    loss, _ = clipped_pg_loss(logp, torch.zeros(3), torch.tensor([1.0, 1.0, -1.0]), torch.ones(3), clip_eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-1 / 3) and logp.grad.tolist() == pytest.approx([-1 / 3, -1 / 3, 1 / 3])
