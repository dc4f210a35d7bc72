"""The ``rule`` explorer: signal-guided (or coverage) exploration without an LLM.

Each step picks a function and fills its arguments, adapting to what it has seen:

- **which function**: the rare pattern's next call (consecutively, until it succeeds); in a
  coverage context, the next focus tool not yet reached (a few tries each); otherwise a
  focus tool, or now and then any tool;
- **which arguments**: from the function doc (types, ``[Enum]`` lists, required/optional),
  values the failed attempt used (its own calls, not a reference), values present in the
  start state and in every observation so far (newest first), or fresh values;
- **errors**: after a failed call its argument values are not offered again for that
  function, and the explorer usually retries the same function with other values.

It never reads the context task's turns or reference calls (see ``coevolve.explore``).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from coevolve.config import RunConfig
from coevolve.envs.base import ToolCall
from coevolve.explorers.base import Session
from coevolve.registry import register

_ENUM = re.compile(r"\[Enum\]:\s*(\[[^\]]*\])")
_TYPES = {
    "string": (str,),
    "integer": (int,),
    "float": (int, float),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "dict": (dict,),
    "object": (dict,),
}
_MAX_PER_KEY = 40  # keep the newest values per key: long-context states hold thousands


@dataclass
class Param:
    name: str
    type: str
    required: bool
    enum: list[Any]
    item_type: str


def params_of(doc: dict[str, Any]) -> list[Param]:
    """The parameters of a BFCL function doc (enums read from ``enum`` or ``[Enum]: [...]``)."""
    spec = doc.get("parameters") or {}
    required = set(spec.get("required") or [])
    out = []
    for name, p in (spec.get("properties") or {}).items():
        enum = p.get("enum") or []
        if not enum:
            m = _ENUM.search(p.get("description", ""))
            if m:
                try:
                    enum = json.loads(m.group(1))
                except json.JSONDecodeError:
                    enum = []
        item = (p.get("items") or {}).get("type", "string")
        out.append(Param(name, p.get("type", "string"), name in required, list(enum), item))
    return out


def fits(value: Any, type_name: str) -> bool:
    """Does ``value`` have the JSON-schema type ``type_name`` (bools are not numbers)?"""
    types = _TYPES.get(type_name)
    if types is None:
        return True
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def fits_param(value: Any, p: Param) -> bool:
    """Type (and, for arrays, item type) of ``value`` match the parameter."""
    if not fits(value, p.type):
        return False
    return not isinstance(value, list) or all(fits(v, p.item_type) for v in value)


def _kind_hint(param: str) -> str | None:
    """File-system parameters want names of the right kind of node."""
    p = param.lower()
    if "folder" in p or "dir" in p or p in ("destination", "path"):
        return "dir"
    if "file" in p or p == "source":
        return "file"
    return None


class ValueBank:
    """Values seen so far, under the key they appeared with, newest last."""

    def __init__(self) -> None:
        self.by_key: dict[str, list[Any]] = defaultdict(list)
        self.names: dict[str, list[str]] = {"file": [], "dir": []}
        self.recent: list[Any] = []  # scalars of the latest successful observation (e.g. a listing)

    def add(self, key: str, value: Any) -> None:
        values = self.by_key[key]
        if value in values:
            values.remove(value)
        values.append(value)
        del values[:-_MAX_PER_KEY]

    def harvest(self, obj: Any, key: str = "") -> None:
        """Record every scalar (and short list) in ``obj`` under its nearest key."""
        if isinstance(obj, dict):
            for k, v in obj.items():
                if isinstance(v, dict) and v.get("type") in ("file", "directory"):
                    kind = "file" if v["type"] == "file" else "dir"
                    if k not in self.names[kind]:
                        self.names[kind].append(k)
                        del self.names[kind][:-_MAX_PER_KEY]
                self.harvest(v, str(k))
        elif isinstance(obj, list):
            if obj and len(obj) <= 8 and all(isinstance(v, (str, int, float)) for v in obj):
                self.add(key, list(obj))
            for v in obj[:_MAX_PER_KEY]:
                self.harvest(v, key)
        elif isinstance(obj, (str, int, float)) and key:
            if not (isinstance(obj, str) and len(obj) > 200):
                self.add(key, obj)

    def harvest_text(self, text: str) -> None:
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, TypeError):
            return
        self.harvest(obj)
        self.recent = list(_scalars(obj))[:_MAX_PER_KEY]


def _scalars(obj: Any) -> Any:
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _scalars(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _scalars(v)
    elif isinstance(obj, (str, int, float)):
        yield obj


def _plausible(value: Any, hint: str | None) -> bool:
    """A file or folder name is short and on one line (not a file's content)."""
    return not hint or not isinstance(value, str) or (len(value) <= 40 and "\n" not in value)


def _key(call: Any) -> str:
    return json.dumps([call.name, call.arguments], sort_keys=True, default=str)


def _tokens(name: str) -> set[str]:
    return {t for t in re.split(r"[_\W]+|(?<=[a-z])(?=[A-Z])", name.lower()) if len(t) > 1}


class RuleExplorer:
    """Schema- and state-driven exploration, focused by the signal's context."""

    signal_guided = True
    # probabilities of the step kinds when no pattern or retry decides
    p_focus = 0.7  # a focus tool with filled arguments (the rest: any tool)
    p_coverage = 0.75  # coverage contexts: the next unreached focus tool (the rest: any tool)
    coverage_tries = 3  # attempts per focus tool before a coverage run moves on
    p_retry = 0.6  # after an error: the same function again, with other values
    p_optional = 0.3  # fill an optional parameter

    def __init__(self, cfg: RunConfig | None = None) -> None:
        self.cfg = cfg

    # ------------------------------------------------------------------ protocol
    def propose(self, sessions: list[Session]) -> list[ToolCall | str]:
        return [self.next_call(s) for s in sessions]

    def next_call(self, s: Session) -> ToolCall | str:
        mem = s.memory
        if not mem:
            self._start(s)
        elif s.history:
            self._observe(s, s.history[-1])
        tools = mem["tools"]
        if not tools:
            return "no callable tools in this context"
        choice = self._choose_function(s)
        call = choice if isinstance(choice, ToolCall) else ToolCall(choice, self.fill(s, choice))
        # never send a call that already failed as it is: other values, else another function
        for attempt in range(6):
            if _key(call) not in mem["failed"]:
                break
            name = call.name if attempt < 4 else s.rng.choice(tools)
            call = ToolCall(name, self.fill(s, name))
        return call

    # ------------------------------------------------------------------ state
    def _start(self, s: Session) -> None:
        ctx, mem = s.context, s.memory
        bank = ValueBank()
        # the environment's data in the start state (Environment.state_data), not its bookkeeping
        bank.harvest(s.state_data())
        refs: dict[tuple[str, str], list[Any]] = defaultdict(list)
        calls = []  # the failed attempt's own successful calls (never the task's reference)
        for step in ctx.evidence:
            bank.harvest_text(step.get("observation") or "")
            try:
                args = json.loads(step.get("action_args") or "{}")
            except json.JSONDecodeError:
                args = {}
            if step.get("action_name") and isinstance(args, dict) and not step.get("error"):
                calls.append({"name": step["action_name"], "arguments": args})
        if self.signal_guided:
            for c in calls:
                for k, v in (c.get("arguments") or {}).items():
                    refs[(c.get("name", ""), k)].append(v)
                    refs[("", k)].append(v)
        mem["bank"], mem["refs"] = bank, refs
        mem["bad"] = defaultdict(list)
        mem["failed"] = set()
        mem["tools"] = [t for t in s.docs if t not in ctx.avoid and (not ctx.task.tools or t in ctx.task.tools)]
        mem["reached"] = set()  # functions that ran without error in this run
        mem["tries"] = defaultdict(int)  # attempts per function in this run
        mem["pattern"] = [f for f in ctx.focus if f in s.docs] if ctx.sequence else []
        mem["pattern_cursor"] = 0
        mem["retry"] = None

    def _observe(self, s: Session, last: Any) -> None:
        mem = s.memory
        mem["retry"] = None
        if last.name is not None:
            mem["tries"][last.name] += 1
        if last.error is None:
            mem["reached"].add(last.name)
            mem["bank"].harvest_text(last.observation)
            for k, v in last.arguments.items():
                mem["bank"].add(k, v)
            pattern = mem["pattern"]
            if pattern and mem["pattern_cursor"] < len(pattern) and last.name == pattern[mem["pattern_cursor"]]:
                mem["pattern_cursor"] += 1
        elif last.name is not None:
            mem["failed"].add(_key(last))
            for k, v in last.arguments.items():
                mem["bad"][(last.name, k)].append(v)
            if s.rng.random() < self.p_retry:
                mem["retry"] = last.name

    # ------------------------------------------------------------------ choices
    def _choose_function(self, s: Session) -> str | ToolCall:
        mem, rng = s.memory, s.rng
        pattern, cursor = mem["pattern"], mem["pattern_cursor"]
        if cursor < len(pattern):
            left = s.budget - len(s.history)
            if left <= len(pattern) - cursor or rng.random() < 0.5 or mem["retry"] == pattern[cursor]:
                return pattern[cursor]
        if mem["retry"]:
            return mem["retry"]
        focus = [f for f in s.context.focus if f in mem["tools"]]
        if s.context.coverage:
            todo = [f for f in focus if f not in mem["reached"] and mem["tries"][f] < self.coverage_tries]
            if todo and rng.random() < self.p_coverage:
                return todo[0]
        elif focus and rng.random() < self.p_focus:
            return rng.choice(focus)
        return rng.choice(mem["tools"])

    def fill(self, s: Session, name: str) -> dict[str, Any]:
        """Arguments for ``name``: every required parameter, some optional ones."""
        args = {}
        for p in params_of(s.docs.get(name, {})):
            if p.required or s.rng.random() < self.p_optional:
                args[p.name] = self._value(s, name, p)
        return args

    def _value(self, s: Session, fname: str, p: Param, exclude: tuple[Any, ...] = ()) -> Any:
        mem, rng = s.memory, s.rng
        bank: ValueBank = mem["bank"]
        bad = list(exclude) + mem["bad"].get((fname, p.name), [])
        hint = _kind_hint(p.name)
        similar = [v for k, vs in bank.by_key.items() if k != p.name and _tokens(k) & _tokens(p.name) for v in vs]
        # names of the right kind, those just listed first (they exist where we are now)
        named = [v for v in bank.recent if hint and v in bank.names[hint]] + (bank.names[hint][::-1] if hint else [])
        tiers = [
            list(mem["refs"].get((fname, p.name), [])),
            (list(p.enum) if p.type != "array" else []) + bank.by_key.get(p.name, [])[::-1],
            named + list(mem["refs"].get(("", p.name), [])) + similar,
        ]
        if hint:  # a file or folder parameter wants a name, best one that was just listed
            tiers = [tiers[0], named, tiers[1]]
        for tier in tiers:
            options = [v for v in tier if fits_param(v, p) and v not in bad and _plausible(v, hint)]
            if options and rng.random() < 0.75:
                # newest values first: prefer the head, but keep some spread
                return options[min(int(rng.expovariate(0.7)), len(options) - 1)]
        anywhere = [v for vs in bank.by_key.values() for v in vs if fits_param(v, p) and v not in bad]
        if anywhere and not hint and rng.random() < 0.3:
            return rng.choice(anywhere)
        return self._fresh(p, hint, rng)

    @staticmethod
    def _fresh(p: Param, hint: str | None, rng: Any) -> Any:
        n = rng.randint(1, 99)
        if p.enum and p.type == "array":  # an [Enum] on an array lists its allowed items
            return rng.sample(p.enum, k=rng.randint(1, len(p.enum)))
        if p.enum:
            return rng.choice(p.enum)
        if p.type == "integer":
            return n
        if p.type in ("float", "number"):
            return float(n)
        if p.type == "boolean":
            return rng.random() < 0.5
        if p.type == "array":
            k = rng.randint(2, 4)
            if p.item_type in ("integer", "float", "number"):
                return [rng.randint(1, 99) if p.item_type == "integer" else float(rng.randint(1, 99)) for _ in range(k)]
            return [f"item_{rng.randint(1, 99)}" for _ in range(k)]
        if p.type in ("dict", "object"):
            return {}
        if hint == "file":
            return f"notes_{n}.txt"
        if hint == "dir":
            return f"folder_{n}"
        return f"{p.name.replace('_', ' ')} {n}"


register("explorer", "rule")(RuleExplorer)
