"""``coevolve bench sft``: does a short LoRA SFT warm start teach a model tool calls?

    coevolve bench sft                      # SmolLM2, 30 LoRA SFT steps, 12 held-out first turns
    r = sft_probe("tiny", sft_steps=2, n_train=2, n_heldout=2)   # {"before", "after", "sft_seconds", ...}

First-call quality (a well-formed call, of an offered function, of the reference's function) on
held-out single-turn tasks synthesized on other scenarios (greedy), before and after LoRA SFT on
the reference trajectories of synthesized tasks (``coevolve.train.probe``; BFCL's questions and
answers are never read).
"""

from __future__ import annotations

import time
from typing import Any

import torch


def single_turn_tasks(tasks: list) -> list:
    """Tasks reduced to their first turn (with that turn's reference calls)."""
    from coevolve.tasks import Task

    out = []
    for t in tasks:
        if t.turns and t.turns[0] and t.reference_actions and t.reference_actions[0]:
            out.append(
                Task(
                    task_id=f"{t.task_id}-turn0",
                    env=t.env,
                    turns=[t.turns[0]],
                    initial_state=t.initial_state,
                    reference_actions=[t.reference_actions[0]],
                    tools=t.tools,
                    category=t.category,
                    split=t.split,
                    origin=t.origin,
                )
            )
    return out


def first_call_quality(policy, env, tasks: list, *, max_new_tokens: int) -> dict:
    """Greedy first model message of each task: share that is a well-formed call (``parsed``),
    names a function the task offers (``valid``), and names the reference's first function (``correct``)."""
    from coevolve.policy.base import SamplingParams
    from coevolve.rollout import run_episodes

    results = run_episodes(
        policy,
        env,
        tasks,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens),
        step_limit=1,
        phase="eval",
        run_id="bench-sft",
        round_no=0,
        batch_size=4,
    )
    parsed = valid = correct = 0
    for task, r in zip(tasks, results):
        first = r.steps[0] if r.steps else {}
        offered = {tool.get("function", tool)["name"] for tool in env.episode(task).tools(0)}
        name = first.get("action_name")
        parsed += bool(name) and not first.get("parse_error")
        valid += name in offered
        correct += name == task.reference_actions[0][0]["name"]
    n = max(1, len(tasks))
    return {"parsed": parsed / n, "valid": valid / n, "correct": correct / n, "n": len(tasks)}


def sft_probe(
    model_name: str = "smollm2",
    *,
    sft_steps: int = 30,
    n_train: int = 24,
    n_heldout: int = 12,
    batch: int = 2,
    lr: float = 5e-4,
    max_tokens: int = 1536,
    seed: int = 0,
) -> dict:
    """Does a short LoRA SFT warm start teach ``model_name`` tool calls?

    SFT on the reference trajectories of up to ``n_train`` synthesized tasks (round 0's seed pool
    for ``seed``: ``coevolve.train.probe``) of half of its scenarios, then the first-call quality
    on up to ``n_heldout`` first turns of tasks on the other scenarios; returns
    ``{"before", "after", "sft_seconds", "losses"}``. BFCL's questions and answers are never read.
    """
    from coevolve.config import PolicyConfig
    from coevolve.policy import load_policy
    from coevolve.registry import resolve
    from coevolve.train.local import attach_lora, encode_result
    from coevolve.train.probe import split_by_scenario, synthesized_tasks
    from coevolve.train.sft import reference_chats, run_sft

    env = resolve("environment", "bfcl-v3")()
    train, other = split_by_scenario(synthesized_tasks(seed), 0.5)
    train, heldout = train[:n_train], single_turn_tasks(other)[:n_heldout]
    pcfg = PolicyConfig(model=model_name, tool_format="compact", max_context_tokens=max_tokens, max_new_tokens=64)
    policy: Any = load_policy(pcfg)  # a LocalPolicy (backend 'local')
    before = first_call_quality(policy, env, heldout, max_new_tokens=64)
    model = attach_lora(policy.model, 16, 32)
    episodes = reference_chats(env, train, step_limit=4, seed=seed)
    examples = [encode_result(policy.tokenizer, e, pcfg.tool_format, max_tokens) for e in episodes]
    torch.manual_seed(seed)
    started = time.perf_counter()
    losses = run_sft(model, policy.tokenizer, examples, steps=sft_steps, batch_size=batch, lr=lr, seed=seed)
    seconds = time.perf_counter() - started
    policy.prefix_cache.clear()
    after = first_call_quality(policy, env, heldout, max_new_tokens=64)
    return {
        "before": before,
        "after": after,
        "sft_seconds": seconds,
        "losses": losses,
        "n_examples": len(examples),
        "mean_tokens": sum(len(i) for i, _ in examples) / max(1, len(examples)),
    }
