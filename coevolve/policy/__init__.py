"""Policies: the model layer every stage that runs a model goes through.

    policy = load_policy(cfg.policy)                 # backend by name: "local" or "openai"
    policy = load_policy(cfg.policy, checkpoint)     # a trained checkpoint instead of cfg.model
    gens = policy.chat(conversations, tools, SamplingParams(...), meta)

The built-in backends are registered here (registry kind "policy") as factories that import
their module on first use, so importing ``coevolve.policy.*`` stays cheap (the local backend
pulls in torch and transformers, seconds on a CPU) for code that only needs the parser,
the prompts or the replay policy. The backends import the package's ground floor,
``coevolve.policy.base`` (the interface and ``row_seed``), never the package itself.
"""

from __future__ import annotations

from coevolve.config import PolicyConfig
from coevolve.policy.base import Generation, Message, Policy, SamplingParams, row_seed
from coevolve.registry import register, resolve

__all__ = ["Generation", "Message", "Policy", "SamplingParams", "load_policy", "row_seed"]


@register("policy", "local")
def _local(cfg: PolicyConfig, checkpoint: str | None = None) -> Policy:
    from coevolve.policy.local import LocalPolicy

    return LocalPolicy(cfg, checkpoint)


@register("policy", "openai")
def _openai(cfg: PolicyConfig, checkpoint: str | None = None) -> Policy:
    from coevolve.policy.openai import OpenAIPolicy

    return OpenAIPolicy(cfg, checkpoint)


def load_policy(cfg: PolicyConfig, checkpoint: str | None = None) -> Policy:
    """Build the policy backend ``cfg.backend`` (registry kind "policy", or a "module:Class" path).

    ``checkpoint`` (a local HF directory, or a model id for endpoints) overrides ``cfg.model``;
    the policy's ``version`` is what was loaded, recorded as ``rollouts.policy_version``.
    """
    return resolve("policy", cfg.backend)(cfg, checkpoint)
