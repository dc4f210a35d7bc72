"""verl's own Hydra config (``ppo_trainer``) composed with coevolve's overrides, validated.

    overrides = build_overrides(cfg, model_path=..., train_file=..., agent_loop_config=..., out_dir=...)
    config = compose_config(overrides)        # raises if verl's validator rejects it
    cmd = launch_command(overrides, cfg.train.verl_ray_address)

The overrides map coevolve's ``TrainConfig`` onto verl: GRPO advantages, the policy path,
the attention kernel (``attention_overrides``), vLLM as the rollout engine, coevolve's agent
loop (``coevolve.train.verl_agent_loop``), the cluster shape, and every training setting that
has a verl counterpart (``SETTING_PATHS``: group size, batch, PPO epochs, clip, KL, learning
rate and schedule, gradient clip, LoRA, micro-batch, seed). ``train.verl_overrides`` are
appended last, so a user can change anything verl knows. A ``coevolve`` section carries what
the agent loop needs on the workers (store, run id, round, environment, prompts, the steps of
one pass over the tasks).

Settings with no verl counterpart, and why: ``threads``, ``precision`` and ``share_prefix``
belong to the local trainer's torch loop (verl's FSDP actor computes in bfloat16 with its own
packing); ``max_seq_tokens`` is the local trainer's sequence cut (verl bounds a sequence by
``data.max_prompt_length`` + ``data.max_response_length``); ``sft_steps`` runs coevolve's SFT
warm start before the first verl round (``verl_launch.train_verl``).

verl is imported only inside ``compose_config`` (``import verl`` takes seconds).
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coevolve.config import RunConfig

AGENT_NAME = "coevolve"

# coevolve's train.<field> -> the verl config paths it sets (tests/test_train_verl_fixes.py maps each)
SETTING_PATHS: dict[str, tuple[str, ...]] = {
    "group_size": ("actor_rollout_ref.rollout.n",),
    "tasks_per_step": ("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"),
    "ppo_epochs": ("actor_rollout_ref.actor.ppo_epochs",),
    "lr": ("actor_rollout_ref.actor.optim.lr",),
    "warmup_steps": ("actor_rollout_ref.actor.optim.lr_warmup_steps",),
    "lr_scheduler": ("actor_rollout_ref.actor.optim.lr_scheduler_type",),
    "clip_eps": (
        "actor_rollout_ref.actor.clip_ratio",
        "actor_rollout_ref.actor.clip_ratio_low",
        "actor_rollout_ref.actor.clip_ratio_high",
    ),
    "kl_coef": ("actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.use_kl_loss"),
    "max_grad_norm": ("actor_rollout_ref.actor.grad_clip",),
    "lora_r": ("actor_rollout_ref.model.lora_rank",),
    "lora_alpha": ("actor_rollout_ref.model.lora_alpha",),
    "micro_batch_size": (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    ),
    "steps": ("trainer.total_training_steps", "trainer.save_freq"),
}

# the other train.<field>s, and what becomes of them on the verl path
OTHER_SETTINGS: dict[str, str] = {
    "backend": "chooses this trainer",
    "checkpoint_dir": "where the merged checkpoint and (on one machine) the round's verl files go",
    "lora": "actor_rollout_ref.model.lora_rank is lora_r, or 0 (full fine-tuning)",
    "sft_steps": "coevolve's SFT warm start before a verl round from the base model (verl_launch.warm_start)",
    "sft_lr": "the SFT warm start's",
    "sft_batch_size": "the SFT warm start's",
    "warm_start_cache": "the SFT warm start's",
    "threads": "the local trainer's torch threads (verl's workers use the GPUs)",
    "share_prefix": "the local trainer's prompt sharing (verl packs sequences itself)",
    "precision": "the local trainer's autocast (verl's FSDP actor computes in bfloat16)",
    "max_seq_tokens": "the local trainer's cut (verl bounds a sequence by data.max_prompt/response_length)",
    "verl_overrides": "appended last: any verl setting",
    "verl_ray_address": "where the job is submitted",
    "verl_gpus_per_node": "trainer.n_gpus_per_node",
    "verl_nodes": "trainer.nnodes",
    "verl_attention": "the actor's attention kernel (attention_overrides)",
    "verl_shared_dir": "the round's files on a Ray cluster (verl_launch.check_shared_storage)",
}

# coevolve's LR schedules -> verl's two (verl's optimizer config accepts "constant" and "cosine")
_SCHEDULES = {"constant": "constant", "constant_with_warmup": "constant", "cosine": "cosine"}


def attention_overrides(choice: str, *, flash_attn_present: bool | None = None) -> tuple[list[str], str]:
    """The overrides that pick the FSDP actor's attention kernel, and a line saying which and why.

    verl loads the actor with ``flash_attention_2`` unless ``model.override_config`` names another
    kernel, and ``verl[vllm]`` does not install flash-attn: without it the model load raises. So
    ``auto`` takes flash-attn when ``flash_attn`` imports here (the launching node runs the same
    image as the workers) and torch's ``sdpa`` otherwise, with remove-padding off (verl's
    remove-padding path is flash-attn's varlen kernel)."""
    if choice not in ("auto", "flash_attention_2", "sdpa"):
        raise ValueError(f"train.verl_attention must be 'auto', 'flash_attention_2' or 'sdpa', not {choice!r}")
    if flash_attn_present is None:
        flash_attn_present = importlib.util.find_spec("flash_attn") is not None
    kernel = choice if choice != "auto" else ("flash_attention_2" if flash_attn_present else "sdpa")
    if kernel == "flash_attention_2":
        why = (
            "flash_attn is installed"
            if flash_attn_present
            else "train.verl_attention asks for it (flash_attn NOT importable here)"
        )
        return [
            "+actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
            "actor_rollout_ref.model.use_remove_padding=True",
        ], f"verl attention: flash_attention_2 with remove-padding ({why})"
    why = "flash_attn is not installed" if choice == "auto" else "train.verl_attention: sdpa"
    return [
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=False",
    ], f"verl attention: sdpa, remove-padding off ({why})"


def build_overrides(
    cfg: "RunConfig",
    *,
    model_path: str,
    train_file: str,
    agent_loop_config: str,
    out_dir: str,
    run_id: str,
    round_no: int,
    n_tasks: int,
    flash_attn_present: bool | None = None,
) -> list[str]:
    """Hydra overrides (``key=value`` strings) that turn verl's defaults into this round's run.

    ``train_file``: the exported Parquet (``verl_data.export_tasks``); ``agent_loop_config``:
    the YAML registering coevolve's agent loop; ``out_dir``: where verl writes checkpoints;
    ``n_tasks``: tasks in the file (the batch cannot be larger); ``flash_attn_present``: whether
    the workers have flash-attn (default: whether it imports here, see ``attention_overrides``).
    """
    t, p = cfg.train, cfg.policy
    batch = max(1, min(t.tasks_per_step, n_tasks))
    # the workers run elsewhere (other cwd, other nodes): a local store must be an absolute path
    store = cfg.store if "://" in cfg.store else str(Path(cfg.store).expanduser().resolve())
    micro = t.micro_batch_size  # sequences per GPU per forward pass
    response_len = max(p.max_new_tokens * cfg.env.step_limit * 2, 512)
    if t.lr_scheduler not in _SCHEDULES:
        raise ValueError(
            f"train.lr_scheduler {t.lr_scheduler!r} has no verl counterpart (verl has 'constant' and 'cosine'): "
            f"set train.lr_scheduler to one of {', '.join(_SCHEDULES)}"
        )
    attention, _ = attention_overrides(t.verl_attention, flash_attn_present=flash_attn_present)
    overrides = [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files=[{_quoted(train_file)}]",
        f"data.val_files=[{_quoted(train_file)}]",
        f"data.train_batch_size={batch}",
        f"data.max_prompt_length={p.max_context_tokens}",
        f"data.max_response_length={response_len}",
        "data.return_raw_chat=True",
        "data.filter_overlong_prompts=False",
        # never cut a prompt: verl's "left" drops the system message and the tool block
        "data.truncation=error",
        "data.dataloader_num_workers=0",
        f"data.seed={cfg.seed}",
        f"actor_rollout_ref.model.path={_quoted(model_path)}",
        f"actor_rollout_ref.model.lora_rank={t.lora_r if t.lora else 0}",
        f"actor_rollout_ref.model.lora_alpha={t.lora_alpha}",
        f"actor_rollout_ref.actor.optim.lr={t.lr}",
        f"actor_rollout_ref.actor.optim.lr_warmup_steps={t.warmup_steps}",
        f"actor_rollout_ref.actor.optim.lr_scheduler_type={_SCHEDULES[t.lr_scheduler]}",
        # one optimizer step per PPO epoch over the whole step's batch, as the local trainer
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_epochs={t.ppo_epochs}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.grad_clip={t.max_grad_norm}",
        # verl's loss clips with clip_ratio_low/high (fixed 0.2 unless set), not clip_ratio
        f"actor_rollout_ref.actor.clip_ratio={t.clip_eps}",
        f"actor_rollout_ref.actor.clip_ratio_low={t.clip_eps}",
        f"actor_rollout_ref.actor.clip_ratio_high={t.clip_eps}",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.actor.use_kl_loss={t.kl_coef > 0}",
        f"actor_rollout_ref.actor.kl_loss_coef={t.kl_coef}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.n={t.group_size}",
        f"actor_rollout_ref.rollout.temperature={p.temperature}",
        f"actor_rollout_ref.rollout.top_p={p.top_p}",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={_quoted(agent_loop_config)}",
        # "file": verl's per-step metrics as JSON lines (VERL_FILE_LOGGER_PATH), read into train_steps
        "trainer.logger=[console,file]",
        "trainer.use_v1=True",
        "trainer.project_name=coevolve",
        f"trainer.experiment_name={run_id}-round-{round_no}",
        f"trainer.default_local_dir={_quoted(out_dir)}",
        f"trainer.n_gpus_per_node={t.verl_gpus_per_node}",
        f"trainer.nnodes={t.verl_nodes}",
        f"trainer.total_training_steps={max(t.steps, 1)}",
        "trainer.total_epochs=1000",
        f"trainer.save_freq={max(t.steps, 1)}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
        "trainer.resume_mode=disable",
        # read by coevolve's agent loop on the rollout workers
        f"+coevolve.store={_quoted(store)}",
        f"+coevolve.run_id={run_id}",
        f"+coevolve.round={round_no}",
        f"+coevolve.env={cfg.env.name}",
        f"+coevolve.tool_format={p.tool_format}",
        f"+coevolve.step_limit={cfg.env.step_limit}",
        f"+coevolve.max_new_tokens={p.max_new_tokens}",
        # verl's dataloader drops the last partial batch: one pass over the tasks is this many steps
        f"+coevolve.steps_per_epoch={max(1, n_tasks // batch)}",
        *attention,
    ]
    return overrides + list(t.verl_overrides)


def compose_config(overrides: list[str], *, validate: bool = True) -> Any:
    """verl's ``ppo_trainer`` config with ``overrides`` applied (an OmegaConf DictConfig),
    checked by ``verl.utils.config.validate_config`` exactly as verl's launcher checks it."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    if validate:
        import importlib.util

        from omegaconf import OmegaConf
        from verl.trainer.main_ppo import need_critic, need_reference_policy
        from verl.utils.config import validate_config

        checked: Any = config
        if importlib.util.find_spec("vllm") is None and config.actor_rollout_ref.model.get("lora_rank", 0) > 0:
            # verl checks the LoRA rank against vLLM's allowed ranks by importing vLLM, which
            # cannot be installed on CPU machines: check everything else here (the GPU image
            # has vLLM and verl repeats the full check when it launches).
            checked = OmegaConf.merge(config, {"actor_rollout_ref": {"model": {"lora_rank": 0}}})
        validate_config(checked, use_reference_policy=need_reference_policy(checked), use_critic=need_critic(checked))
    return config


def launch_command(
    overrides: list[str],
    ray_address: str = "",
    python: str | None = None,
    *,
    working_dir: str | None = None,
    env: dict[str, str] | None = None,
) -> list[str]:
    """The argv that runs verl's trainer: locally, or as a Ray job on ``ray_address``.

    ``env``: variables the run needs, such as ``VERL_FILE_LOGGER_PATH`` (never credentials: the
    cluster's nodes have those). Locally they lead the command (``env K=V python -m ...``, so the
    printed line is complete); a Ray job carries them in its runtime env, with ``working_dir``
    (default: the directory holding the ``coevolve`` package, so every node runs the submitted code)."""
    if not ray_address:
        prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
        return [*prefix, python or sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    # on the cluster, the job's own interpreter (the image's), not this machine's path
    main = [python or "python", "-m", "verl.trainer.main_ppo", *overrides]
    root = working_dir or str(Path(__file__).resolve().parents[2])
    runtime_env = {
        "working_dir": root,
        "excludes": [".git", ".venv", "**/__pycache__", "*.parquet", "*.safetensors", "*.gguf"],
        "env_vars": {"PYTHONUNBUFFERED": "1", **(env or {})},
    }
    # `ray job submit` waits for the job and streams its logs (what the CLI shows)
    return [
        "ray",
        "job",
        "submit",
        f"--address={ray_address}",
        f"--runtime-env-json={json.dumps(runtime_env, sort_keys=True)}",
        "--",
        *main,
    ]


def format_command(argv: list[str]) -> str:
    """``argv`` as one shell line a user can paste."""
    return " ".join(shlex.quote(a) for a in argv)


def _quoted(value: str) -> str:
    """A path as a quoted Hydra override value: paths may hold ``=``, ``,`` or brackets
    (checkpoints live under ``.../round=<r>/``), which the override grammar would parse."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
