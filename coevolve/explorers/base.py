"""What every explorer shares: the context it explores, its session, the step record.

``coevolve.explore`` (the stage) builds ``ExploreContext``s and drives ``Session``s; an
explorer (registry kind ``"explorer"``) proposes the next call of many sessions at once.
Explorers import this module, never the stage, so there is no import cycle.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from coevolve.envs.base import Environment, Episode
from coevolve.types import Observation, ToolCall
from coevolve.tasks import Task


@dataclass
class ExploreContext:
    """Where one signal sends the explorer."""

    signal_id: str
    signal_type: str  # forgetting | boundary | rare | random | fallback | static
    task: Task  # the start state (its initial_state) and the tools available; turns/reference are never read
    focus: list[str]  # function names to focus on; for rare patterns, the pattern in order
    evidence: list[dict[str, Any]] = field(default_factory=list)  # failed attempt: action_name/args/observation/error
    sequence: bool = False  # True: the focus tools form a pattern to perform consecutively
    avoid: frozenset[str] = frozenset()  # functions the explorer must not call (safety policy)
    coverage: bool = False  # True: reach every focus tool once (coverage), rather than dwell on the focus


@dataclass
class Step:
    """One executed (or attempted) exploration step."""

    name: str | None  # None when the explorer produced no call
    arguments: dict[str, Any]
    observation: str
    error: str | None


def observed_error(obs: Observation, env: Environment | None = None) -> str | None:
    """The error an observation reports: ``env.observation_error`` where the environment is
    known (its own convention), else ``obs.error``."""
    if env is not None and hasattr(env, "observation_error"):
        return env.observation_error(obs)
    return obs.error


def result_data(env: Environment | None, content: str, function: str = "") -> Any:
    """A call's result as data (a dict, list or scalar), for harvesting its values: the
    environment's own reading (``result_data(content, function)``: BFCL's Python literals,
    AgentDojo's YAML) where it has one, else JSON; None when the text is neither."""
    reader = getattr(env, "result_data", None)
    if reader is not None:
        return reader(content, function)
    try:
        return json.loads(content)
    except (json.JSONDecodeError, TypeError):
        return None


@dataclass
class Session:
    """One exploration run: a fresh episode of the context's task and its history so far."""

    context: ExploreContext
    run_idx: int
    episode: Episode
    docs: dict[str, dict[str, Any]]  # function name -> function doc (parameters, description)
    rng: random.Random
    budget: int  # steps of this run in all
    history: list[Step] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)  # explorer-private state (a chat, a cursor)
    env: Environment | None = None  # the environment (its observation_error and state_data conventions)

    def execute(self, call: ToolCall | None, failure: str = "") -> Step:
        """Run ``call`` in the episode (or record that no call was produced) and remember it."""
        refused = _request_problem(self.episode, call) if call is not None else None
        if call is None:
            step = Step(None, {}, failure[:500], failure or "no call")
        elif refused:  # a call no user would ask for is not made: a task must not be built on it
            step = Step(call.name, dict(call.arguments), f"refused: {refused}", f"refused: {refused}")
        else:
            try:
                obs = self.episode.step(call)
            except Exception as exc:  # an adapter bug must not end the round: it is a failed step
                obs = Observation(f"error: {exc}", error=f"{type(exc).__name__}: {exc}")
            step = Step(call.name, dict(call.arguments), obs.content, observed_error(obs, self.env))
        self.history.append(step)
        return step

    def state_data(self) -> Any:
        """The start state's data as the environment exposes it (``Environment.state_data``)."""
        state = self.context.task.initial_state
        return self.env.state_data(state) if self.env is not None else state


def _request_problem(episode: Episode, call: ToolCall) -> str | None:
    """The episode's ``request_problem`` verdict on ``call`` (None where it has none)."""
    judge = getattr(episode, "request_problem", None)
    return judge(call) if judge is not None else None


class Explorer(Protocol):
    """An explorer proposes the next call of many sessions at once (so LLM explorers batch)."""

    signal_guided: bool  # False: contexts are drawn at random instead of from the signals

    def propose(self, sessions: list[Session]) -> list[ToolCall | str]:
        """One proposal per session: a call to execute, or a string saying why there is none."""
        ...
