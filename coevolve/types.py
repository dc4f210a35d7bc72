"""The call and score types every layer shares: what an agent calls, what it observes, how an
episode is scored.

    call = ToolCall("cd", {"folder": "document"})       # parsed by coevolve.policy.parsing
    obs = episode.step(call)                             # Observation(content, error)
    score = episode.score()                              # EpisodeScore(success, reward, ...)

A ground-floor module (it imports nothing of coevolve): environments (``coevolve.envs``),
policies and their parser (``coevolve.policy``), the reward (``coevolve.reward``), the rollout
engine, explorers and validation all import these from here. ``coevolve.envs.base``, the
environment contract, re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class Observation:
    content: str  # what the agent sees (a JSON string or an error message)
    error: str | None = None  # set when the call failed (unknown function, bad args, exception, domain error)


@dataclass
class EpisodeScore:
    success: bool  # as the benchmark scores the episode
    reward: float  # training reward in [0, 1] (coevolve.reward.training_reward of the parts below)
    turn_passed: list[bool] = field(default_factory=list)
    reason: str = ""  # why it failed (first failing check), "" on success
    # Parts of the reward (coevolve.reward); None where an environment scores only `reward`.
    progress: float | None = None  # per-turn pass or reproduced share of the reference, x0.5 if failed
    format: float | None = None  # share of well-formed call attempts
    n_calls: int = 0  # call attempts seen (the engine adds unparseable messages)
    n_malformed: int = 0  # attempts that were not well formed
