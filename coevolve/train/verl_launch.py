"""The ``verl`` trainer: export the round's tasks, compose and validate verl's config, launch
verl's PPO trainer (locally or as a Ray job), stream its progress, and bring its checkpoint
back as a Hugging Face directory with what was trained in it.

    plan = prepare(cfg, run_id, round, policy_in, tasks)   # files + validated config + command
    print(plan.yaml, format_command(plan.command))         # what `coevolve train --dry-run` shows
    result = train_verl(store, cfg, run_id, round, policy_in, tasks)

Files of a round live in ``<checkpoint_dir>/<run_id>/round-<r>-verl/`` on one machine, or in
``<train.verl_shared_dir>/<run_id>/round-<r>-verl/`` when verl runs on a Ray cluster:
``train.parquet``, ``agent_loop.yaml``, ``metrics.jsonl`` (verl's per-step metrics, read into
``train_steps``), verl's own checkpoints (``verl/global_step_<n>/actor``). The merged Hugging
Face checkpoint goes where every trainer puts it, ``checkpoint_path(cfg, run_id, round)``; a
LoRA run's adapter, which verl's merger writes beside the base weights, is merged into them.

Shared storage: on a Ray cluster (``train.verl_ray_address``, ``train.verl_nodes > 1``, or a
launch from inside a Ray job) every node must read the round's files and write rollout rows to
the same store, so ``prepare`` refuses, before anything starts, a launch without
``train.verl_shared_dir`` or with a local store outside it (``check_shared_storage``).

The SFT warm start (``train.sft_steps``) runs here, with coevolve's local trainer, before a
round that starts from the base model, exactly as the local trainer runs it; verl then starts
from the warm-started checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from coevolve.tasks import Task
from coevolve.train.result import TrainResult, checkpoint_path
from coevolve.train.verl_config import (
    attention_overrides,
    build_overrides,
    compose_config,
    format_command,
    launch_command,
)
from coevolve.train.verl_data import export_tasks, write_agent_loop_config


@dataclass
class VerlPlan:
    workdir: str  # the round's verl files
    model_path: str  # what verl loads (a local HF directory, or a hub id its workers can fetch)
    overrides: list[str]
    config: Any  # the composed, validated OmegaConf config
    command: list[str]  # argv that launches the training
    env: dict[str, str] = field(default_factory=dict)  # variables the launch sets (local run or Ray job)
    notes: list[str] = field(default_factory=list)  # choices made at launch (attention kernel, copies)

    @property
    def yaml(self) -> str:
        from omegaconf import OmegaConf

        return OmegaConf.to_yaml(self.config)

    @property
    def metrics_file(self) -> str:
        return self.env["VERL_FILE_LOGGER_PATH"]


def model_for_verl(policy_in: str) -> str:
    """A built-in name or local directory becomes its HF directory; anything else (a hub id
    such as ``Qwen/Qwen2.5-7B-Instruct``) is passed to verl unchanged."""
    from coevolve.policy.models import resolve_model

    try:
        return resolve_model(policy_in)
    except FileNotFoundError:
        return policy_in


def distributed(cfg: Any) -> bool:
    """Whether verl's workers may run on other machines than this one."""
    t = cfg.train
    return bool(t.verl_ray_address) or t.verl_nodes > 1 or bool(os.environ.get("RAY_ADDRESS"))


def _under(path: str, root: Path) -> bool:
    return Path(path).expanduser().resolve().is_relative_to(root)


def check_shared_storage(cfg: Any) -> Path | None:
    """The shared directory of a launch on a Ray cluster (None on one machine); raises
    ``ValueError`` saying what to change when the nodes would not share the round's files or
    the store (rows would land on each worker's own disk, and the signals see none)."""
    if not distributed(cfg):
        return None
    t = cfg.train
    where = (
        f"train.verl_ray_address={t.verl_ray_address}"
        if t.verl_ray_address
        else f"train.verl_nodes={t.verl_nodes}"
        if t.verl_nodes > 1
        else "inside a Ray job (RAY_ADDRESS is set)"
    )
    if not t.verl_shared_dir:
        raise ValueError(
            f"verl runs on a Ray cluster ({where}) but train.verl_shared_dir is empty: set it to a directory "
            "mounted at the same path on every node and here (the KubeRay files mount one at /mnt/coevolve)"
        )
    root = Path(t.verl_shared_dir).expanduser().resolve()
    if not root.is_dir():
        raise ValueError(f"train.verl_shared_dir {root} does not exist here: mount the shared volume on this machine")
    if "://" not in cfg.store and not _under(cfg.store, root):
        raise ValueError(
            f"the store {cfg.store} is local to this machine, but verl's workers on other nodes write the rollout "
            f"rows: use an s3:// store, or a store under train.verl_shared_dir ({root})"
        )
    return root


def prepare(
    cfg: Any,
    run_id: str,
    round_no: int,
    policy_in: str,
    tasks: list[Task],
    *,
    model_path: str | None = None,
    flash_attn_present: bool | None = None,
) -> VerlPlan:
    """Write the round's dataset and agent-loop files, compose and validate verl's config.
    ``model_path``: what verl starts from (default: ``policy_in``'s HF directory)."""
    shared = check_shared_storage(cfg)
    if shared is not None:
        workdir = shared / run_id / f"round-{round_no}-verl"
    else:
        workdir = Path(f"{checkpoint_path(cfg, run_id, round_no)}-verl").resolve()
    model_path = model_path or model_for_verl(policy_in)
    notes: list[str] = []
    if shared is not None and Path(model_path).is_dir() and not _under(model_path, shared):
        copy = workdir / "policy"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(model_path, copy)
        notes.append(f"copied the policy {model_path} to {copy} (every node reads it there)")
        model_path = str(copy)
    overrides = build_overrides(
        cfg,
        model_path=model_path,
        train_file=export_tasks(tasks, workdir / "train.parquet"),
        agent_loop_config=write_agent_loop_config(workdir / "agent_loop.yaml"),
        out_dir=str(workdir / "verl"),
        run_id=run_id,
        round_no=round_no,
        n_tasks=len(tasks),
        flash_attn_present=flash_attn_present,
    )
    notes.insert(0, attention_overrides(cfg.train.verl_attention, flash_attn_present=flash_attn_present)[1])
    config = compose_config(overrides)
    env = {"VERL_FILE_LOGGER_PATH": str(workdir / "metrics.jsonl")}
    command = launch_command(overrides, cfg.train.verl_ray_address, env=env)
    return VerlPlan(str(workdir), model_path, overrides, config, command, env, notes)


def stream(
    command: list[str], on_line: Callable[[str], None], tail: int = 40, env: dict[str, str] | None = None
) -> None:
    """Run ``command`` (with ``env`` added to this environment), passing each output line to
    ``on_line``; raise with the last lines on failure."""
    last: deque[str] = deque(maxlen=tail)
    full_env = {**os.environ, **env} if env else None
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=full_env
    ) as proc:
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            line = line.rstrip("\n")
            last.append(line)
            on_line(line)
        code = proc.wait()
    if code != 0:
        raise RuntimeError(f"{format_command(command[:4])} ... exited with {code}:\n" + "\n".join(last))


def fold_lora(target: str, on_line: Callable[[str], None] = print) -> bool:
    """Merge the ``lora_adapter/`` verl's merger writes beside the base weights into them, in
    place (written beside and renamed); True when there was one. Without this the next round
    would load the base weights alone and the trained adapter would be lost."""
    adapter = Path(target) / "lora_adapter"
    if not (adapter / "adapter_config.json").is_file():
        return False
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    saved_dtype = getattr(AutoConfig.from_pretrained(target), "dtype", None) or torch.bfloat16
    if isinstance(saved_dtype, str):  # a config may name it ("bfloat16")
        saved_dtype = getattr(torch, saved_dtype)
    # merge W + (alpha/r) B A in float32, then store in the dtype verl's merger saved the weights in
    base = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().to(saved_dtype)
    tmp = Path(f"{target}.folded")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(target).save_pretrained(tmp)
    try:
        GenerationConfig.from_pretrained(target).save_pretrained(tmp)
    except OSError:
        pass  # the base model had no generation config
    shutil.rmtree(target)
    tmp.rename(target)
    on_line(f"merged the LoRA adapter {adapter} into {target}")
    return True


def merge_checkpoint(workdir: str, steps: int, target: str, on_line: Callable[[str], None]) -> str:
    """verl's FSDP actor checkpoint of the last step -> a Hugging Face directory at ``target``,
    through verl's own merger, with a LoRA adapter merged into the weights (``fold_lora``)."""
    actor = Path(workdir) / "verl" / f"global_step_{steps}" / "actor"
    if not actor.is_dir():
        raise RuntimeError(f"verl finished but wrote no checkpoint at {actor}")
    argv = [
        sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(actor),
        "--target_dir",
        target,
    ]
    stream(argv, on_line)
    fold_lora(target, on_line)
    return target


# train_steps column <- verl metric names, first present wins (verl logs one aggregate per step)
METRIC_COLUMNS: dict[str, tuple[str, ...]] = {
    "loss": ("actor/loss", "actor/pg_loss"),
    "pg_loss": ("actor/pg_loss",),
    "kl": ("actor/kl_loss", "actor/ppo_kl"),
    "clip_frac": ("actor/pg_clipfrac",),
    "grad_norm": ("actor/grad_norm",),
    "reward_mean": ("critic/score/mean", "critic/rewards/mean"),
    "lr": ("actor/lr",),
    "n_tokens": ("perf/total_num_tokens",),
    "seconds": ("timing_s/step",),
}


def step_metrics(path: str | Path, *, run_id: str, steps_per_epoch: int) -> list[dict[str, Any]]:
    """``train_steps`` rows from verl's file logger (one JSON line ``{"step", "data"}`` per step):
    ``epoch`` is null (verl averages over its PPO epochs), ``task_epoch`` the pass over the tasks."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        data, step = record.get("data") or {}, int(record["step"])
        if not any(k.startswith("actor/") for k in data):
            continue  # a validation line
        row: dict[str, Any] = {"run_id": run_id, "step": step, "task_epoch": (step - 1) // max(1, steps_per_epoch)}
        for column, names in METRIC_COLUMNS.items():
            value = next((data[n] for n in names if data.get(n) is not None), None)
            row[column] = int(value) if column == "n_tokens" and value is not None else value
        rows.append(row)
    return rows


def warm_start(cfg: Any, round_no: int, tasks: list[Task], out: str, on_line: Callable[[str], None]) -> str:
    """coevolve's SFT warm start of ``cfg.policy.model`` on ``tasks``' reference trajectories
    (the local trainer's, cached the same way), saved as a Hugging Face directory at ``out``."""
    import gc

    import torch

    from coevolve.policy import load_policy
    from coevolve.registry import resolve
    from coevolve.train.local import _warm_start, attach_lora, save_checkpoint

    t = cfg.train
    if cfg.policy.backend != "local":
        raise ValueError(
            f"train.sft_steps={t.sft_steps} needs policy.backend 'local' to warm-start before verl "
            f"(it is {cfg.policy.backend!r}): set train.sft_steps=0 or policy.backend=local"
        )
    on_line(f"SFT warm start: {t.sft_steps} steps on {len(tasks)} tasks' reference calls, before verl")
    policy: Any = load_policy(cfg.policy, cfg.policy.model)
    model = attach_lora(policy.model, t.lora_r, t.lora_alpha) if t.lora else policy.model
    env = resolve("environment", cfg.env.name)()
    _warm_start(policy, model, env, tasks, cfg, cfg.seed * 1000 + round_no)
    path = save_checkpoint(model, policy.tokenizer, out)
    del policy, model
    gc.collect()
    if torch.cuda.is_available():  # hand the GPU memory back before vLLM and FSDP claim theirs
        torch.cuda.empty_cache()
    return path


def round_metrics(store: Any, run_id: str, round_no: int) -> tuple[int, float, float]:
    """(episodes, mean episode reward, success rate) of the round's verl training rollouts."""
    import pyarrow.dataset as ds

    table = store.read(
        "rollouts",
        filter=(ds.field("run_id") == run_id) & (ds.field("round") == round_no) & (ds.field("phase") == "train"),
        columns=["episode_id", "episode_reward", "success"],
    )
    episodes = {r["episode_id"]: r for r in table.to_pylist()}
    n = len(episodes)
    if not n:
        return 0, 0.0, 0.0
    rows = episodes.values()
    return n, sum(r["episode_reward"] for r in rows) / n, sum(bool(r["success"]) for r in rows) / n


def train_verl(
    store: Any,
    cfg: Any,
    run_id: str,
    round_no: int,
    policy_in: str,
    tasks: list[Task],
    *,
    on_line: Callable[[str], None] = print,
) -> TrainResult:
    """Train with verl on a GPU machine or Ray cluster (``train.verl_ray_address``).

    The agent loop on verl's workers writes the rollout rows to the store, so the store must be
    reachable from every node (``check_shared_storage``). ``on_line`` receives verl's output.
    """
    check_shared_storage(cfg)  # before the warm start: a launch that cannot work stops at once
    model_path = None
    if cfg.train.sft_steps > 0 and policy_in == cfg.policy.model:
        out = f"{checkpoint_path(cfg, run_id, round_no)}-warm-start"
        model_path = warm_start(cfg, round_no, tasks, out, on_line)
    plan = prepare(cfg, run_id, round_no, policy_in, tasks, model_path=model_path)
    for note in plan.notes:
        on_line(note)
    store.delete_parts("rollouts", round_no, f"{run_id}-train-verl-")  # a rerun replaces the round's rows
    store.delete_parts("train_steps", round_no, f"{run_id}-train-verl")
    Path(plan.metrics_file).unlink(missing_ok=True)
    on_line(f"launching: {format_command(plan.command)}")
    stream(plan.command, on_line)  # the command carries plan.env (locally as `env K=V ...`, or the job's runtime env)
    target = merge_checkpoint(plan.workdir, max(cfg.train.steps, 1), checkpoint_path(cfg, run_id, round_no), on_line)
    if Path(plan.metrics_file).is_file():
        steps_per_epoch = int(plan.config.coevolve.steps_per_epoch)
        rows = step_metrics(plan.metrics_file, run_id=run_id, steps_per_epoch=steps_per_epoch)
        if rows:
            store.write("train_steps", round_no, f"{run_id}-train-verl", rows)
    n, reward, success = round_metrics(store, run_id, round_no)
    return TrainResult(checkpoint=target, n_rollouts=n, mean_reward=reward, success_rate=success)
