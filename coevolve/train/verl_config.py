"""verl's own Hydra config (``ppo_trainer``) composed with coevolve's overrides, validated.

    overrides = build_overrides(cfg, model_path=..., train_file=..., agent_loop_config=..., out_dir=...)
    config = compose_config(overrides)        # raises if verl's validator rejects it
    cmd = launch_command(overrides, cfg.train.verl_ray_address)

The overrides map coevolve's ``TrainConfig`` onto verl: GRPO advantages, the policy path,
rollout n (the group size), batch sizes, vLLM as the rollout engine, coevolve's agent loop
(``coevolve.train.verl_agent_loop``) and the cluster shape. ``train.verl_overrides`` are
appended last, so a user can change anything verl knows. A ``coevolve`` section carries
what the agent loop needs on the workers (store, run id, round, environment, prompts).

verl is imported only inside ``compose_config`` (``import verl`` takes seconds).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coevolve.config import RunConfig

AGENT_NAME = "coevolve"


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
) -> list[str]:
    """Hydra overrides (``key=value`` strings) that turn verl's defaults into this round's run.

    ``train_file``: the exported Parquet (``verl_data.export_tasks``); ``agent_loop_config``:
    the YAML registering coevolve's agent loop; ``out_dir``: where verl writes checkpoints;
    ``n_tasks``: tasks in the file (the batch cannot be larger).
    """
    t, p = cfg.train, cfg.policy
    batch = max(1, min(t.tasks_per_step, n_tasks))
    # the workers run elsewhere (other cwd, other nodes): a local store must be an absolute path
    store = cfg.store if "://" in cfg.store else str(Path(cfg.store).expanduser().resolve())
    micro = 1  # sequences per GPU per forward pass; verl packs them with dynamic batching off
    response_len = max(p.max_new_tokens * cfg.env.step_limit * 2, 512)
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
        "data.truncation=left",
        "data.dataloader_num_workers=0",
        f"data.seed={cfg.seed}",
        f"actor_rollout_ref.model.path={_quoted(model_path)}",
        f"actor_rollout_ref.model.lora_rank={t.lora_r if t.lora else 0}",
        f"actor_rollout_ref.model.lora_alpha={t.lora_alpha}",
        f"actor_rollout_ref.actor.optim.lr={t.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.clip_ratio={t.clip_eps}",
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
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={_quoted(agent_loop_config)}",
        "trainer.logger=[console]",
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


def launch_command(overrides: list[str], ray_address: str = "", python: str | None = None) -> list[str]:
    """The argv that runs verl's trainer: locally, or as a Ray job on ``ray_address``."""
    main = [python or sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    if not ray_address:
        return main
    # `ray job submit` waits for the job and streams its logs (what the CLI shows)
    return ["ray", "job", "submit", f"--address={ray_address}", "--", *main]


def format_command(argv: list[str]) -> str:
    """``argv`` as one shell line a user can paste."""
    return " ".join(shlex.quote(a) for a in argv)


def _quoted(value: str) -> str:
    """A path as a quoted Hydra override value: paths may hold ``=``, ``,`` or brackets
    (checkpoints live under ``.../round=<r>/``), which the override grammar would parse."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
