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
   each group, and take ``train.ppo_epochs`` optimizer steps of the clipped policy-gradient
   loss (+ KL) on exactly the sampled tokens (``sequences.episode_sequences``: the ids and
   behaviour log-probs the rollout rows carry, never re-tokenized), each accumulated over
   the step's sequences (a GRPO group's shared prompt computed once: ``scoring.plan``); every optimizer step writes a row to
   ``train_steps``;
4. merge the adapters and save a Hugging Face checkpoint (weights + tokenizer) to
   ``<checkpoint_dir>/<run_id>/round-<round>``.

The ratio is taken against the behaviour log-probs recorded at sampling time, so the first
pass of a step has ratio 1 (up to float rounding and generation precision) and later passes
move away from it, where the clip acts. The KL reference is the round's starting policy:
with LoRA the same model with its adapters switched off, else a frozen copy; its log-probs
are computed once per step, and not at all when ``kl_coef`` is 0. Log-probs are taken only
at the sampled positions (``coevolve.train.scoring``), on ``logits / temperature`` as sampled.
"""

from __future__ import annotations

import copy
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, cast

import torch

from coevolve.policy.base import SamplingParams
from coevolve.policy.local import generation_dtype
from coevolve.processes import usable_cores
from coevolve.registry import resolve
from coevolve.tasks import Task
from coevolve.timing import Splits
from coevolve.train.result import TrainResult, checkpoint_path
from coevolve.train.grpo import clipped_pg_loss, group_advantages, kl_penalty
from coevolve.train.scoring import (
    Chunk,
    attended_keys,
    compute_precision,
    computed_tokens,
    forward_backward,
    model_device,
    plan,
)
from coevolve.train.sequences import TokenSequence, encode_chat, episode_sequences, wire_renderer

if TYPE_CHECKING:
    from coevolve.policy.local import LocalPolicy


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


def training_dtype(name: str, model: torch.nn.Module) -> torch.dtype:
    """``train.precision`` resolved for ``model``: 'auto' computes in bfloat16 exactly where the
    policy generates in it by default (``generation_dtype``), so the trainer scores sampled
    tokens in the precision they were sampled in; else float32."""
    if name != "auto":
        return getattr(torch, name)
    dtype = generation_dtype("auto", model, model_device(model))
    return dtype if dtype == torch.bfloat16 else torch.float32


def sequence_limit(cfg: Any) -> int:
    """``train.max_seq_tokens`` resolved: 0 means the policy's whole context (``policy.max_context_tokens``)."""
    return cfg.train.max_seq_tokens or cfg.policy.max_context_tokens


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
        batch: list[Task] = []
        while len(batch) < min(per_step, len(tasks)):
            if not order:
                order = list(tasks)
                rng.shuffle(order)
                epoch += 1
            batch.append(order.pop())
        yield epoch, batch


def step_sequences(
    episodes: list[list[dict[str, Any]]], adv: torch.Tensor, max_tokens: int
) -> tuple[list[TokenSequence], list[float]]:
    """A GRPO step's training sequences (of the episodes, rollout rows in order, with a non-zero
    advantage ``adv[i]``) and their advantages, sorted by length so that micro-batches pad little."""
    seqs, advs = [], []
    for i, rows in enumerate(episodes):
        if adv[i] != 0:
            for seq in episode_sequences(rows, max_tokens):
                seqs.append(seq)
                advs.append(float(adv[i]))
    order = sorted(range(len(seqs)), key=lambda j: len(seqs[j].ids))
    return [seqs[j] for j in order], [advs[j] for j in order]


class GrpoTrainer:
    """The model, optimizer and LR schedule of one round: ``rollouts`` samples a step's groups,
    ``update`` takes the step's optimizer step on them."""

    def __init__(
        self,
        policy: LocalPolicy,
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
            t.lr_scheduler,
            self.optimizer,
            num_warmup_steps=t.warmup_steps,
            num_training_steps=max(t.steps * t.ppo_epochs, 1),
        )
        # behaviour log-probs were recorded on logits / temperature; the trainer scores the same
        self.temperature = cfg.policy.temperature
        self.dtype = training_dtype(t.precision, model)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id

    def rollouts(self, tasks: list[Task], *, run_id: str, round_no: int, step: int, epoch: int, seed: int) -> list[Any]:
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
            round_no=round_no,
            train_step=step,
            epoch=epoch,
            batch_size=p.batch_size,
            seed=seed,
        )

    def _reference_logprobs(self, chunk: Chunk) -> list[torch.Tensor]:
        with torch.no_grad():
            if hasattr(self.model, "disable_adapter"):  # LoRA: the base model is the reference
                with cast(Any, self.model).disable_adapter():  # peft
                    return forward_backward(self.model, chunk, self.temperature, None)
            assert self.ref_model is not None  # a frozen copy whenever kl_coef > 0 without LoRA
            return forward_backward(self.ref_model, chunk, self.temperature, None)

    def update(self, results: list[Any]) -> list[dict[str, Any]]:
        """``train.ppo_epochs`` optimizer steps of GRPO on ``results`` (EpisodeResults of whole
        groups); returns one stats dict per optimizer step (the ``train_steps`` columns other
        than run_id, step and task_epoch). No rows when every group's rewards are equal."""
        t = self.cfg.train
        rewards = torch.tensor([float(r.score.reward) for r in results])
        adv = group_advantages(rewards.tolist(), [r.task_id for r in results])
        seqs, advs = step_sequences([r.steps for r in results], adv, sequence_limit(self.cfg))
        if not seqs:  # no optimizer step, so the schedule (counted in optimizer steps) waits too
            return []
        chunks = plan(
            seqs,
            self.pad_id,
            advs,
            micro_batch_size=t.micro_batch_size,
            share_prefix=t.share_prefix,
            device=model_device(self.model),
        )
        n_trained = sum(int(b["targets"].numel()) for c in chunks for b in c.batches)
        n_computed, n_keys = computed_tokens(chunks), attended_keys(chunks)
        out = []
        with compute_precision(self.dtype, self.model):
            refs = [self._reference_logprobs(c) for c in chunks] if t.kl_coef > 0 else None
            for epoch in range(t.ppo_epochs):
                stats = grpo_optimizer_step(
                    self.model,
                    self.params,
                    self.optimizer,
                    chunks,
                    refs=refs,
                    temperature=self.temperature,
                    clip_eps=t.clip_eps,
                    kl_coef=t.kl_coef,
                    max_grad_norm=t.max_grad_norm,
                )
                self.scheduler.step()
                out.append(
                    {
                        **stats,
                        "epoch": epoch,
                        "reward_mean": float(rewards.mean()),
                        "reward_std": float(rewards.std(unbiased=False)),
                        "n_sequences": len(seqs),
                        "n_tokens": sum(len(s.ids) for s in seqs),
                        "n_trained_tokens": n_trained,
                        "n_computed_tokens": n_computed,
                        "n_attended_keys": n_keys,
                    }
                )
        # the policy caches prompt-prefix KV across calls; those keys came from the old weights
        self.policy.prefix_cache.clear()
        return out


def grpo_optimizer_step(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    chunks: list[Chunk],
    *,
    refs: list[list[torch.Tensor]] | None,
    temperature: float,
    clip_eps: float,
    kl_coef: float,
    max_grad_norm: float,
) -> dict[str, float]:
    """One optimizer step of the clipped GRPO loss (+ ``kl_coef`` x KL to ``refs``, one tensor
    per batch of each chunk) over ``chunks`` (``scoring.plan``; gradients accumulated, the loss
    is the token mean over all of them). Returns the ``train_steps`` statistics of the step."""
    started = time.perf_counter()
    denom = float(sum(int(b["targets"].numel()) for c in chunks for b in c.batches)) or 1.0
    model.train()
    optimizer.zero_grad(set_to_none=True)
    stats = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "ratio_mean": 0.0}
    for k, chunk in enumerate(chunks):
        ref_of = {id(b): refs[k][j] for j, b in enumerate(chunk.batches)} if refs is not None else {}

        def loss_fn(logp: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
            ones = torch.ones_like(logp)
            pg, info = clipped_pg_loss(logp, batch["old_logp"], batch["adv"], ones, clip_eps, denom=denom)
            loss = pg
            if refs is not None:
                kl = kl_penalty(logp, ref_of[id(batch)], ones, denom=denom)
                loss = loss + kl_coef * kl
                stats["kl"] += kl.item()
            share = logp.numel() / denom
            stats["loss"] += loss.item()
            stats["pg_loss"] += pg.item()
            stats["clip_frac"] += info["clip_frac"] * share
            stats["ratio_mean"] += info["ratio"] * share
            return loss

        forward_backward(model, chunk, temperature, loss_fn)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    model.eval()
    return {**stats, "grad_norm": float(grad_norm), "lr": lr, "seconds": time.perf_counter() - started}


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
    round_no: int,
    policy_in: str,
    tasks: list[Task],
    *,
    on_step: Callable[[StepStats], None] | None = None,
    on_sft_step: Callable[[int, int, float], None] | None = None,
) -> TrainResult:
    """Train ``policy_in`` on ``tasks`` for one round (see the module docstring).

    ``on_step`` receives each GRPO step's ``StepStats`` (progress display, benchmarks);
    ``on_sft_step(step, steps, loss)`` each step of a warm start computed here (not one read
    from the cache).
    """
    if not tasks:
        raise ValueError("train_local: no training tasks in the pool")
    if cfg.policy.backend != "local":
        raise ValueError(f"train.backend 'local' trains a local model; policy.backend is {cfg.policy.backend!r}")
    t = cfg.train
    # a rerun of the round replaces its training rollouts and steps, even if it now takes fewer
    store.delete_parts("rollouts", round_no, f"{run_id}-train-s")
    store.delete_parts("train_steps", round_no, f"{run_id}-train-s")
    seed = cfg.seed * 1000 + round_no
    torch.manual_seed(seed)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(t.threads or usable_cores())
    try:
        return _train(store, cfg, run_id, round_no, policy_in, tasks, seed, on_step, on_sft_step)
    finally:
        torch.set_num_threads(threads_before)


def _train(
    store: Any,
    cfg: Any,
    run_id: str,
    round_no: int,
    policy_in: str,
    tasks: list[Task],
    seed: int,
    on_step: Callable[[StepStats], None] | None,
    on_sft_step: Callable[[int, int, float], None] | None = None,
) -> TrainResult:
    from coevolve.policy import load_policy

    t = cfg.train
    splits = Splits()
    env = resolve("environment", cfg.env.name)()
    with splits.part("load"):
        policy = cast("LocalPolicy", load_policy(cfg.policy, policy_in))  # policy.backend is 'local'
        # LoRA layers are injected into policy.model itself, so the policy samples through them
        model = attach_lora(policy.model, t.lora_r, t.lora_alpha) if t.lora else policy.model
        ref_model = copy.deepcopy(policy.model).eval().requires_grad_(False) if t.kl_coef > 0 and not t.lora else None

    # a warm start: only when this round starts from the base model, not from a trained checkpoint
    with splits.part("sft"):
        if t.sft_steps > 0 and policy_in == cfg.policy.model:
            _warm_start(policy, model, env, tasks, cfg, seed, on_sft_step)

    trainer = GrpoTrainer(policy, env, cfg, model, ref_model)
    rewards: list[float] = []
    successes: list[bool] = []
    batches = _task_batches(tasks, t.tasks_per_step, seed)
    for step in range(1, t.steps + 1):
        started = time.monotonic()
        epoch, step_tasks = next(batches)
        with splits.part("rollouts"):
            results = trainer.rollouts(
                step_tasks, run_id=run_id, round_no=round_no, step=step, epoch=epoch, seed=seed * 100 + step
            )
            rows = [row for r in results for row in r.steps]
            store.write("rollouts", round_no, f"{run_id}-train-s{step:04d}", rows)
        with splits.part("update"):
            updates = trainer.update(results)
        if updates:
            store.write(
                "train_steps",
                round_no,
                f"{run_id}-train-s{step:04d}",
                [{**u, "run_id": run_id, "step": step, "task_epoch": epoch} for u in updates],
            )
        rewards += [r.score.reward for r in results]
        successes += [bool(r.score.success) for r in results]
        if on_step:
            n = len(results)
            last = updates[-1] if updates else {}
            on_step(
                StepStats(
                    step=step,
                    epoch=epoch,
                    n_episodes=n,
                    mean_reward=sum(r.score.reward for r in results) / n,
                    success_rate=sum(bool(r.score.success) for r in results) / n,
                    loss=last.get("loss", 0.0),
                    n_tokens=int(last.get("n_tokens", 0)),
                    seconds=time.monotonic() - started,
                    extra={k: last.get(k, 0.0) for k in ("kl", "clip_frac", "grad_norm", "n_sequences")},
                )
            )
    with splits.part("checkpoint"):
        out = save_checkpoint(model, policy.tokenizer, checkpoint_path(cfg, run_id, round_no))
    n = len(rewards)
    return TrainResult(
        checkpoint=out,
        n_rollouts=n,
        mean_reward=sum(rewards) / n if n else 0.0,
        success_rate=sum(successes) / n if n else 0.0,
        timings=splits.seconds,
    )


def _warm_start(
    policy: "LocalPolicy",
    model: torch.nn.Module,
    env: Any,
    tasks: list[Task],
    cfg: Any,
    seed: int,
    on_step: Callable[[int, int, float], None] | None = None,
) -> None:
    """SFT on the reference trajectories of ``tasks`` (``coevolve.train.sft``), in place; or its
    result from the machine's cache (``coevolve.train.warm_start_cache``) when it was computed before."""
    from coevolve.train import warm_start_cache
    from coevolve.train.sft import reference_chats, run_sft

    t = cfg.train
    chats = reference_chats(env, tasks, step_limit=cfg.env.step_limit, seed=seed)
    examples = [encode_result(policy.tokenizer, r, cfg.policy.tool_format, sequence_limit(cfg)) for r in chats]
    settings = {
        k: getattr(t, k)
        for k in (
            "sft_steps",
            "sft_batch_size",
            "sft_lr",
            "micro_batch_size",
            "share_prefix",
            "lora",
            "lora_r",
            "lora_alpha",
        )
    }
    dtype = training_dtype(t.precision, model)
    key = warm_start_cache.cache_key(policy.model_path, examples, {**settings, "seed": seed, "dtype": str(dtype)})
    if t.warm_start_cache and warm_start_cache.load(model, key):
        policy.prefix_cache.clear()
        return
    run_sft(
        model,
        policy.tokenizer,
        examples,
        steps=t.sft_steps,
        batch_size=t.sft_batch_size,
        lr=t.sft_lr,
        micro_batch_size=t.micro_batch_size,
        seed=seed,
        share_prefix=t.share_prefix,
        dtype=dtype,
        on_step=(lambda step, loss: on_step(step, t.sft_steps, loss)) if on_step else None,
    )
    if t.warm_start_cache:
        warm_start_cache.save(model, key)
    policy.prefix_cache.clear()
