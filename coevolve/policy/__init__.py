"""Policies: the model layer every stage that runs a model goes through.

    policy = load_policy(cfg.policy)                 # backend by name: "local" or "openai"
    policy = load_policy(cfg.policy, checkpoint)     # a trained checkpoint instead of cfg.model
    gens = policy.chat(conversations, tools, SamplingParams(...), meta)

Backends register themselves in the registry under kind "policy"; importing this package
registers the built-in ones.
"""

from __future__ import annotations

from coevolve.config import PolicyConfig
from coevolve.policy import local as _local  # noqa: F401  (registers "local")
from coevolve.policy import openai as _openai  # noqa: F401  (registers "openai")
from coevolve.policy.base import Generation, Message, Policy, SamplingParams
from coevolve.registry import resolve

__all__ = ["Generation", "Message", "Policy", "SamplingParams", "load_policy"]


def load_policy(cfg: PolicyConfig, checkpoint: str | None = None) -> Policy:
    """Build the policy backend ``cfg.backend`` (registry kind "policy").

    ``checkpoint`` (a local HF directory, or a model id for endpoints) overrides ``cfg.model``;
    the policy's ``version`` is what was loaded, recorded as ``rollouts.policy_version``.
    """
    return resolve("policy", cfg.backend)(cfg, checkpoint)
