"""Throughput of the local trainer's update step, for ``coevolve bench train``.

One measured step is exactly what ``GrpoTrainer.update`` does per micro-batch: forward,
token log-probs, the clipped policy-gradient loss on the assistant tokens (half of each
sequence here), backward, gradient clipping and an AdamW step.
"""

from __future__ import annotations

import time

import torch

from coevolve.train.grpo import clipped_pg_loss, token_logprobs


def measure_update(model_name: str, *, lora: bool, steps: int, batch: int, seq_len: int, seed: int = 0) -> dict:
    """Time ``steps`` update steps (after one warm-up) of ``batch`` x ``seq_len`` tokens.

    Returns ``{"seconds_per_step", "tokens_per_second", "trainable"}``.
    """
    from transformers import AutoModelForCausalLM

    from coevolve.policy.models import resolve_model
    from coevolve.train.local import attach_lora

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(model_name))
    if lora:
        model = attach_lora(model, 16, 32)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    vocab = model.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (batch, seq_len))
    mask = torch.zeros(batch, seq_len)
    mask[:, seq_len // 2 :] = 1.0  # the assistant's half: prompts are masked as in training
    adv = torch.linspace(-1.0, 1.0, batch)
    model.train()
    times = []
    for i in range(steps + 1):
        started = time.perf_counter()
        logp = token_logprobs(model(input_ids=ids).logits, ids)
        loss, _ = clipped_pg_loss(logp, logp.detach(), adv, mask, 0.2)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if i:  # the first step pays for allocation and kernel selection
            times.append(time.perf_counter() - started)
    per_step = sum(times) / len(times)
    return {
        "seconds_per_step": per_step,
        "tokens_per_second": batch * seq_len / per_step,
        "trainable": sum(p.numel() for p in params),
    }


def single_turn_tasks(tasks: list) -> list:
    """BFCL-derived single-call tasks: each entry's first turn, with that turn's reference calls."""
    from coevolve.tasks import Task

    out = []
    for t in tasks:
        if t.turns and t.turns[0] and t.reference_actions and t.reference_actions[0]:
            out.append(Task(task_id=f"{t.task_id}-turn0", env=t.env, turns=[t.turns[0]], initial_state=t.initial_state,
                            reference_actions=[t.reference_actions[0]], tools=t.tools, category=t.category))
    return out


def first_call_quality(policy, env, tasks: list, *, max_new_tokens: int) -> dict:
    """Greedy first model message of each task: share that is a well-formed call (``parsed``),
    names a function the task offers (``valid``), and names the reference's first function (``correct``)."""
    from coevolve.policy.base import SamplingParams
    from coevolve.rollout import run_episodes

    results = run_episodes(policy, env, tasks, sampling=SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens),
                           step_limit=1, phase="eval", run_id="bench-sft", round=0, batch_size=4)
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


def sft_probe(model_name: str = "smollm2", *, sft_steps: int = 30, n_train: int = 24, n_heldout: int = 12,
              batch: int = 2, lr: float = 5e-4, max_tokens: int = 1536, seed: int = 0) -> dict:
    """Does a short LoRA SFT warm start teach ``model_name`` BFCL tool calls?

    SFT on the reference trajectories of the first ``n_train`` BFCL-derived single-turn tasks
    (multi_turn_base entries), then the first-call quality on the next ``n_heldout`` (other
    entries); returns ``{"before", "after", "sft_seconds", "losses"}``.
    """
    from coevolve.config import PolicyConfig
    from coevolve.policy import load_policy
    from coevolve.registry import resolve
    from coevolve.train.local import attach_lora, encode_result
    from coevolve.train.sft import reference_chats, run_sft

    env = resolve("environment", "bfcl-v3")()
    tasks = single_turn_tasks(env.load_tasks(categories=["multi_turn_base"]))
    train, heldout = tasks[:n_train], tasks[n_train : n_train + n_heldout]
    pcfg = PolicyConfig(model=model_name, tool_format="compact", max_context_tokens=max_tokens, max_new_tokens=64)
    policy = load_policy(pcfg)
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
    return {"before": before, "after": after, "sft_seconds": seconds, "losses": losses,
            "n_examples": len(examples), "mean_tokens": sum(len(i) for i, _ in examples) / max(1, len(examples))}
