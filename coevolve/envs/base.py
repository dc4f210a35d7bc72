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
    score = ep.score()                         # EpisodeScore(success, reward, turn_passed, reason, ...)

``success`` is the benchmark's verdict (what evaluation reports); ``reward`` is the training
reward, defined in ``coevolve.reward`` from its parts ``progress`` and ``format``.
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
    reward: float  # training reward in [0, 1] (coevolve.reward.training_reward of the parts below)
    turn_passed: list[bool] = field(default_factory=list)
    reason: str = ""  # why it failed (first failing check), "" on success
    # Parts of the reward (coevolve.reward); None where an environment scores only `reward`.
    progress: float | None = None  # per-turn pass or reproduced share of the reference, x0.5 if failed
    format: float | None = None  # share of well-formed call attempts
    n_calls: int = 0  # call attempts seen (the engine adds unparseable messages)
    n_malformed: int = 0  # attempts that were not well formed


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

    # Benchmark environments also offer their held-out evaluation tasks (coevolve.evaluate.eval_tasks):
    #   def heldout_tasks(self, heldout: int | list[int], seed: int, scenarios: int = 0,
    #                     categories: list[str] | None = None) -> list[Task]
