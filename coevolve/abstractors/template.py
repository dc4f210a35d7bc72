"""The ``template`` abstractor: an exploration run becomes a task that states goals, no LLM.

From the run's successful calls to a task, in four steps:

1. **effects**: the calls are replayed in a fresh episode from the run's start state; a call
   whose replay leaves the state unchanged (``Episode.state_fingerprint``, timestamps aside)
   changed nothing, and a change a later call reverses (added then removed, set and set back)
   is dropped with what reverses it (``drop_undone``);
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
4. **turns**: one turn per goal; past ``abstract.max_turns``, adjacent goals on the same backend
   merge, and a last goal of another backend the task has no room for is dropped. Values
   read as a user says them (``Speaker``): "the folder you just created", "that order", a
   company for its stock symbol; several phrasings of each request.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from dataclasses import dataclass
from typing import Any, Callable

from coevolve.abstractors.base import Call, Run, describe
from coevolve.abstractors.goals import GOALS, Goal, fallback_goal
from coevolve.config import RunConfig
from coevolve.envs.base import Environment
from coevolve.types import ToolCall
from coevolve.explorers.base import observed_error, result_data
from coevolve.reversals import reversed_calls
from coevolve.registry import register, resolve
from coevolve.roles import RoleTable, param_roles
from coevolve.values import ValuePool

_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_NOUN_PLACEHOLDER = re.compile(r"((?:\b[a-z]+ ){0,3})\{(\w+)\}")  # a placeholder and up to 3 words before it
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


def drop_undone(env: Environment, run: Run, effects: list[Effect]) -> list[Effect]:
    """The effects without the changes later calls of the run reverse ("add NVDA to the
    watchlist" then "remove NVDA"; a budget set, then set back: ``quality.reversed_calls``),
    the calls replayed again after each removal so that a call that only worked after a removed
    one goes too. A task must not ask for what it then asks to undo."""
    kept = effects
    while True:
        calls = [e.call for e in kept]
        drop = set(reversed_calls(env, run.seed, [], calls))
        if not drop:
            return kept
        kept = replay_effects(env, run, [c for k, c in enumerate(calls) if k not in drop])


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
    changes = answers = 0
    answered: dict[str, int] = {}  # call -> number of state changes when it was last kept
    for i, e in enumerate(effects):
        kind = goal_of(e.call["name"], docs.get(e.call["name"], {})).kind
        feeds = _feeds_later(e, effects[i + 1 :], start_state)
        if e.changed:
            changes += 1
            kept.append(e)
        elif feeds:
            kept.append(e)
        elif kind == "answer" and answers <= changes:  # questions stay a minority of a task's requests
            key = _key(e.call)
            if answered.get(key) != changes:
                answered[key] = changes
                answers += 1
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
        items = [render(v, names) for v in value]
        return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else (items or ["nothing"])[0]
    if isinstance(value, dict):
        return ", ".join(f"{k} {render(v)}" for k, v in value.items()) or "nothing"
    return json.dumps(value)


def clause(call: Call, doc: dict[str, Any], say: Callable[[str, Any], str] | None = None, rng: Any = None) -> str:
    """One call as a request: "create a folder named temp". Of the goal's texts that say every
    argument of the call, one (``rng``: any of them, else the most specific); an argument no
    text says is stated after it the way a user would ("with priority 3"). ``say(param,
    value)`` renders a value (default ``render``): the abstractor uses it for references to
    earlier turns ("the file you just created") and names a user would use ("Tesla")."""
    goal = goal_of(call["name"], doc)
    args = call.get("arguments") or {}
    fitting = [t for t in goal.texts if set(_PLACEHOLDER.findall(t)) <= set(args)] or [goal.texts[-1]]
    covering = [t for t in fitting if set(args) <= set(_PLACEHOLDER.findall(t))] or fitting[:1]
    text = rng.choice(covering) if rng is not None else covering[0]
    used = set(_PLACEHOLDER.findall(text))

    def value(name: str) -> str:
        if say is not None:
            return say(name, args[name])
        return render(args[name], goal.values.get(name))

    def fill(m: re.Match[str]) -> str:
        words, name = (m.group(1) or "").split(), m.group(2)
        if name not in args:
            return m.group(0)
        said = value(name)
        # "as user {user_id}" said as a reference reads "as that user", not "as user that user";
        # "using my access token {access_token}" reads "using that access token"
        if words and said.startswith(("that ", "the ")) and words[-1] in said.split():
            while words and words[-1] in said.split():
                words.pop()
            if words and words[-1] == "my":
                words.pop()
        elif words and words[-1] == "a" and said[:1].lower() in "aeiou":  # "an economy flight"
            words[-1] = "an"
        return " ".join([*words, said])

    filled = _NOUN_PLACEHOLDER.sub(fill, text)
    rest = [k for k in args if k not in used]
    if rest:
        filled += " with " + " and ".join(f"{_words(k)} {value(k)}" for k in rest)
    return filled


def _words(name: str) -> str:
    """A parameter's name as words: ``fanSpeed`` -> "fan speed", ``human_readable`` -> "human readable"."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name).replace("_", " ").lower()


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


def sentence(
    goal: list[Effect], docs: dict[str, dict[str, Any]], speaker: Speaker | None = None, rng: Any = None
) -> str:
    parts: list[str] = []
    for e in goal:
        if speaker is not None:
            speaker.before(e.call)
        parts.append(clause(e.call, docs.get(e.call["name"], {}), speaker.say if speaker else None, rng))
        if speaker is not None:
            speaker.after(e)
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return text[:1].upper() + text[1:].rstrip(".") + "."


def _domain(goal: list[Effect], docs: dict[str, dict[str, Any]]) -> set[str]:
    """The backends a goal acts on: the part of a doc's description before "Tool description:"
    (BFCL names the class there); one domain for environments that have no such prefix."""
    out = set()
    for e in goal:
        text = (docs.get(e.call["name"]) or {}).get("description", "") or ""
        out.add(text.split("Tool description:", 1)[0].strip() if "Tool description:" in text else "")
    return out


def coherent_turns(
    goals: list[list[Effect]], docs: dict[str, dict[str, Any]], max_turns: int
) -> list[list[list[Effect]]]:
    """One goal per turn; past ``max_turns``, the smallest adjacent pair of turns on the same
    backend merges (a person asks for related things together), and when no such pair is left
    the last goal is dropped (a prefix of the run still replays: nothing later depends on it)."""
    turns = [[g] for g in goals]
    while len(turns) > max(1, max_turns):
        same = [i for i in range(len(turns) - 1) if len(_domain(sum(turns[i] + turns[i + 1], []), docs)) == 1]
        if same:
            i = min(same, key=lambda i: sum(len(g) for g in turns[i] + turns[i + 1]))
            turns[i : i + 2] = [turns[i] + turns[i + 1]]
        else:
            turns.pop()
    return turns


# How a request opens: several phrasings of one goal (picked per task, reproducibly)
_OPENERS = ("{}.", "Please {}.", "Could you {}?", "I need you to {}.", "Can you {}?", "I'd like you to {}.")
_QUESTION_WORDS = {"how", "what", "which", "who", "where", "when", "is", "are", "do", "does", "can", "could"}
_JOINERS = ("After that, {}", "Also, {}", "Once that's done, {}", "Next, {}")


def turn_text(
    goals: list[list[Effect]], docs: dict[str, dict[str, Any]], speaker: Speaker | None = None, rng: Any = None
) -> str:
    """A turn's request: its goals as sentences, the later ones opened as a person would."""
    out = []
    joiners = rng.sample(_JOINERS, len(_JOINERS)) if rng is not None else ["Also, {}"] * len(_JOINERS)
    for i, g in enumerate(goals):
        body = sentence(g, docs, speaker, rng)[:-1]
        body = body[:1].lower() + body[1:]
        if body.split(" ", 1)[0] in _QUESTION_WORDS:  # a goal the environment words as a question
            text = (joiners[(i - 1) % len(joiners)].format(body) if i else body) + "?"
        elif i == 0:
            opener = rng.choice(_OPENERS) if rng is not None else "{}."
            text = opener.format(body)
        else:
            text = joiners[(i - 1) % len(joiners)].format(body) + "."  # no two sentences opened alike
        out.append(text[:1].upper() + text[1:])
    return " ".join(out)


# What a value of a role is called when a later turn refers back to it
NOUNS = {
    "file": "file",
    "dir": "folder",
    "order_id": "order",
    "ticket_id": "ticket",
    "tweet_id": "tweet",
    "booking_id": "booking",
    "user_id": "user",
    "card_id": "card",
    "insurance_id": "insurance",
    "message_id": "message",
    "zipcode": "zip code",
    "airport": "airport",
    "event_id": "event",
    "email_id": "email",
    "file_id": "file",
    "access_token": "access token",
}
_NOT_MADE = {"access_token"}  # returned by a change (a login), yet nothing the user made
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")


class Speaker:
    """How a task's values read, turn by turn: a value the task itself created or got back (not
    one of the start state's, which the user knows) is referred to, never said raw: "that
    order", "the folder you just created" when it is the only one of its role so far, "the
    second ticket you created" among several; a value the environment names otherwise (a stock
    symbol as its company, where the task can map the name) is said that way; anything else is
    said as it is."""

    def __init__(self, env: Environment, docs: dict[str, dict[str, Any]], start_state: str, rng: Any) -> None:
        self.table = env.value_roles() if hasattr(env, "value_roles") else RoleTable()
        self.roles = {name: {p.name: p.role for p in param_roles(doc, self.table)} for name, doc in docs.items()}
        offered = {r for by_param in self.roles.values() for r in by_param.values()}
        self.aliases = {
            role: names for role, names in self.table.aliases.items() if self.table.alias_via.get(role) in offered
        }
        self.start_state = start_state
        # the values the user knows: those the start state holds, by role
        self.known = ValuePool(self.table)
        try:
            start = json.loads(start_state)
        except (TypeError, ValueError):
            start = None
        if start is not None:
            self.known.harvest(env.state_data(start) if hasattr(env, "state_data") else start, "state")
        self.docs = docs
        self.env = env
        self.rng = rng
        self.earlier: dict[str, tuple[str, str]] = {}  # value key -> (role, "created" | "returned"), earlier turns
        self.this_turn: dict[str, tuple[str, str]] = {}
        self.named: dict[str, bool] = {}  # value key -> said by its alias (decided at its first mention)
        self.call: Call = {}

    @staticmethod
    def _k(value: Any) -> str:
        return json.dumps(value, sort_keys=True, default=str)

    def say(self, param: str, value: Any) -> str:
        name = self.call.get("name", "")
        role = self.roles.get(name, {}).get(param, "")
        goal = goal_of(name, self.docs.get(name, {}))
        k = self._k(value)
        noun = NOUNS.get(role)
        if noun and not isinstance(value, (list, dict, bool)):
            reference = self._reference(k, role, noun)
            if reference:
                return reference
        names = self.aliases.get(role)
        if names and not isinstance(value, (list, dict)) and value in names:
            # one name per thing in a task: "NEPT ... Neptune Systems" in one breath reads as two stocks
            if self.named.setdefault(k, self.rng.random() < 0.6):
                return names[value]
        return render(value, goal.values.get(param))

    def _reference(self, k: str, role: str, noun: str) -> str | None:
        """How the user refers to a value this task created or got back, or None (said raw).
        This turn's values first: "the folder you just created" must not mean an earlier one."""
        mine = [key for key, (r, _) in self.this_turn.items() if r == role]
        before = [key for key, (r, _) in self.earlier.items() if r == role]
        if k in self.this_turn:
            same, how, here = mine, self.this_turn[k][1], True
        elif k in self.earlier:
            same, how, here = before, self.earlier[k][1], False
        else:
            return None
        if len(same) == 1:
            if how == "created" and not here:
                return f"the {noun} you created earlier" if mine else f"the {noun} you just created"
            return f"that {noun}"
        created = [key for key in same if (self.this_turn if here else self.earlier)[key][1] == "created"]
        if how == "created" and k in created and created.index(k) < len(_ORDINALS):
            return f"the {_ORDINALS[created.index(k)]} {noun} you created" + ("" if here else " earlier")
        return None

    def before(self, call: Call) -> None:
        self.call = call

    def after(self, effect: Effect) -> None:
        """Remember what this call created (arguments of a change) and returned (its result)."""
        by_param = self.roles.get(effect.call["name"], {})
        for param, value in (effect.call.get("arguments") or {}).items():
            role = by_param.get(param, "")
            if effect.changed and role in NOUNS and not isinstance(value, (list, dict, bool)):
                self._remember(role, value, "created")
        data = result_data(self.env, effect.observation, effect.call["name"])
        if isinstance(data, (dict, list)):
            pool = ValuePool(self.table)
            pool.harvest(data, "result", function=effect.call["name"])
            for role, value in pool.fresh:
                if role in NOUNS:  # a new id a change returns is a thing the user made (a ticket, a booking)
                    made = effect.changed and role not in _NOT_MADE
                    self._remember(role, value, "created" if made else "returned")

    def _remember(self, role: str, value: Any, how: str) -> None:
        k = self._k(value)
        if isinstance(value, (list, dict, bool)) or self.known.source(role, value) or k in self.earlier:
            return
        self.this_turn.setdefault(k, (role, how))

    def end_turn(self) -> None:
        self.earlier.update(self.this_turn)
        self.this_turn = {}


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
            kept = select(drop_undone(self.env, run, replay_effects(self.env, run, calls)), run.docs, state)
            if not kept:
                out.append("useless run: no call changed the state or produced an answer")
                continue
            goals = group_goals(kept, run.docs)
            turns = coherent_turns(goals, run.docs, self.max_turns)
            reference = [[e.call for g in t for e in g] for t in turns]
            rng = random.Random(json.dumps(reference, sort_keys=True, default=str))  # phrasing: per task, reproducible
            speaker = Speaker(self.env, run.docs, state, rng)
            texts = []
            for t in turns:
                texts.append(turn_text(t, run.docs, speaker, rng))
                speaker.end_turn()
            out.append((texts, reference))
        return out
