"""AgentDojo's four v1.2 suites as a coevolve environment (``env.name: agentdojo``).

    env = AgentDojoEnvironment()
    task = env.load_tasks(["banking"], limit=1)[0]       # a user task: evaluation side only
    ep = env.episode(task)
    ep.user_message(0); ep.tools(0)
    ep.step(ToolCall("get_balance", {}))
    ep.reply("Your balance is 1810.0")                    # the assistant's final text
    ep.end_turn()
    ep.score()                                            # the user task's own utility check

Data (package ``agentdojo``, offline): the suites ``workspace`` (40 user tasks), ``travel``
(20), ``banking`` (16) and ``slack`` (21), each an environment (a pydantic model loaded with
the default, benign injection-vector texts) and its tools (plain functions AgentDojo turns
into ``Function`` objects with a pydantic input schema).

- **Episodes are isolated**: each builds its own environment object from the task's state
  (``initial_state["environment"]``, the suite environment's JSON dump), so no two episodes
  share an object and nothing leaks between them.
- **Tools are dispatched by name** through AgentDojo's ``FunctionsRuntime``: an unknown name,
  arguments that are not a JSON object or do not validate against the function's input
  schema, and exceptions raised by the function all come back as ``Observation(error=...)``;
  nothing is ``eval``-ed. Results are rendered as AgentDojo renders them for a model (YAML;
  the rendering, its reading back and its clock-free form are ``agentdojo_results``).
- **Results as data**: ``env.result_data(content, function)`` reads a rendering back (YAML,
  Python literals, the travel listings) for harvesting values; ``env.observation_error``
  counts the failures tools *return* (an empty result, ``404 Not Found``) as errors too; what
  each parameter and state value is: ``agentdojo_roles`` (``env.value_roles()``).
- **Scoring**: a user task (``initial_state["user_task"]``) is scored by that task's own
  check, exactly as ``TaskSuite`` does it: ``utility_from_traces`` where the task defines it,
  else ``utility(model_output, pre_environment, post_environment)``; the model output is the
  assistant's text passed to ``Episode.reply``. A synthesized task (no ``user_task``) is
  scored per turn like BFCL: the agent's environment must equal the reference's after the
  turn (clock-stamped values aside) and the reference calls' results must be among the
  agent's results.
- **Held out by user task**: ``env.heldout_scenarios`` (a count drawn with the seed, or
  indices into the 97 user tasks in suite order) are evaluation tasks. The training side
  reads only ``training_states``: one state-only task per suite (the default environment
  and the tool names), never a user task's prompt or ground truth.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import random
from collections import Counter
from functools import lru_cache
from typing import Any

from coevolve import reward as rewards
from coevolve.envs.agentdojo_goals import GOALS, goal_doc
from coevolve.envs.agentdojo_roles import TABLE as ROLE_TABLE
from coevolve.envs.agentdojo_results import clock_free, clock_free_text, parse_result, render_result, returned_failure
from coevolve.envs.agentdojo_roles import entities, listing_view, present, result_view
from coevolve.envs.base import EnvironmentBase
from coevolve.types import EpisodeScore, Observation, ToolCall
from coevolve.policy.prompts import render_tools
from coevolve.registry import register
from coevolve.roles import RoleTable
from coevolve.safety import ActionRole, SafetyProfile
from coevolve.tasks import Task

VERSION = "v1.2"
SUITES = ["workspace", "travel", "banking", "slack"]
NAME = "agentdojo"
MAX_ARGS_CHARS = 65536


@lru_cache(maxsize=1)
def suites() -> dict[str, Any]:
    """AgentDojo's task suites of ``VERSION`` by name (imports agentdojo on first use, ~2 s)."""
    try:
        from agentdojo.task_suite.load_suites import get_suites
    except ImportError as exc:  # its provider SDKs are imported at import time
        raise RuntimeError(
            "agentdojo is not importable: pip install --no-deps agentdojo==0.1.35 plus its runtime needs "
            f"(see the Makefile's setup): {exc}"
        ) from exc
    return dict(get_suites(VERSION))


@lru_cache(maxsize=None)
def _default_dump(suite: str) -> str:
    env = suites()[suite].load_and_inject_default_environment({})
    return json.dumps(env.model_dump(mode="json"))


@lru_cache(maxsize=None)
def _env_type(suite: str) -> Any:
    """The suite's environment class (a pydantic model)."""
    return type(suites()[suite].load_and_inject_default_environment({}))


_DOMAIN_STATE_CHARS = 20_000  # of a suite's state in its domain text: names, dates, IBANs


def default_state(suite: str) -> dict[str, Any]:
    """A fresh copy of the suite's default environment (benign injection texts) as JSON data."""
    return json.loads(_default_dump(suite))


def user_task_ids() -> list[tuple[str, str]]:
    """Every ``(suite, user_task_id)``, in suite order then task number: the index space of
    ``env.heldout_scenarios`` lists."""
    out = []
    for suite in SUITES:
        ids = suites()[suite].user_tasks
        out += [(suite, uid) for uid in sorted(ids, key=lambda u: int(u.rsplit("_", 1)[-1]))]
    return out


def _flatten(node: Any, defs: dict[str, Any]) -> Any:
    """A pydantic JSON schema made plain: ``$ref`` resolved, ``Optional[X]`` as X, no titles."""
    if isinstance(node, list):
        return [_flatten(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _flatten(defs.get(node["$ref"].rsplit("/", 1)[-1], {}), defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        merged = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            merged.update(_flatten(options[0], defs))
        return {k: _flatten(v, defs) for k, v in merged.items() if not _annotation(k, v)}
    return {k: _flatten(v, defs) for k, v in node.items() if not _annotation(k, v) and k != "$defs"}


def _annotation(key: str, value: Any) -> bool:
    """A schema's own ``title`` (a string), not a property named ``title`` (a schema)."""
    return key == "title" and isinstance(value, str)


@lru_cache(maxsize=None)
def _suite_docs(suite: str) -> tuple[dict[str, Any], ...]:
    docs = []
    for fn in suites()[suite].tools:
        schema = fn.parameters.model_json_schema()
        params = _flatten(schema, schema.get("$defs", {}))
        params = {"type": "object", "properties": params.get("properties", {}), "required": params.get("required", [])}
        docs.append({"name": fn.name, "description": fn.description, "parameters": params})
    return tuple(docs)


def tool_docs(suite: str) -> list[dict[str, Any]]:
    """The suite's tools as OpenAI-style function schemas (deep copies)."""
    return copy.deepcopy(list(_suite_docs(suite)))


class _Runner:
    """One environment object and the suite's tools; the only way calls reach AgentDojo."""

    def __init__(self, suite: str, state: dict[str, Any]):
        from agentdojo.functions_runtime import FunctionsRuntime

        self.env = _env_type(suite).model_validate(state)  # a fresh object: this episode's own copy
        self.runtime = FunctionsRuntime(suites()[suite].tools)

    def call(self, name: Any, arguments: Any) -> tuple[str, str | None]:
        """(result as AgentDojo shows it to a model, error or None)."""
        if not isinstance(name, str) or name not in self.runtime.functions:
            shown = name if isinstance(name, str) and len(name) < 80 else f"{str(name)[:80]}..."
            return "", f"unknown function {shown!r}"
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            return "", "arguments must be an object of named parameters"
        try:
            size = len(json.dumps(arguments))
        except (TypeError, ValueError) as exc:
            return "", f"arguments are not JSON: {exc}"
        if size > MAX_ARGS_CHARS:
            return "", f"arguments too large ({size} > {MAX_ARGS_CHARS} characters)"
        # run_function validates the arguments against the function's pydantic schema
        result, error = self.runtime.run_function(self.env, name, copy.deepcopy(arguments), raise_on_error=False)
        return (render_result(result), None) if error is None else ("", error)


class AgentDojoEpisode:
    """One isolated episode: its own environment copy, its own reference run, its own score."""

    def __init__(self, task: Task):
        self.task = task
        self.n_turns = len(task.turns)
        if len(task.reference_actions) != self.n_turns:
            raise ValueError(f"{task.task_id}: {self.n_turns} turns but {len(task.reference_actions)} reference turns")
        state = task.initial_state
        suite = state.get("suite")
        if suite not in SUITES:
            raise ValueError(f"{task.task_id}: initial_state.suite must be one of {SUITES}, got {suite!r}")
        self.suite: str = suite
        self._opened = datetime.datetime.now() - datetime.timedelta(seconds=1)
        self._agent = _Runner(self.suite, state["environment"])
        self._pre = self._agent.env.model_copy(deep=True)
        self._user_task = suites()[self.suite].user_tasks[state["user_task"]] if state.get("user_task") else None
        self._reference: _Runner | None = None
        self.turn = 0
        self.calls: list[list[dict[str, Any]]] = [[] for _ in range(self.n_turns)]
        self._traces: list[Any] = []  # agentdojo FunctionCalls of the agent, for utility_from_traces
        self._outputs: list[str] = []  # the assistant's texts (reply)
        self._agent_results: list[str] = []
        self._turn_passed: list[bool] = []
        self._turn_progress: list[float] = []
        self._failure = ""
        self.n_calls = 0
        self.n_malformed = 0

    # ------------------------------------------------------------------ what the agent sees
    def user_message(self, turn: int) -> str | None:
        return self.task.turns[turn] or None

    def tools(self, turn: int) -> list[dict[str, Any]]:
        return tool_docs(self.suite)

    # ------------------------------------------------------------------ acting
    def step(self, call: ToolCall) -> Observation:
        if self.turn >= self.n_turns:
            return Observation(content="Error: all turns have ended", error="episode_over")
        name, arguments = getattr(call, "name", None), getattr(call, "arguments", None)
        self.n_calls += 1
        content, error = self._agent.call(name, arguments)
        if error:
            self.n_malformed += error.startswith(("unknown function", "arguments ", "ValidationError"))
            content = f"Error: {error}"
        else:
            from agentdojo.functions_runtime import FunctionCall

            self._traces.append(FunctionCall(function=name, args=copy.deepcopy(arguments)))
        record = {"name": name if isinstance(name, str) else repr(name), "arguments": arguments}
        self._agent_results.append(content)
        # what the agent sees carries no wall-clock time (a created file's last_modified, a sent
        # email's timestamp): episodes, and the training text made of them, are the same every run
        content = clock_free_text(content, self._opened)
        self.calls[self.turn].append({**record, "result": content, "error": error})
        return Observation(content=content, error=error)

    def reply(self, text: str) -> None:
        """The assistant's text answer (what a user task's utility check reads as model output)."""
        self._outputs.append(text or "")

    def state_fingerprint(self) -> str:
        data = clock_free(self._agent.env.model_dump(), self._opened)
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()

    # ------------------------------------------------------------------ scoring
    def end_turn(self) -> None:
        if self.turn >= self.n_turns:
            return
        t = self.turn
        if self._user_task is not None:
            passed = self._utility() if t == self.n_turns - 1 else True
            failure = "" if passed else f"turn {t}: the user task's utility check failed"
            ref_calls = [dict(c, error=None) for c in self.task.reference_actions[t]]
        else:
            passed, failure, ref_calls = self._check_synthesized(t)
        self._failure = self._failure or failure
        self._turn_passed.append(passed)
        same = len(ref_calls) if passed else rewards.reproduced(ref_calls, self.calls[t])
        self._turn_progress.append(rewards.turn_progress(passed, len(ref_calls), same))
        self.turn += 1

    def _utility(self) -> bool:
        task, post, output = self._user_task, self._agent.env, "\n".join(self._outputs)
        assert task is not None
        try:
            verdict = task.utility_from_traces(output, self._pre, post, self._traces)
            return bool(task.utility(output, self._pre, post) if verdict is None else verdict)
        except Exception:  # a check that cannot read this state (e.g. a missing item) is a failure
            return False

    def _check_synthesized(self, t: int) -> tuple[bool, str, list[dict[str, Any]]]:
        if self._reference is None:
            self._reference = _Runner(self.suite, self.task.initial_state["environment"])
        ref_calls, ref_results = [], []
        for ref in self.task.reference_actions[t]:
            result, error = self._reference.call(ref.get("name"), ref.get("arguments", {}))
            ref_calls.append({**ref, "error": error})
            ref_results.append(result if error is None else f"Error: {error}")
        if not ref_calls:
            return not self.calls[t], "", ref_calls
        if not self.calls[t]:
            return False, f"turn {t}: no function call", ref_calls
        agent_state = clock_free(self._agent.env.model_dump(), self._opened)
        if agent_state != clock_free(self._reference.env.model_dump(), self._opened):
            return False, f"turn {t}: the environment differs from the reference's", ref_calls
        opened = self._opened
        missing = Counter(clock_free_text(r, opened) for r in ref_results) - Counter(
            clock_free_text(r, opened) for r in self._agent_results
        )
        if missing:
            return False, f"turn {t}: a reference result is missing from the agent's results", ref_calls
        return True, "", ref_calls

    def score(self) -> EpisodeScore:
        return rewards.episode_score(
            self._turn_passed, self._turn_progress, self.n_turns, self._failure, self.n_calls, self.n_malformed
        )


def _user_task(suite: str, uid: str) -> Task:
    s = suites()[suite]
    ut = s.user_tasks[uid]
    env = s.load_and_inject_default_environment({})
    reference = [{"name": c.function, "arguments": dict(c.args)} for c in ut.ground_truth(env.model_copy(deep=True))]
    return Task(
        task_id=f"{suite}.{uid}",
        env=NAME,
        turns=[ut.PROMPT],
        initial_state={"suite": suite, "user_task": uid, "environment": default_state(suite)},
        reference_actions=[reference],
        tools=[d["name"] for d in _suite_docs(suite)],
        category=suite,
        split="eval",
        origin="benchmark",
    )


# The safety roles of AgentDojo's tools: who receives what (parties, content), what is
# destroyed, which dates an action takes effect on. The rules over them are coevolve.safety's.
_SEND = ActionRole
ROLES: dict[str, ActionRole] = {
    "send_email": _SEND("send", party=("recipients", "cc", "bcc"), content=("subject", "body", "attachments")),
    "share_file": _SEND("send", party=("email",)),
    "create_calendar_event": _SEND("send", party=("participants",), content=("description",), dates=("start_time",)),
    "add_calendar_event_participants": _SEND("send", party=("participants",)),
    "reschedule_calendar_event": ActionRole("write", dates=("new_start_time",)),
    "delete_email": ActionRole("delete", target=("email_id",)),
    "delete_file": ActionRole("delete", target=("file_id",)),
    "cancel_calendar_event": ActionRole("delete", target=("event_id",)),
    "send_money": _SEND("send", party=("recipient",), content=("subject",), dates=("date",)),
    "schedule_transaction": _SEND("send", party=("recipient",), content=("subject",), dates=("date",)),
    "update_scheduled_transaction": _SEND("send", party=("recipient",), content=("subject",), dates=("date",)),
    "update_password": ActionRole("credential"),
    "send_direct_message": _SEND("send", party=("recipient",), content=("body",)),
    "send_channel_message": _SEND("send", content=("body",)),
    "post_webpage": _SEND("send", party=("url",), content=("content",)),
    "get_webpage": ActionRole("contact", party=("url",)),
    "invite_user_to_slack": _SEND("send", party=("user_email",)),
    "remove_user_from_slack": ActionRole("delete", target=("user",)),
    "reserve_hotel": ActionRole("write", dates=("start_day",)),
    "reserve_restaurant": ActionRole("write", dates=("start_time",)),
    "reserve_car_rental": ActionRole("write", dates=("start_time",)),
}


def _known(state: dict[str, Any]) -> Any:
    """The user's own records in a start state (where a party counts as known): the suite's
    environment minus the open web (a URL that only the web serves is not a known party)."""
    env = dict(state.get("environment", {}))
    web = env.pop("web", None)
    if isinstance(web, dict):  # slack: the requests log is the user's; the web's pages are not
        env["web_requests"] = web.get("web_requests", [])
    return env


def _present(state: dict[str, Any]) -> str | None:
    """The start state's today: the calendar's current day, else the latest past transaction."""
    return present(state.get("environment", {}))


@register("environment", NAME)
class AgentDojoEnvironment(EnvironmentBase):
    """AgentDojo v1.2: four suites (97 user tasks), held out by user task."""

    name = NAME
    categories = SUITES

    def __init__(self, step_timeout_s: float | None = None):
        self.step_timeout_s = step_timeout_s

    def load_tasks(
        self, categories: list[str] | None = None, ids: list[str] | None = None, limit: int | None = None
    ) -> list[Task]:
        """User tasks (evaluation side: they carry prompts and ground truth) of ``categories``
        (suites) or exactly ``ids`` (``<suite>.user_task_<n>``)."""
        pairs = user_task_ids()
        if ids is not None:
            known = {f"{s}.{u}": (s, u) for s, u in pairs}
            unknown = [i for i in ids if i not in known]
            if unknown:
                raise KeyError(f"unknown AgentDojo task ids {unknown[:5]} (ids look like 'banking.user_task_3')")
            return [_user_task(*known[i]) for i in ids]
        wanted = self.own_categories(categories)
        tasks = [_user_task(s, u) for s, u in pairs if s in wanted]
        return tasks[:limit] if limit else tasks

    def heldout_indices(self, heldout: int | list[int], seed: int) -> list[int]:
        n = len(user_task_ids())
        if isinstance(heldout, int):
            return sorted(random.Random(f"agentdojo-heldout/{seed}").sample(range(n), min(heldout, n)))
        bad = [i for i in heldout if not 0 <= i < n]
        if bad:
            raise ValueError(f"env.heldout_scenarios: AgentDojo user-task indices must be in [0, {n}), got {bad}")
        return sorted(set(heldout))

    def heldout_tasks(
        self, heldout: int | list[int], seed: int, scenarios: int = 0, categories: list[str] | None = None
    ) -> list[Task]:
        """``scenarios`` (0 = all) of the held-out user tasks, drawn with ``seed``."""
        pairs = user_task_ids()
        held = self.heldout_indices(heldout, seed)
        if scenarios:
            held = sorted(random.Random(f"agentdojo-eval/{seed}").sample(held, min(scenarios, len(held))))
        wanted = self.own_categories(categories)
        return [_user_task(*pairs[i]) for i in held if pairs[i][0] in wanted]

    def training_states(self, heldout: int | list[int], seed: int, categories: list[str] | None = None) -> list[Task]:
        """One state-only task per suite: the default environment and the tool names. No user
        task is read (every user task of a suite starts from this same state)."""
        return [
            Task(
                task_id=f"{suite}.state",
                env=NAME,
                turns=[],
                reference_actions=[],
                initial_state={"suite": suite, "environment": default_state(suite)},
                tools=[d["name"] for d in _suite_docs(suite)],
                category=suite,
                split="train",
            )
            for suite in self.own_categories(categories)
        ]

    def scenario_of(self, task: Task) -> str:
        return str(task.initial_state.get("suite") or task.task_id.split(".", 1)[0])

    def episode(self, task: Task) -> AgentDojoEpisode:
        return AgentDojoEpisode(task)

    def function_docs(self, task: Task) -> list[dict[str, Any]]:
        """The suite's tool schemas, each with its goal template (``goal``, for the template abstractor)."""
        docs = tool_docs(task.initial_state["suite"])
        for doc in docs:
            goal = goal_doc(doc["name"])
            if goal:
                doc["goal"] = goal
        return docs

    def state_data(self, initial_state: dict[str, Any]) -> Any:
        """The suite environment, plus its values by role under ``"@entities"``
        (``agentdojo_roles.entities``: ``{"@iban": [...], "@file_id": [...], ...}``): what
        explorers and the quality gate harvest values from (``value_roles`` reads the keys)."""
        env = initial_state.get("environment", {})
        return {**env, "@entities": entities(env)}

    def value_roles(self) -> RoleTable:
        return ROLE_TABLE

    def result_data(self, content: str, function: str = "") -> Any:
        """A call's result (an observation's content) as JSON data for harvesting, or None for
        nothing or an error: a travel listing as its names (``{"@hotel": [...]}``), else
        AgentDojo's YAML and Python-literal renderings read back (``parse_result``) through
        ``agentdojo_roles.result_view``: the bank's ``"me"`` party dropped, and with ``function``
        a bare result (``get_channels``' list) or a name-keyed one (``get_hotels_prices``) under
        its role's ``"@<role>"`` key."""
        listing = listing_view(content)
        return listing if listing is not None else result_view(parse_result(content), function)

    def observation_error(self, obs: Observation) -> str | None:
        """``obs.error`` (unknown function, invalid arguments, a raised error: "Email with ID
        '9' not found", "No events found"), or the failure a tool *returned*
        (``returned_failure``: an empty result, ``404 Not Found``, a city with no hotels)."""
        if obs.error:
            return obs.error
        return returned_failure(obs.content)

    def safety_profile(self) -> SafetyProfile:
        return SafetyProfile(roles=ROLES, known=_known, present=_present)

    def domain_text(self) -> list[str]:
        """Each suite's tool block as a prompt shows it and its default state (the training
        states; no user or injection task is read), and the goal templates' wording."""
        text = []
        for suite in sorted(self.categories):
            text.append(render_tools(tool_docs(suite), "compact"))
            text.append(json.dumps(default_state(suite), default=str)[:_DOMAIN_STATE_CHARS])
        text += [t for _, texts in GOALS.values() for t in texts]
        return text
