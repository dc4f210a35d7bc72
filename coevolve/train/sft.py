"""SFT warm start: teach the policy the tool-call format from the pool's reference trajectories.

Its data is the pool's own validated tasks only (``warm_start_tasks``: split ``train``):
round 0 synthesized them by exploring training-scenario states, so their reference calls
came from exploration, not from benchmark ground truth. Benchmark entries load with split
``heldout`` and are refused.

The trajectories are real episodes: ``ReplayPolicy`` plays each task's reference calls
through the rollout engine against the environment, so the chats hold the environment's
actual observations and exactly the message shapes the engine produces (all of a turn's
calls in one assistant message, then a plain message that ends the turn). The loss is the
negative log-likelihood of the assistant tokens only (``sequences.encode_chat`` masks).

    episodes = reference_chats(env, tasks, step_limit=..., seed=...)
    examples = [encode_result(tokenizer, e, tool_format, max_tokens) for e in episodes]  # coevolve.train.local
    losses = run_sft(model, tokenizer, examples, steps=..., batch_size=..., lr=..., seed=...)
"""

from __future__ import annotations

import random
from typing import Any, Callable

import torch

from coevolve.policy.base import SamplingParams
from coevolve.tasks import Task
from coevolve.train.scoring import compute_precision, forward_backward, model_device, plan
from coevolve.train.sequences import TokenSequence


def warm_start_tasks(tasks: list[Task]) -> list[Task]:
    """The tasks SFT may imitate: the pool's validated training tasks (split ``train``); a
    benchmark entry (split ``heldout``) never qualifies. Raises if none of ``tasks`` does."""
    chosen = [t for t in tasks if t.split == "train"]
    if tasks and not chosen:
        raise ValueError(
            "SFT warm start: none of the tasks is a pool training task (split 'train'); the warm start "
            "imitates only the pool's own validated tasks, never benchmark ground truth"
        )
    return chosen


def reference_chats(env: Any, tasks: list[Task], *, step_limit: int, seed: int) -> list[Any]:
    """The episodes (rollout ``EpisodeResult``s) of replaying the reference calls of each of
    ``warm_start_tasks(tasks)``; tasks whose replay does not succeed (a broken reference would
    teach wrong calls) are left out."""
    from coevolve.policy.replay import ReplayPolicy
    from coevolve.rollout import run_episodes

    tasks = warm_start_tasks(tasks)

    # the replay sends a turn's calls in one message; the engine must let all of them run
    longest = max((len(calls) for t in tasks for calls in t.reference_actions), default=0)

    results = run_episodes(
        ReplayPolicy(tasks),
        env,
        tasks,
        n_samples=1,
        sampling=SamplingParams(temperature=0.0),
        step_limit=max(step_limit, longest + 1),
        phase="train",
        run_id="sft",
        round_no=0,
        seed=seed,
    )
    return [r for r in results if r.score.success]


def run_sft(
    model: torch.nn.Module,
    tokenizer: Any,
    examples: list[tuple[list[int], list[int]]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    micro_batch_size: int | None = None,
    share_prefix: bool = True,
    dtype: torch.dtype = torch.float32,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """``steps`` optimizer steps of masked NLL on ``examples`` (``(ids, mask)`` pairs from
    ``encode_chat``, cycled in a seeded shuffle, ``batch_size`` per step; examples of a batch that
    share their prompt's head have it computed once (``share_prefix``), others are scored
    ``micro_batch_size`` at a time, gradients accumulated), computing in ``dtype`` over float32
    weights (``scoring.compute_precision``). ``on_step(step, loss)`` is called after each optimizer
    step (1-based; progress display). Returns each step's loss."""
    examples = [e for e in examples if sum(e[1]) > 0]
    if steps <= 0 or not examples:
        return []
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    micro = micro_batch_size or batch_size
    rng = random.Random(seed)
    order: list[int] = []
    losses = []
    model.train()
    for _ in range(steps):
        chosen: list[tuple[list[int], list[int]]] = []
        while len(chosen) < min(batch_size, len(examples)):
            if not order:
                order = list(range(len(examples)))
                rng.shuffle(order)
            chosen.append(examples[order.pop()])
        n_tokens = float(sum(sum(m) for _, m in chosen))
        optimizer.zero_grad(set_to_none=True)
        total = 0.0

        def nll(logp: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
            nonlocal total
            loss = -logp.sum() / n_tokens
            total += loss.item()
            return loss

        seqs = [TokenSequence(ids=ids, mask=mask, logprobs=[0.0] * len(ids)) for ids, mask in chosen]
        # log-probs at the assistant tokens only: the output head never sees the prompts
        chunks = plan(seqs, pad, None, micro_batch_size=micro, share_prefix=share_prefix, device=model_device(model))
        with compute_precision(dtype, model):
            for chunk in chunks:
                forward_backward(model, chunk, 1.0, nll)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(total)
        if on_step:
            on_step(len(losses), total)
    model.eval()
    return losses
