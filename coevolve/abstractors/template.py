"""The ``template`` abstractor: an exploration run becomes a task that states goals, no LLM.

From the run's successful calls to a task, in four steps:

1. **effects**: the calls are replayed in a fresh episode from the run's start state; a call
   whose replay leaves the state unchanged (``Episode.state_fingerprint``, timestamps aside)
   changed nothing;
2. **selection**: calls that changed the state stay; of the calls that changed nothing, an
   answer a user would ask for (``cat``, ``get_stock_info``, ``add``: kind ``answer`` in
   ``goals.GOALS``) stays unless the same call was already kept with no change since
   (repeats collapse), and any other one (``ls``, ``pwd``, a ``cd`` going nowhere, a write
   of what is already there) stays only if its output feeds a later call (a value the
   observation revealed that the start state does not hold, such as a new id);
3. **goals**: a goal is the navigation that leads to it (``cd``) plus the calls acting on
   related things (``mkdir temp`` then ``mv report.pdf temp`` share ``temp``); each goal reads
   as one instruction from its functions' templates: "Go into document, create a folder
   named temp and move final_report.pdf to temp.";
4. **turns**: one turn per goal, adjacent goals merged when there are more than
   ``abstract.max_turns``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from coevolve.abstractors.base import Call, Run, describe, split_turns
from coevolve.abstractors.goals import GOALS, Goal, fallback_goal
from coevolve.config import RunConfig
from coevolve.envs.base import Environment, ToolCall
from coevolve.explorers.base import observed_error
from coevolve.registry import register, resolve

_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_BARE = re.compile(r"[\w.\-/@:+]+")


@dataclass
class Effect:
    """A call as replayed: did it change the state, what did it return."""

    call: Call
    changed: bool
    observation: str


def replay_effects(env: Environment, run: Run, calls: list[Call]) -> list[Effect]:
    """Replay ``calls`` from the run's start state; calls that fail on replay are left out.
    An environment whose episodes have no ``state_fingerprint`` counts every call as a change."""
    episode = env.episode(dataclasses.replace(run.seed, turns=[""], reference_actions=[[]]))
    fingerprint = getattr(episode, "state_fingerprint", None)
    out = []
    for call in calls:
        before = fingerprint() if fingerprint else None
        obs = episode.step(ToolCall(call["name"], call["arguments"]))
        if observed_error(obs, env):
            continue
        changed = fingerprint() != before if fingerprint else True
        out.append(Effect(call, changed, obs.content if isinstance(obs.content, str) else str(obs.content)))
    return out


def goal_of(name: str, doc: dict[str, Any]) -> Goal:
    """The goal template of ``name``: the environment's own (a doc's ``goal`` entry,
    ``{"kind", "texts"}``), else the BFCL table ``GOALS``, else the doc's description."""
    own = doc.get("goal") if doc else None
    if isinstance(own, dict) and own.get("texts"):
        return Goal(str(own.get("kind", "do")), tuple(own["texts"]), dict(own.get("values", {})))
    return GOALS.get(name) or fallback_goal(describe(doc) if doc else name)


def _scalars(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _scalars(v)]
    if isinstance(value, list):
        return [s for v in value for s in _scalars(v)]
    return [] if isinstance(value, bool) or value is None else [value]


def _key(call: Call) -> str:
    return json.dumps([call["name"], call["arguments"]], sort_keys=True, default=str)


def select(effects: list[Effect], docs: dict[str, dict[str, Any]], start_state: str) -> list[Effect]:
    """The calls a task needs (see the module docstring, step 2)."""
    kept: list[Effect] = []
    changes = 0
    answered: dict[str, int] = {}  # call -> number of state changes when it was last kept
    for i, e in enumerate(effects):
        kind = goal_of(e.call["name"], docs.get(e.call["name"], {})).kind
        if e.changed:
            changes += 1
            kept.append(e)
        elif kind == "answer":
            key = _key(e.call)
            if answered.get(key) != changes:
                answered[key] = changes
                kept.append(e)
        elif _feeds_later(e, effects[i + 1 :], start_state):
            kept.append(e)
    return kept


def _feeds_later(e: Effect, later: list[Effect], start_state: str) -> bool:
    """Does a later call use a value that this call's output revealed and the start state lacks?"""
    for other in later:
        for v in _scalars(other.call["arguments"]):
            text = json.dumps(v) if not isinstance(v, str) else v
            if len(text) >= 2 and text in e.observation and text not in start_state:
                return True
    return False


def render(value: Any, names: dict[Any, str] | None = None) -> str:
    """A value as it reads in an instruction."""
    try:
        if names and value in names:
            return names[value]
    except TypeError:  # unhashable (lists, dicts)
        pass
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if _BARE.fullmatch(value) else f"'{value}'"
    if isinstance(value, list):
        return ", ".join(render(v) for v in value) if value else "nothing"
    if isinstance(value, dict):
        return ", ".join(f"{k} {render(v)}" for k, v in value.items()) or "nothing"
    return json.dumps(value)


def clause(call: Call, doc: dict[str, Any]) -> str:
    """One call as a request: "create a folder named temp"; values no template mentions are
    stated after it, so that the instruction holds every value the call needs."""
    goal = goal_of(call["name"], doc)
    args = call.get("arguments") or {}
    text = next((t for t in goal.texts if set(_PLACEHOLDER.findall(t)) <= set(args)), goal.texts[-1])
    used = set(_PLACEHOLDER.findall(text))
    filled = _PLACEHOLDER.sub(
        lambda m: render(args[m.group(1)], goal.values.get(m.group(1))) if m.group(1) in args else m.group(0), text
    )
    rest = [k for k in args if k not in used]
    if rest:
        filled += " (" + ", ".join(f"{k}: {render(args[k])}" for k in rest) + ")"
    return filled


def _related(e: Effect, goal: list[Effect]) -> bool:
    values = {
        json.dumps(v, default=str) for v in _scalars(e.call["arguments"]) if not isinstance(v, (int, float)) or v > 9
    }
    for other in goal:
        if values & {json.dumps(v, default=str) for v in _scalars(other.call["arguments"])}:
            return True
    return False


def group_goals(kept: list[Effect], docs: dict[str, dict[str, Any]]) -> list[list[Effect]]:
    """Goals: navigation joins the goal it leads to; a call joins the current goal when it
    acts on something the goal already names, else it starts a new goal."""
    goals: list[list[Effect]] = []
    current: list[Effect] = []
    acted = False
    for e in kept:
        nav = goal_of(e.call["name"], docs.get(e.call["name"], {})).kind == "nav"
        if current and acted and (nav or not _related(e, current)):
            goals.append(current)
            current, acted = [], False
        current.append(e)
        acted = acted or not nav
    if current:
        goals.append(current)
    return goals


def sentence(goal: list[Effect], docs: dict[str, dict[str, Any]]) -> str:
    parts = [clause(e.call, docs.get(e.call["name"], {})) for e in goal]
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return text[:1].upper() + text[1:] + "."


def turn_text(goals: list[list[Effect]], docs: dict[str, dict[str, Any]]) -> str:
    sentences = [sentence(g, docs) for g in goals]
    return " ".join([sentences[0], *("Then " + s[:1].lower() + s[1:] for s in sentences[1:])])


@register("abstractor", "template")
class TemplateAbstractor:
    """Goal instructions from per-function templates, over the calls that matter."""

    def __init__(self, cfg: RunConfig | None = None, env: Environment | None = None) -> None:
        self.max_turns = cfg.abstract.max_turns if cfg else 3
        self.env = env or resolve("environment", cfg.env.name if cfg else "bfcl-v3")()

    def abstract(self, runs: list[Run]) -> list[tuple[list[str], list[list[Call]]] | str]:
        out: list[tuple[list[str], list[list[Call]]] | str] = []
        for run in runs:
            calls = run.successful_calls()
            if not calls:
                out.append("useless run: no call succeeded")
                continue
            state = json.dumps(run.seed.initial_state)
            kept = select(replay_effects(self.env, run, calls), run.docs, state)
            if not kept:
                out.append("useless run: no call changed the state or produced an answer")
                continue
            goals = group_goals(kept, run.docs)
            turns = split_turns(goals, self.max_turns)  # adjacent goals merge past max_turns
            texts = [turn_text(t, run.docs) for t in turns]
            reference = [[e.call for g in t for e in g] for t in turns]
            out.append((texts, reference))
        return out
