"""The environment contract: everything the loop needs from an environment.

An ``Environment`` (registry kind ``"environment"``) loads tasks and opens ``Episode``
objects; an episode owns all of its state (no globals), is driven turn by turn by the
rollout engine, explorers and validation, and scores itself at the end.

    env = registry.resolve("environment", "bfcl-v3")()
    ep = env.episode(task)
    for turn in range(ep.n_turns):
        msg = ep.user_message(turn)            # None when the turn brings no user message
        schemas = ep.tools(turn)               # OpenAI-style function schemas available now
        obs = ep.step(ToolCall("cd", {"folder": "document"}))
        ep.reply("Done.")                      # the assistant's text answer of the turn
        ep.end_turn()
    score = ep.score()                         # EpisodeScore(success, reward, turn_passed, reason, ...)

Who calls what:

- evaluation: ``heldout_tasks`` (tasks with questions and ground truth, evaluation only);
- round 0 (``coevolve.synth``): ``training_states`` and ``scenario_of``; never a question,
  never a ground-truth call, nothing of a held-out scenario;
- exploration, abstraction, validation: ``start_state``, ``function_docs``, ``state_data``,
  ``episode``, ``observation_error``, ``value_roles``, ``safety_profile``;
- training and evaluation rollouts: ``episode``.

``success`` is the benchmark's verdict (what evaluation reports); ``reward`` is the training
reward, defined in ``coevolve.reward`` from its parts ``progress`` and ``format``.

The call and score types (``ToolCall``, ``Observation``, ``EpisodeScore``) live in
``coevolve.types``, which every layer imports; they are re-exported here.

``EnvironmentBase`` gives the optional methods their defaults. The contract test suite,
``tests/test_env_contract.py``, runs over every registered environment: an implementer runs
``pytest tests/test_env_contract.py -k <name>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from coevolve.tasks import Task
from coevolve.types import EpisodeScore, Observation, ToolCall

__all__ = ["Environment", "EnvironmentBase", "Episode", "EpisodeScore", "Observation", "ToolCall"]

if TYPE_CHECKING:
    from coevolve.roles import RoleTable
    from coevolve.safety import SafetyProfile


class Episode(Protocol):
    """One isolated run of a task. Never raises on agent input: every bad call is an error
    observation."""

    task: Task
    n_turns: int

    def user_message(self, turn: int) -> str | None:
        """The user's message opening ``turn`` (None: the turn brings none)."""
        ...

    def tools(self, turn: int) -> list[dict[str, Any]]:
        """OpenAI-style function schemas (``{"name", "description", "parameters"}``) available at ``turn``."""
        ...

    def step(self, call: ToolCall) -> Observation:
        """Execute one call in this episode's own state. Unknown names, arguments that do not
        validate, exceptions and failures the backend *returns* all set ``Observation.error``."""
        ...

    def end_turn(self) -> None:
        """Close the current turn (where the environment checks turns, check it now)."""
        ...

    def score(self) -> EpisodeScore:
        """The verdict (``success``, ``reason``) and the training reward's parts."""
        ...

    # Optional (the rollout engine and the template abstractor use them where present):
    #   def reply(self, text: str) -> None          the assistant's text answer of the turn
    #   def state_fingerprint(self) -> str          equal digests mean a call changed nothing
    #   def request_problem(self, call) -> str | None   why no user would ask for this call now
    #                                               (exploration refuses it, the quality gate too)


class Environment(Protocol):
    name: str
    categories: list[str]  # the task categories (BFCL-V3: its four multi-turn categories; AgentDojo: suites)

    def load_tasks(
        self, categories: list[str] | None = None, ids: list[str] | None = None, limit: int | None = None
    ) -> list[Task]:
        """Benchmark tasks (with questions and ground truth: evaluation side only)."""
        ...

    def heldout_tasks(
        self, heldout: int | list[int], seed: int, scenarios: int = 0, categories: list[str] | None = None
    ) -> list[Task]:
        """Evaluation tasks: ``scenarios`` (0 = all) of the held-out scenarios ``heldout`` (a count
        drawn with ``seed`` or a list of indices, as ``env.heldout_scenarios``)."""
        ...

    def training_states(self, heldout: int | list[int], seed: int, categories: list[str] | None = None) -> list[Task]:
        """State-only tasks (``turns == []``, ``reference_actions == []``) of the training
        scenarios: everything round 0 may synthesize from."""
        ...

    def scenario_of(self, task: Task) -> str:
        """The scenario a state-only task belongs to (round 0 draws scenarios, not tasks)."""
        ...

    # Optional (evaluation side): ``heldout_states(heldout, seed, categories)``, state-only
    # tasks of the held-out scenarios, as ``training_states`` gives those of the training
    # scenarios. The held-out synthesized split (``coevolve.synth.synthesize_heldout``) is
    # synthesized from them; an environment without it (AgentDojo: its held-out user tasks
    # start from the same suite states as the training ones) has no such split.

    def episode(self, task: Task) -> Episode:
        """A fresh, isolated episode of ``task`` from its initial state."""
        ...

    def function_docs(self, task: Task) -> list[dict[str, Any]]:
        """Docs of the functions of ``task`` (name, description, JSON-schema parameters with
        types, enums, required): what explorers fill arguments from."""
        ...

    def start_state(self, task: Task) -> Task:
        """The state-only task exploration starts from (one open turn, every tool available)."""
        ...

    def state_data(self, initial_state: dict[str, Any]) -> Any:
        """The environment's data in a start state (no bookkeeping): what explorers harvest
        argument values from."""
        ...

    def observation_error(self, obs: Observation) -> str | None:
        """The error an observation reports, or None: raised errors, and the failure results a
        backend *returns* (not found, unknown, a false status), in this environment's shapes."""
        ...

    def value_roles(self) -> RoleTable:
        """What the environment's parameters and state values are (``coevolve.roles``):
        where names mislead, what its state's dict keys are, which values a task may make up."""
        ...

    def safety_profile(self) -> SafetyProfile:
        """The roles of the environment's actions for the validation safety rules."""
        ...

    def domain_text(self) -> list[str]:
        """Text of the environment's domain that a from-scratch tokenizer learns from (model
        ``tiny:<environment>``): tool docs and training-state values, never a benchmark's
        questions or answers nor anything of a held-out scenario. May be empty."""
        ...


class EnvironmentBase:
    """Defaults of the contract's optional parts; adapters subclass it and override."""

    name = ""
    categories: list[str] = []

    def own_categories(self, requested: list[str] | None) -> list[str]:
        """``requested`` if they are all this environment's categories; all of them when none is
        requested or when none of the requested names is this environment's (the setting was
        written for another environment, e.g. BFCL's ``synth.categories`` on AgentDojo)."""
        if not requested:
            return list(self.categories)
        mine = [c for c in requested if c in self.categories]
        if not mine:
            return list(self.categories)
        foreign = [c for c in requested if c not in self.categories]
        if foreign:
            raise ValueError(f"{self.name}: unknown categories {foreign}; known: {self.categories}")
        return mine

    def scenario_of(self, task: Task) -> str:
        return task.task_id

    def start_state(self, task: Task) -> Task:
        start = Task.from_row(task.to_row())  # the state exactly as a tasks row stores it
        start.turns, start.reference_actions = [""], [[]]
        return start

    def state_data(self, initial_state: dict[str, Any]) -> Any:
        return initial_state

    def observation_error(self, obs: Observation) -> str | None:
        return obs.error

    def safety_profile(self) -> SafetyProfile:
        from coevolve.safety import SafetyProfile

        return SafetyProfile()

    def value_roles(self) -> RoleTable:
        from coevolve.roles import RoleTable

        return RoleTable()

    def domain_text(self) -> list[str]:
        return []
