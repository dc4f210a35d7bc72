"""Environments: the contract (``coevolve.envs.base``) and the built-in adapters.

Importing this package registers the built-ins (``bfcl-v3``, ``agentdojo``) with
``coevolve.registry``; an adapter imports its benchmark package only when first used.
"""

from coevolve.envs import agentdojo as _agentdojo  # noqa: F401  (registers "agentdojo")
from coevolve.envs import bfcl as _bfcl  # noqa: F401  (registers "bfcl-v3")
from coevolve.envs.base import Environment, EnvironmentBase, Episode, EpisodeScore, Observation, ToolCall

__all__ = ["Environment", "EnvironmentBase", "Episode", "EpisodeScore", "Observation", "ToolCall"]
