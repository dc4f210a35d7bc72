"""The local trainer: SFT warm start + multi-turn GRPO with torch, transformers and peft.

One round (``train_local``):

1. load the round's starting policy (``policy_in``) and, if ``train.lora``, wrap it with
   peft LoRA adapters (the adapters train; the base stays frozen and doubles as the KL
   reference, with the adapters switched off);
2. optional SFT warm start on the pool's reference trajectories (``coevolve.train.sft``);
3. ``train.steps`` GRPO steps: take ``tasks_per_step`` tasks (a seeded shuffle, cycled; a
   full pass is an epoch), sample ``group_size`` episodes of each through the rollout engine
   (same initial state per group), write every step of them to ``rollouts`` (phase train,
   part ``<run_id>-train-s<step>``: a rerun overwrites), normalize the episode rewards within
   each group, and take one optimizer step of the clipped policy-gradient loss (+ KL) on
   the assistant tokens, accumulated over micro-batches of ``micro_batch_size`` sequences;
4. merge the adapters and save a Hugging Face checkpoint (weights + tokenizer) to
   ``<checkpoint_dir>/<run_id>/round-<round>``.

The sampling policy and the trained model are the same object, so every step is on-policy:
the "old" log-probs of the ratio are the current ones, detached.
"""

from __future__ import annotations

import copy
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from coevolve.policy.base import SamplingParams
from coevolve.registry import resolve
from coevolve.tasks import Task
from coevolve.train import TrainResult, checkpoint_path
from coevolve.train.grpo import clipped_pg_loss, group_advantages, kl_penalty, token_logprobs
from coevolve.train.sequences import collate, encode_chat, wire_renderer


@dataclass
class StepStats:
    step: int
    epoch: int
    n_episodes: int
    mean_reward: float
    success_rate: float
    loss: float
    n_tokens: int  # tokens in the step's training sequences
    seconds: float
    extra: dict[str, float] = field(default_factory=dict)


def attach_lora(model: torch.nn.Module, r: int, alpha: int) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters on every linear projection of its blocks (peft).

    peft injects the adapters into the model's own modules, so the object the policy
    generates with now runs through them too. Returns the ``PeftModel``.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def encode_result(tokenizer: Any, result: Any, tool_format: str, max_tokens: int) -> tuple[list[int], list[int]]:
    """``(ids, mask)`` of an episode (a rollout ``EpisodeResult``), rendered as the policy prompts it.

    One tool block per episode (the last turn's, ``result.tools``) keeps every prefix rendering
    the same; BFCL only ever adds functions at later turns, so an early step is trained with a
    few more functions listed than it saw.
    """
    render = wire_renderer(tokenizer, result.tools, tool_format)
    return encode_chat(tokenizer, result.messages, render, max_tokens)


def _task_batches(tasks: list[Task], per_step: int, seed: int):
    """Yield ``(epoch, tasks)`` forever: a seeded shuffle of ``tasks``, cycled, ``per_step`` at a time."""
    rng = random.Random(seed)
    order: list[Task] = []
    epoch = -1
    while True:
        batch = []
        while len(batch) < min(per_step, len(tasks)):
            if not order:
                order = list(tasks)
                rng.shuffle(order)
                epoch += 1
            batch.append(order.pop())
        yield epoch, batch


class GrpoTrainer:
    """The model, optimizer and LR schedule of one round: ``rollouts`` samples a step's groups,
    ``update`` takes the step's optimizer step on them."""

    def __init__(
        self,
        policy: Any,
        env: Any,
        cfg: Any,
        model: torch.nn.Module,
        ref_model: torch.nn.Module | None,
    ):
        from transformers import get_scheduler

        self.policy, self.env, self.cfg = policy, env, cfg
        self.model, self.tokenizer = model, policy.tokenizer  # model: the PeftModel with LoRA, else policy.model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ref_model = ref_model  # frozen copy for full fine-tuning with KL; LoRA disables its adapters instead
        t = cfg.train
        self.optimizer = torch.optim.AdamW(self.params, lr=t.lr, weight_decay=0.0)
        self.scheduler = get_scheduler(
            t.lr_scheduler, self.optimizer, num_warmup_steps=t.warmup_steps, num_training_steps=max(t.steps, 1)
        )
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id

    def rollouts(self, tasks: list[Task], *, run_id: str, round: int, step: int, epoch: int, seed: int) -> list[Any]:
        from coevolve.rollout import run_episodes

        p, t = self.cfg.policy, self.cfg.train
        self.model.eval()
        return run_episodes(
            self.policy,
            self.env,
            tasks,
            n_samples=t.group_size,
            sampling=SamplingParams(
                temperature=p.temperature, top_p=p.top_p, max_new_tokens=p.max_new_tokens, seed=seed
            ),
            step_limit=self.cfg.env.step_limit,
            phase="train",
            run_id=run_id,
            round=round,
            train_step=step,
            epoch=epoch,
            batch_size=p.batch_size,
            seed=seed,
        )

    def _ref_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            if hasattr(self.model, "disable_adapter"):  # LoRA: the base model is the reference
                with self.model.disable_adapter():
                    logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            else:
                logits = self.ref_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return token_logprobs(logits, batch["input_ids"])

    def update(self, results: list[Any]) -> dict[str, float]:
        """One optimizer step of GRPO on ``results`` (EpisodeResults of whole groups)."""
        t = self.cfg.train
        adv = group_advantages([r.score.reward for r in results], [r.task_id for r in results])
        # groups with one outcome have zero advantage everywhere: no gradient, skip the compute
        keep = [i for i in range(len(results)) if adv[i] != 0]
        stats = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "n_tokens": 0, "n_trained": len(keep)}
        if not keep:  # no optimizer step, so the schedule (counted in optimizer steps) waits too
            return stats
        fmt = self.cfg.policy.tool_format
        examples = [encode_result(self.tokenizer, results[i], fmt, t.max_seq_tokens) for i in keep]
        total_tokens = float(sum(sum(m) for _, m in examples)) or 1.0
        stats["n_tokens"] = sum(len(ids) for ids, _ in examples)
        size = t.micro_batch_size
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        for start in range(0, len(examples), size):
            part = examples[start : start + size]
            batch = collate(part, self.pad_id)
            a = adv[torch.tensor(keep[start : start + size])]
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            logp = token_logprobs(logits, batch["input_ids"])
            loss, info = clipped_pg_loss(logp, logp.detach(), a, batch["loss_mask"], t.clip_eps, denom=total_tokens)
            if t.kl_coef > 0:
                kl = kl_penalty(logp, self._ref_logprobs(batch), batch["loss_mask"], denom=total_tokens)
                loss = loss + t.kl_coef * kl
                stats["kl"] += kl.item()
            loss.backward()
            stats["loss"] += loss.item()
            stats["clip_frac"] = max(stats["clip_frac"], info["clip_frac"])
        torch.nn.utils.clip_grad_norm_(self.params, t.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.model.eval()
        # the policy caches prompt-prefix KV across calls; those keys came from the old weights
        self.policy.prefix_cache.clear()
        return stats


def save_checkpoint(model: Any, tokenizer: Any, path: str) -> str:
    """Save ``model`` (LoRA adapters merged in) and ``tokenizer`` as a Hugging Face directory,
    atomically: written next to ``path`` and renamed, so a crash never leaves half a checkpoint."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    merged = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
    merged.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return str(target)


def train_local(
    store: Any,
    cfg: Any,
    run_id: str,
    round: int,
    policy_in: str,
    tasks: list[Task],
    *,
    on_step: Callable[[StepStats], None] | None = None,
) -> TrainResult:
    """Train ``policy_in`` on ``tasks`` for one round (see the module docstring).

    ``on_step`` receives each GRPO step's ``StepStats`` (progress display, benchmarks).
    """
    from coevolve.policy import load_policy
    from coevolve.train.sft import reference_chats, run_sft

    if not tasks:
        raise ValueError("train_local: no training tasks in the pool")
    if cfg.policy.backend != "local":
        raise ValueError(f"train.backend 'local' trains a local model; policy.backend is {cfg.policy.backend!r}")
    t = cfg.train
    # a rerun of the round replaces its training rollouts, even if it now takes fewer steps
    store.delete_parts("rollouts", round, f"{run_id}-train-s")
    seed = cfg.seed * 1000 + round
    torch.manual_seed(seed)
    env = resolve("environment", cfg.env.name)()
    policy = load_policy(cfg.policy, policy_in)
    # LoRA layers are injected into policy.model itself, so the policy samples through them
    model = attach_lora(policy.model, t.lora_r, t.lora_alpha) if t.lora else policy.model
    ref_model = copy.deepcopy(policy.model).eval().requires_grad_(False) if t.kl_coef > 0 and not t.lora else None

    # a warm start: only when this round starts from the base model, not from a trained checkpoint
    if t.sft_steps > 0 and policy_in == cfg.policy.model:
        chats = reference_chats(env, tasks, step_limit=cfg.env.step_limit, seed=seed)
        examples = [encode_result(policy.tokenizer, r, cfg.policy.tool_format, t.max_seq_tokens) for r in chats]
        run_sft(model, policy.tokenizer, examples, steps=t.sft_steps, batch_size=t.sft_batch_size, lr=t.sft_lr,
                micro_batch_size=t.micro_batch_size, seed=seed)
        policy.prefix_cache.clear()

    trainer = GrpoTrainer(policy, env, cfg, model, ref_model)
    rewards: list[float] = []
    successes: list[bool] = []
    batches = _task_batches(tasks, t.tasks_per_step, seed)
    for step in range(1, t.steps + 1):
        started = time.monotonic()
        epoch, step_tasks = next(batches)
        results = trainer.rollouts(
            step_tasks, run_id=run_id, round=round, step=step, epoch=epoch, seed=seed * 100 + step
        )
        rows = [row for r in results for row in r.steps]
        store.write("rollouts", round, f"{run_id}-train-s{step:04d}", rows)
        stats = trainer.update(results)
        rewards += [r.score.reward for r in results]
        successes += [bool(r.score.success) for r in results]
        if on_step:
            n = len(results)
            on_step(StepStats(
                step=step, epoch=epoch, n_episodes=n,
                mean_reward=sum(r.score.reward for r in results) / n,
                success_rate=sum(bool(r.score.success) for r in results) / n,
                loss=stats["loss"], n_tokens=int(stats["n_tokens"]), seconds=time.monotonic() - started,
                extra={"kl": stats["kl"], "clip_frac": stats["clip_frac"], "n_trained": stats["n_trained"]},
            ))
    out = save_checkpoint(model, policy.tokenizer, checkpoint_path(cfg, run_id, round))
    n = len(rewards)
    return TrainResult(
        checkpoint=out,
        n_rollouts=n,
        mean_reward=sum(rewards) / n if n else 0.0,
        success_rate=sum(successes) / n if n else 0.0,
    )
