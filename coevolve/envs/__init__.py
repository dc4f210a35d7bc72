"""Environments: the interface (``coevolve.envs.base``) and the built-in adapters.

Importing this package registers the built-ins (``bfcl-v3``) with ``coevolve.registry``.
"""

from coevolve.envs.base import Environment, Episode, EpisodeScore, Observation, ToolCall
from coevolve.envs import bfcl as _bfcl  # noqa: F401  (registers "bfcl-v3")

__all__ = ["Environment", "Episode", "EpisodeScore", "Observation", "ToolCall"]
