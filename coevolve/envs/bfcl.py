"""BFCL-V3 multi-turn as a coevolve environment: safe dispatch, isolation, BFCL's own scoring.

    env = BfclEnvironment()
    task = env.load_tasks(["multi_turn_base"], limit=1)[0]
    ep = env.episode(task)
    for turn in range(ep.n_turns):
        ep.user_message(turn); ep.tools(turn)
        ep.step(ToolCall("cd", {"folder": "document"}))
        ep.end_turn()
    ep.score()   # EpisodeScore(success, reward, turn_passed, reason, progress, format, ...)

Each episode owns two sets of backend instances built from the task's initial state: the
agent's (driven by ``step``) and the reference's (driven by the task's reference calls, one
turn at a time in ``end_turn``). Calls reach them only through ``bfcl_dispatch.Dispatcher``
(whitelisted public methods, keyword arguments, never ``eval``), so unknown names, private or
dunder names, bad arguments and backend exceptions all come back as ``Observation(error=...)``.

Scoring follows ``bfcl_eval``'s ``multi_turn_checker`` turn by turn: a turn whose reference
is non-empty needs at least one agent call, then BFCL's ``state_checker`` (public attributes
of every instance equal) and ``response_checker`` (the reference turn's results are an
unordered sub-multiset of all agent results so far). Success is every turn passing, as BFCL
scores it. BFCL does not check turns whose reference is empty (it ships an irrelevance checker
but its runner has it disabled), so they never fail an episode; for the partial reward such a
turn passes only if the agent made no call in it (BFCL's irrelevance rule), which is the
behaviour miss_param / miss_func turns ask for.

The training reward (``coevolve.reward``) adds partial credit: per failed turn, the share of
its reference calls the agent's calls of that turn reproduced (same function, same arguments
with the method's defaults filled in); and the share of well-formed call attempts.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import hashlib
import json
import time
from typing import Any

# bfcl_data first: it points BFCL_PROJECT_ROOT away from site-packages before bfcl_eval loads.
from coevolve.envs import bfcl_data
from coevolve import reward as rewards
from coevolve.envs.base import EnvironmentBase
from coevolve.envs.bfcl_dispatch import Dispatcher, run_with_timeout
from coevolve.envs.bfcl_requests import LOGINS, request_problem
from coevolve.types import EpisodeScore, Observation, ToolCall
from coevolve.envs.bfcl_roles import TABLE as ROLE_TABLE
from coevolve.roles import RoleTable
from coevolve.registry import register
from coevolve.safety import ActionRole, SafetyProfile
from coevolve.tasks import Task

from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
    response_checker,
    state_checker,
)


def _plain(obj: Any, seen: dict[int, str], path: str) -> Any:
    """``obj`` as JSON-able data without timestamps; an object met again (parent links, the current directory)
    becomes the path where it was first met, so cycles end and moves still show."""
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, (datetime.date, datetime.time)):  # modification times: touched, not changed
        return None
    if id(obj) in seen:
        return {"@ref": seen[id(obj)]}
    seen[id(obj)] = path
    if isinstance(obj, dict):
        return {str(k): _plain(v, seen, f"{path}/{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        return [_plain(v, seen, f"{path}/{i}") for i, v in enumerate(items)]
    if hasattr(obj, "__dict__"):
        return {type(obj).__name__: _plain(vars(obj), seen, path)}
    return repr(obj)


class BfclEpisode:
    """One isolated BFCL episode: its own instances, its own reference run, its own score."""

    def __init__(self, task: Task, step_timeout_s: float | None = None):
        self.task = task
        self.n_turns = len(task.turns)
        if len(task.reference_actions) != self.n_turns:
            raise ValueError(f"{task.task_id}: {self.n_turns} turns but {len(task.reference_actions)} reference turns")
        self.step_timeout_s = step_timeout_s
        state = task.initial_state
        self._excluded = set(state.get("excluded_function", []))
        self._missed_at = {int(k): list(v) for k, v in state.get("missed_function", {}).items()}
        self._agent = Dispatcher(bfcl_data.make_instances(state))
        self._owner = bfcl_data.method_owner(list(state["involved_classes"]))
        self._reference: Dispatcher | None = None  # built at the first end_turn
        self.turn = 0
        self.calls: list[list[dict[str, Any]]] = [[] for _ in range(self.n_turns)]  # executed calls per turn
        self.reference_results: list[list[str]] = []
        self._agent_results: list[str] = []  # all turns so far, as BFCL's response check sees them
        self._turn_passed: list[bool] = []
        self._turn_progress: list[float] = []  # coevolve.reward.turn_progress of each ended turn
        self.n_calls = 0  # call attempts that reached the episode
        self.n_malformed = 0  # of which not dispatchable (unknown name, arguments not an object, ...)
        self._bfcl_failure: str = ""  # first failing BFCL check (the official verdict)
        self.finish_reason: str | None = None  # "time_limit" when a step overran its wall-clock budget

    # ------------------------------------------------------------------ what the agent sees
    def user_message(self, turn: int) -> str | None:
        """The turn's user message; BFCL's fixed prompt on a turn that only adds functions."""
        text = self.task.turns[turn]
        if text:
            return text
        return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC if self._missed_at.get(turn) else None

    def _hidden(self, turn: int) -> set[str]:
        later = {n for t, names in self._missed_at.items() if t > turn for n in names}
        return self._excluded | later

    def tools(self, turn: int) -> list[dict[str, Any]]:
        """OpenAI-style function schemas available at ``turn`` (held-out ones appear at their turn)."""
        hidden = self._hidden(turn)
        return [
            bfcl_data.to_json_schema(doc)
            for class_name in self.task.initial_state["involved_classes"]
            for doc in bfcl_data._class_docs(class_name)
            if doc["name"] not in hidden
        ]

    # ------------------------------------------------------------------ acting
    def step(self, call: ToolCall) -> Observation:
        """Execute one agent call; every failure is an error observation, never an exception."""
        if self.finish_reason:
            return Observation(content=f"Error: the episode has ended ({self.finish_reason})", error=self.finish_reason)
        if self.turn >= self.n_turns:
            return Observation(content="Error: all turns have ended", error="episode_over")
        name, arguments = getattr(call, "name", None), getattr(call, "arguments", None)
        problem = self._agent.check(name, arguments)
        record = {"name": name if isinstance(name, str) else repr(name), "arguments": arguments}
        self.n_calls += 1
        if problem:
            self.n_malformed += 1
            # Recorded so the turn counts as "the model made a call", as BFCL counts any decoded call.
            content = f"Error during execution: {problem}"
            self._record(record, content, problem)
            return Observation(content=content, error=problem)
        started = time.monotonic()
        out, timed_out = run_with_timeout(self._agent.call, (name, arguments), self.step_timeout_s)
        elapsed = time.monotonic() - started
        if timed_out or (self.step_timeout_s and elapsed > self.step_timeout_s):
            self.finish_reason = "time_limit"
            self.n_malformed += 1  # a call that hangs the backend earns no format credit
            error = f"time_limit: {name} ran {elapsed:.1f}s > {self.step_timeout_s}s"
            self._record(record, f"Error during execution: {error}", error)
            return Observation(content=f"Error during execution: {error}", error=error)
        content, error = out
        self._record(record, content, error)
        return Observation(content=content, error=error)

    def _record(self, record: dict[str, Any], content: str, error: str | None) -> None:
        self.calls[self.turn].append({**record, "result": content, "error": error})
        self._agent_results.append(content)

    def request_problem(self, call: ToolCall) -> str | None:
        """Why a user would not ask for ``call`` in the episode's current state, or None
        (``coevolve.envs.bfcl_requests``: a move that would rename, an order far from the
        stock's price, ...). Nothing runs; the agent's own calls are never judged by it."""
        name, arguments = getattr(call, "name", None), getattr(call, "arguments", None)
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return None
        if name in LOGINS and any(c["name"] == name and not c["error"] for turn in self.calls for c in turn):
            return f"{name} again: the user logged in earlier in the task"
        return request_problem(self._agent.instances, name, arguments)

    def state_fingerprint(self) -> str:
        """A digest of the agent's instances, private attributes included (the file system's
        current directory is private): equal digests mean a call changed nothing."""
        return hashlib.sha256(json.dumps(_plain(self._agent.instances, {}, "$"), default=repr).encode()).hexdigest()

    # ------------------------------------------------------------------ scoring
    def end_turn(self) -> None:
        """Close the current turn: run its reference calls and check it as BFCL does."""
        if self.turn >= self.n_turns:
            return
        t = self.turn
        if self._reference is None:
            self._reference = Dispatcher(bfcl_data.make_instances(self.task.initial_state))
        ref_results, ref_calls = [], []
        for ref in self.task.reference_actions[t]:
            problem = self._reference.check(ref.get("name"), ref.get("arguments", {}))
            result, error = (
                (f"Error during execution: {problem}", problem)
                if problem
                else self._reference.call(ref["name"], ref["arguments"])
            )
            ref_results.append(result)
            ref_calls.append({**ref, "error": error})
        self.reference_results.append(ref_results)
        made_calls = bool(self.calls[t])
        failure = ""  # why BFCL fails this turn
        if not self.task.reference_actions[t]:
            # BFCL does not check this turn; the partial reward wants no call here.
            passed = not made_calls
        elif not made_calls:
            passed, failure = False, f"turn {t}: multi_turn:empty_turn_model_response (no function call)"
        else:
            verdict = state_checker(self._agent.instances, self._reference.instances)
            if verdict["valid"]:
                verdict = response_checker(self._agent_results, ref_results, t)
            passed = verdict["valid"]
            failure = "" if passed else f"turn {t}: {verdict['error_type']}: {verdict['error_message']}"
        self._bfcl_failure = self._bfcl_failure or failure
        self._turn_passed.append(passed)
        same = rewards.reproduced(ref_calls, self.calls[t], self._normalize) if not passed else len(ref_calls)
        self._turn_progress.append(rewards.turn_progress(passed, len(ref_calls), same))
        self.turn += 1

    def _normalize(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return bfcl_data.normalized_arguments(name, arguments, self._owner)

    def score(self) -> EpisodeScore:
        """BFCL's verdict (all turns ended and passed) and the training reward's parts."""
        failure = self._bfcl_failure or (f"{self.finish_reason} at turn {self.turn}" if self.finish_reason else "")
        return rewards.episode_score(
            self._turn_passed, self._turn_progress, self.n_turns, failure, self.n_calls, self.n_malformed
        )


_FAILED_VALUES = {"Stock not found", "Unknown", "00000"}


def returned_failure(doc: dict[str, Any]) -> str | None:
    """The failure a BFCL result reports (see ``BfclEnvironment.observation_error``), or None."""
    if doc.get("error"):
        return str(doc["error"])
    for key, value in doc.items():
        if value is False and (key.endswith("status") or key in ("success", "authenticated")):
            detail = next((str(v) for k, v in doc.items() if isinstance(v, str)), "")
            return f"{key} is false" + (f": {detail}" if detail else "")
        if isinstance(value, str) and value in _FAILED_VALUES:
            return f"{key}: {value}"
    return None


# Safety roles of BFCL's functions (coevolve.safety): messages and posts carry content out,
# deletions destroy records. The default blocked_functions list blocks most deletions outright.
ROLES: dict[str, ActionRole] = {
    "send_message": ActionRole("send", party=("receiver_id",), content=("message",)),
    "post_tweet": ActionRole("send", content=("content",)),
    "comment": ActionRole("send", content=("comment_content",)),
    "delete_message": ActionRole("delete", target=("message_id",)),
    "rm": ActionRole("delete", target=("file_name",)),
    "rmdir": ActionRole("delete", target=("dir_name",)),
}


def _config(state: dict[str, Any]) -> Any:
    return state.get("initial_config", {})


@register("environment", "bfcl-v3")
class BfclEnvironment(EnvironmentBase):
    """The four BFCL-V3 multi-turn categories (800 entries) and episodes over them."""

    name = "bfcl-v3"
    categories = bfcl_data.CATEGORIES

    def __init__(self, step_timeout_s: float | None = None):
        self.step_timeout_s = step_timeout_s

    def load_tasks(
        self,
        categories: list[str] | None = None,
        ids: list[str] | None = None,
        limit: int | None = None,
    ) -> list[Task]:
        """Tasks of ``categories`` (default: all four) or exactly ``ids``, by category then id."""
        return bfcl_data.load_tasks(categories, ids, limit)

    def heldout_tasks(
        self,
        heldout: int | list[int],
        seed: int,
        scenarios: int = 0,
        categories: list[str] | None = None,
    ) -> list[Task]:
        """Evaluation tasks: ``scenarios`` (0 = all) of the held-out scenarios ``heldout`` (a count
        drawn with ``seed`` or a list, as ``env.heldout_scenarios``), in each of ``categories``."""
        held = bfcl_data.heldout_scenarios(heldout, seed)
        return bfcl_data.heldout_tasks(held, bfcl_data.eval_scenarios(held, scenarios, seed), categories)

    def episode(self, task: Task) -> BfclEpisode:
        return BfclEpisode(task, step_timeout_s=self.step_timeout_s)

    def training_states(self, heldout: int | list[int], seed: int, categories: list[str] | None = None) -> list[Task]:
        """State-only tasks of every training scenario (not held out by ``heldout``/``seed``):
        what round 0 may synthesize from (see ``bfcl_data.scenario_states``)."""
        held = bfcl_data.heldout_scenarios(heldout, seed)
        return bfcl_data.scenario_states(bfcl_data.training_scenarios(held), categories)

    def heldout_states(self, heldout: int | list[int], seed: int, categories: list[str] | None = None) -> list[Task]:
        """State-only tasks of the held-out scenarios (evaluation side: the held-out synthesized
        split is made from them; no question or ground truth is read)."""
        held = bfcl_data.heldout_scenarios(heldout, seed)
        return [dataclasses.replace(t, split="heldout") for t in bfcl_data.scenario_states(sorted(held), categories)]

    def scenario_of(self, task: Task) -> str:
        """The scenario index of a task id (``multi_turn_base_12``, ``multi_turn_base_state_12`` -> ``12``)."""
        return task.task_id.split("~")[0].rsplit("_", 1)[-1]

    def start_state(self, task: Task) -> Task:
        """The base contract's start state with every function available from the first step:
        miss_func entries hold functions back until a later turn (``missed_function``)."""
        start = super().start_state(task)
        if "missed_function" in start.initial_state:
            start.initial_state["missed_function"] = {}
        return start

    def state_data(self, initial_state: dict[str, Any]) -> Any:
        """The backends' data as an episode starts (not bookkeeping such as doc file names): each
        class's configuration, or, for a class the state leaves to its defaults (MessageAPI's
        users, TicketAPI's queue), the public attributes its backend loads."""
        config = dict(initial_state.get("initial_config") or {})
        missing = [c for c in initial_state.get("involved_classes", []) if not config.get(c)]
        if missing:
            instances = bfcl_data.make_instances({"involved_classes": missing, "initial_config": {}})
            for name, inst in instances.items():
                if name in ("GorillaFileSystem", "MathAPI"):
                    continue
                public = {k: v for k, v in vars(inst).items() if not k.startswith("_")}
                config[name] = _plain(public, {}, "$")
        return config

    def value_roles(self) -> RoleTable:
        return ROLE_TABLE

    def result_data(self, content: str, function: str = "") -> Any:
        """A call's result as data: BFCL renders dicts as JSON and everything else with
        ``str()`` (a list of airports is a Python literal), read back with ``ast.literal_eval``
        (literals only, never evaluated as code); None for plain text."""
        try:
            return json.loads(content)
        except (json.JSONDecodeError, TypeError):
            pass
        try:
            return ast.literal_eval(content) if isinstance(content, str) and len(content) < 100_000 else None
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None

    def observation_error(self, obs: Observation) -> str | None:
        """``obs.error``, or the failure a backend *returned* instead of raising, in each of
        bfcl_eval's shapes: ``{"error": ...}``, a false status (``login_status``,
        ``verification_status``, ``success``...), a placeholder answer ("Stock not found",
        zip code ``00000``, airport ``Unknown``)."""
        if obs.error:
            return obs.error
        text = obs.content.strip() if isinstance(obs.content, str) else ""
        if not text.startswith("{"):
            return None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            return None
        return returned_failure(doc) if isinstance(doc, dict) else None

    def safety_profile(self) -> SafetyProfile:
        return SafetyProfile(roles=ROLES, known=_config)

    def function_docs(self, task: Task) -> list[dict[str, Any]]:
        """BFCL's full function docs (types, enums, required) of the task's classes, minus excluded ones."""
        excluded = set(task.initial_state.get("excluded_function", []))
        return [
            doc
            for class_name in task.initial_state["involved_classes"]
            for doc in bfcl_data.class_docs(class_name)
            if doc["name"] not in excluded
        ]
