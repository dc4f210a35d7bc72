"""GRPO's pure pieces: group-normalized advantages, the clipped policy-gradient loss and
the KL penalty, each a function of tensors (log-probs come from ``coevolve.train.scoring``).

Shapes use B = sequences in a micro-batch, T = tokens per sequence (right-padded), and
``mask[b, t] = 1`` where token ``t`` of sequence ``b`` was written by the model (an
assistant token); prompts, tool observations and padding are 0. Log-prob tensors are
aligned with the *predicted* token: ``logp[b, t]`` is log p(ids[b, t] | ids[b, :t]), and
``logp[b, 0]`` is 0 (nothing predicts the first token), so one mask serves everything.

The multi-turn loop that produces these tensors lives in ``coevolve.train.local``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(
    rewards: Sequence[float], groups: Sequence[object], *, scale: bool = True, eps: float = 1e-4
) -> torch.Tensor:
    """Advantage of each episode relative to the other samples of its task.

    ``rewards``: [N] episode rewards; ``groups``: [N] group keys (the task of each episode).
    Returns [N] float32: ``(r - mean_g)``, divided by the group's std when ``scale`` (the
    GRPO normalization). A group whose rewards are all equal gets zeros: it carries no
    learning signal, and dividing by a zero std must not turn it into noise.
    """
    r = torch.tensor([float(x) for x in rewards], dtype=torch.float32)
    out = torch.zeros_like(r)
    index: dict[object, list[int]] = {}
    for i, g in enumerate(groups):
        index.setdefault(g, []).append(i)
    for members in index.values():
        idx = torch.tensor(members)
        vals = r[idx]
        centred = vals - vals.mean()
        if scale:
            std = vals.std(unbiased=False)
            centred = centred / (std + eps) if std > eps else torch.zeros_like(centred)
        out[idx] = centred
    return out


def masked_mean(values: torch.Tensor, mask: torch.Tensor, denom: float | None = None) -> torch.Tensor:
    """Sum of ``values * mask`` over all elements divided by ``denom`` (default: the mask's sum).

    Passing ``denom`` (the token count of the whole accumulated batch) makes micro-batch
    losses add up to the token mean of the full batch under gradient accumulation.
    """
    total = (values * mask).sum()
    return total / (denom if denom is not None else mask.sum().clamp(min=1.0))


def clipped_pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    denom: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate on assistant tokens, averaged per token.

    ``logp`` [B, T] (with grad), ``old_logp`` [B, T] (the behaviour policy's log-probs recorded
    at sampling time, no grad), ``advantages`` [B] (one per sequence, broadcast over its
    tokens) or [B, T], ``mask`` [B, T]. Flat [N] tensors of sampled tokens work the same way
    (``advantages`` [N]).
    Returns the scalar loss to minimize and stats: ``clip_frac`` (share of tokens whose
    ratio was clipped) and ``ratio`` (mean policy ratio).
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.to(logp.dtype)
    if adv.shape != logp.shape:
        adv = adv.unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    loss = masked_mean(-torch.minimum(unclipped, clipped), mask, denom)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        clip_frac = (((ratio - 1.0).abs() > clip_eps).to(mask.dtype) * mask).sum() / n
        mean_ratio = (ratio * mask).sum() / n
    return loss, {"clip_frac": float(clip_frac), "ratio": float(mean_ratio)}


def kl_penalty(
    logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, denom: float | None = None
) -> torch.Tensor:
    """Per-token KL(policy || reference) with the low-variance k3 estimator, token mean.

    ``logp``, ``ref_logp``, ``mask``: [B, T]. k3 = exp(ref - logp) - (ref - logp) - 1 is
    non-negative and unbiased for samples drawn from the policy.
    """
    delta = ref_logp - logp
    k3 = torch.exp(delta) - delta - 1.0
    return masked_mean(k3, mask.to(logp.dtype), denom)
