"""``coevolve bench train``: the local trainer's update step next to a plain torch (+ peft)
reference doing the same math on the same shapes, and one whole GRPO step (rollouts + update).

    coevolve bench train                    # trainer vs plain torch+peft, tiny and SmolLM2+LoRA; one GRPO step
    m = measure_update("tiny", lora=False, steps=3, batch=4, seq_len=256)   # {"trainer_s", "reference_s", ...}

The trainer's step is ``coevolve.train.local.grpo_optimizer_step`` itself on ``batch`` random
sequences of ``seq_len`` tokens whose second half was "sampled" (behaviour log-probs from the
same weights): log-probs at the sampled positions only, clipped ratio loss, backward, gradient
clipping, AdamW. The reference is what a plain script does: ``model(input_ids, labels=...)``
(the model's own full-vocabulary loss on the same tokens, prompt half masked with -100),
backward, gradient clipping, AdamW. Both run on the same model object, alternating step by
step, so load on a shared machine hits both alike; the figure is the median.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from coevolve.processes import usable_cores


def measure_update(
    model_name: str, *, lora: bool, steps: int, batch: int, seq_len: int, seed: int = 0, threads: int = 0
) -> dict:
    """Median seconds per step of the trainer (float32 and under bfloat16 autocast, as
    ``train.precision`` gives them) and of the plain float32 reference, after a warm-up step of
    each: ``{"trainer_s", "trainer_bf16_s", "reference_s", "ratio" (reference_s / trainer_s),
    "bf16_speedup" (trainer_s / trainer_bf16_s), "auto" (the precision 'auto' picks here),
    "tokens", "trainable", "threads"}``."""

    from transformers import AutoModelForCausalLM

    from coevolve.policy.models import resolve_model
    from coevolve.train.local import attach_lora, grpo_optimizer_step, training_dtype
    from coevolve.train.scoring import Chunk, compute_precision, pack, sampled_logprobs
    from coevolve.train.sequences import TokenSequence

    before = torch.get_num_threads()
    torch.set_num_threads(threads or usable_cores())
    try:
        torch.manual_seed(seed)
        model: Any = AutoModelForCausalLM.from_pretrained(resolve_model(model_name))
        if lora:
            model = attach_lora(model, 16, 32)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-5)
        vocab = model.get_input_embeddings().num_embeddings
        ids = torch.randint(0, vocab, (batch, seq_len))
        half = seq_len // 2
        seqs = [
            TokenSequence(ids=row.tolist(), mask=[0] * half + [1] * (seq_len - half), logprobs=[0.0] * seq_len)
            for row in ids
        ]
        packed = pack(seqs, 0, torch.linspace(-1.0, 1.0, batch).tolist())
        with torch.no_grad():
            packed["old_logp"] = sampled_logprobs(model.eval(), packed)
        labels = ids.clone()
        labels[:, :half] = -100

        def trainer_step() -> None:
            grpo_optimizer_step(
                model,
                params,
                optimizer,
                [Chunk([], [packed], list(range(batch)))],
                refs=None,
                temperature=1.0,
                clip_eps=0.2,
                kl_coef=0.0,
                max_grad_norm=1.0,
            )

        def trainer_bf16_step() -> None:
            with compute_precision(torch.bfloat16, model):
                trainer_step()

        def reference_step() -> None:
            model.train()
            optimizer.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=labels).loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()

        times: dict[str, list[float]] = {"trainer": [], "trainer_bf16": [], "reference": []}
        for i in range(steps + 1):
            for name, fn in (
                ("reference", reference_step),
                ("trainer", trainer_step),
                ("trainer_bf16", trainer_bf16_step),
            ):
                started = time.perf_counter()
                fn()
                if i:  # the first step pays for allocation and kernel selection
                    times[name].append(time.perf_counter() - started)
        trainer_s, reference_s = statistics.median(times["trainer"]), statistics.median(times["reference"])
        bf16_s = statistics.median(times["trainer_bf16"])
        return {
            "trainer_s": trainer_s,
            "trainer_bf16_s": bf16_s,
            "reference_s": reference_s,
            "ratio": reference_s / trainer_s,
            "bf16_speedup": trainer_s / bf16_s,
            "auto": str(training_dtype("auto", model)).removeprefix("torch."),
            "tokens": batch * seq_len,
            "trainable": sum(p.numel() for p in params),
            "threads": torch.get_num_threads(),
        }
    finally:
        torch.set_num_threads(before)


def measure_grpo_step(model_name: str = "smollm2", *, seed: int = 0, **overrides) -> dict:
    """The first GRPO step of the embedded default's round 1 (``train.steps = 1``, after the
    default SFT warm start, as a round runs it) of ``model_name`` on synthesized BFCL tasks (the
    seed pool round 0 builds for ``seed``: ``coevolve.train.probe``), timed end to end. Without the
    warm start the base model earns no reward in any group, and a step without reward spread
    has no update to time. Returns ``{"seconds" (the step: rollouts + update), "rollout_s",
    "update_s", "other_s" (model loading, the SFT warm start, saving the checkpoint), "total_s", "episodes",
    "n_tokens", "n_computed_tokens", "reward", "sft_steps", "update_flops" (the update's projection
    FLOPs: 4 per frozen weight and computed token with LoRA, 6 without; a lower bound),
    "precision" and "matmul_flops" (what a matrix product reaches here in that precision), ...}``."""
    import tempfile

    from coevolve.bench.limits import linear_params, matmul_flops
    from coevolve.config import load_config
    from coevolve.policy.local import cpu_has_native_bf16
    from coevolve.store import Store
    from coevolve.train.local import train_local
    from coevolve.train.probe import synthesized_tasks

    tasks = synthesized_tasks(seed)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            None,
            {
                "run_name": "bench",
                "store": tmp,
                "seed": seed,
                "policy.model": model_name,
                "train.checkpoint_dir": f"{tmp}/ckpt",
                "train.steps": 1,
                **overrides,
            },
        )
        store = Store(tmp)
        seen: list[Any] = []
        started = time.perf_counter()
        train_local(store, cfg, "bench", 1, model_name, tasks, on_step=seen.append)
        total = time.perf_counter() - started
        updates = store.read("train_steps").to_pylist()
    step = seen[0]
    update_s = sum(r["seconds"] for r in updates)
    computed = sum(r["n_computed_tokens"] or 0 for r in updates)
    # LoRA: the frozen projections' FLOPs forward and for the activations' gradient backward
    per_token = (4 if cfg.train.lora else 6) * linear_params(model_name)
    dtype = torch.bfloat16 if cfg.train.precision == "auto" and cpu_has_native_bf16() else torch.float32
    if cfg.train.precision not in ("auto", "float32"):
        dtype = getattr(torch, cfg.train.precision)
    return {
        "seconds": step.seconds,
        "update_s": update_s,
        "rollout_s": step.seconds - update_s,
        "other_s": total - step.seconds,
        "total_s": total,
        "episodes": step.n_episodes,
        "n_tokens": step.n_tokens,
        "n_computed_tokens": computed,
        "update_flops": per_token * computed,  # a lower bound: no attention, no output head
        "precision": str(dtype).removeprefix("torch."),
        "matmul_flops": matmul_flops(dtype),
        "reward": step.mean_reward,
        "sft_steps": cfg.train.sft_steps,
        "ppo_epochs": cfg.train.ppo_epochs,
        "max_new_tokens": cfg.policy.max_new_tokens,
        "share_prefix": cfg.train.share_prefix,
    }


def replay_update(
    store: Any, *, round_no: int, step: int, model_name: str = "smollm2", profile: int = 0, seed: int = 0
) -> dict:
    """Replay one logged GRPO update: the ``train`` rollouts of ``round_no`` / ``step`` in
    ``store`` (their exact prompt and sampled ids and behaviour log-probs) become the step's
    sequences as the trainer builds them (episode rewards, group advantages, shared prompts) and
    one optimizer step of the default config's trainer runs on a fresh ``model_name`` with LoRA.
    The weights differ from the run's, so the loss does too; the work is the same. Returns
    ``{"seconds", "n_sequences", "n_tokens", "n_computed_tokens", "lengths", "precision", "loss",
    "profile"}`` (``profile``: the torch profiler's table of the ``profile`` costliest operations,
    "" when 0)."""
    from transformers import AutoModelForCausalLM

    from coevolve.config import load_config
    from coevolve.policy.models import resolve_model
    from coevolve.train.grpo import group_advantages
    from coevolve.train.local import attach_lora, grpo_optimizer_step, sequence_limit, step_sequences, training_dtype
    from coevolve.train.scoring import compute_precision, computed_tokens, model_device, plan

    import pyarrow.dataset as ds

    wanted = (ds.field("phase") == "train") & (ds.field("round") == round_no) & (ds.field("train_step") == step)
    rows = store.read("rollouts", filter=wanted).to_pylist()
    if not rows:
        raise ValueError(f"no train rollouts of round {round_no}, step {step} in the store")
    episodes: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["episode_id"], r["turn"], r["step"])):
        episodes.setdefault(r["episode_id"], []).append(r)
    ordered = list(episodes.values())
    adv = group_advantages([float(e[0]["episode_reward"]) for e in ordered], [e[0]["task_id"] for e in ordered])
    cfg = load_config(None, {"policy.model": model_name})
    t = cfg.train
    seqs, advs = step_sequences(ordered, adv, sequence_limit(cfg))
    if not seqs:
        raise ValueError(f"round {round_no}, step {step}: every group's rewards are equal, so no update")
    torch.manual_seed(seed)
    model: Any = AutoModelForCausalLM.from_pretrained(resolve_model(model_name))
    vocab, top = model.get_input_embeddings().num_embeddings, max(max(s.ids) for s in seqs)
    if top >= vocab:
        raise ValueError(
            f"the logged token ids reach {top}, past {model_name}'s vocabulary of {vocab}: "
            "replay with the run's own model"
        )
    if t.lora:
        model = attach_lora(model, t.lora_r, t.lora_alpha)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=0.0)
    chunks = plan(
        seqs, 0, advs, micro_batch_size=t.micro_batch_size, share_prefix=t.share_prefix, device=model_device(model)
    )
    dtype = training_dtype(t.precision, model)

    def update() -> dict:
        with compute_precision(dtype, model):
            return grpo_optimizer_step(
                model,
                params,
                optimizer,
                chunks,
                refs=None,
                temperature=cfg.policy.temperature,
                clip_eps=t.clip_eps,
                kl_coef=0.0,
                max_grad_norm=t.max_grad_norm,
            )

    table = ""
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler

        with profiler(activities=[ProfilerActivity.CPU]) as prof:
            stats = update()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=profile)
    else:
        stats = update()
    return {
        "seconds": stats["seconds"],
        "n_sequences": len(seqs),
        "n_tokens": sum(len(s.ids) for s in seqs),
        "n_computed_tokens": computed_tokens(chunks),
        "lengths": sorted(len(s.ids) for s in seqs),
        "precision": str(dtype).removeprefix("torch."),
        "loss": stats["loss"],
        "profile": table,
    }
