"""The environment interface every adapter implements (BFCL-V3 now; AppWorld later).

An ``Environment`` loads tasks and opens ``Episode`` objects; an episode owns all of its
state (no globals), is driven turn by turn by the rollout engine, and scores itself with
the benchmark's own checker at the end.

    env = registry.get("bfcl-v3")()
    ep = env.episode(task)
    for turn in range(ep.n_turns):
        msg = ep.user_message(turn)            # None when the turn brings no user message
        schemas = ep.tools(turn)               # OpenAI-style function schemas available now
        obs = ep.step(ToolCall("cd", {"folder": "document"}))
        ep.end_turn()
    score = ep.score()                         # EpisodeScore(success, reward, turn_passed, reason)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from coevolve.tasks import Task


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class Observation:
    content: str  # what the agent sees (a JSON string or an error message)
    error: str | None = None  # set when the call failed (unknown function, bad args, exception)


@dataclass
class EpisodeScore:
    success: bool  # as the benchmark scores the episode
    reward: float  # partial reward: fraction of turns passed, in [0, 1]
    turn_passed: list[bool] = field(default_factory=list)
    reason: str = ""  # why it failed (first failing check), "" on success


class Episode(Protocol):
    task: Task
    n_turns: int

    def user_message(self, turn: int) -> str | None: ...

    def tools(self, turn: int) -> list[dict[str, Any]]: ...

    def step(self, call: ToolCall) -> Observation: ...

    def end_turn(self) -> None: ...

    def score(self) -> EpisodeScore: ...


class Environment(Protocol):
    name: str

    def load_tasks(
        self,
        categories: list[str] | None = None,
        ids: list[str] | None = None,
        limit: int | None = None,
    ) -> list[Task]: ...

    def episode(self, task: Task) -> Episode: ...
