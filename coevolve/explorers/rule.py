"""The ``rule`` explorer: signal-guided (or coverage) exploration without an LLM.

Each step picks a function and fills its arguments, adapting to what it has seen:

- **which function**: the rare pattern's next call (consecutively, until it succeeds); after
  an error that names a precondition ("Please log in", "brake pedal needs to be pressed"),
  the function that error points at, then the failed one again; a function that can use
  what the last call just returned (an order id, a listed folder), now and then; in a
  coverage context, the next focus tool not yet reached (a few tries each); otherwise a
  focus tool, or now and then any tool;
- **which arguments** (``coevolve.roles``, ``coevolve.values``): every parameter has a
  role, and a value is only ever taken from the same role, in this order: a result observed
  earlier in the run, an entity of the start state (dict keys included: stock symbols, card
  ids), an earlier call's argument, the environment's own values; the enum is a hard rule;
  a realistic generator makes values only for what a task may create (a new file name, a
  message, an amount in the range the state suggests, a date in the stated format). A
  function whose required parameter has no value of its role is not called. Optional
  parameters are filled only where the goal templates can say them;
- **errors**: a failed call bans only the values its error names (for that parameter), and
  the exact call is never sent again; the explorer usually retries with other values.

It never reads the context task's turns or reference calls (see ``coevolve.explore``). Of the
policy's own attempt (a signal's failing episode, a cold start's training episode) it uses the
values the start state proves of the right role, and half of its runs begin by making again
the attempt's first calls that worked, then explore onward from where the policy is competent.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from coevolve.abstractors.goals import goal_for, mentioned_params
from coevolve.config import RunConfig
from coevolve.types import ToolCall
from coevolve.explorers.base import Session, result_data
from coevolve.registry import register
from coevolve.roles import ParamRole, RoleTable, param_roles, tokens
from coevolve.values import ValuePool, role_problem

# words of an error message that say nothing about which function would help
_STOP = {"the", "a", "an", "to", "is", "be", "not", "no", "you", "your", "of", "in", "for", "and", "or", "with",
         "please", "error", "must", "can", "only", "before", "first", "id", "found", "invalid", "this", "that"}  # fmt: skip


def _key(call: Any) -> str:
    return json.dumps([call.name, call.arguments], sort_keys=True, default=str)


def _j(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _stem(word: str) -> str:
    for suffix in ("ication", "ed", "ing", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            return word[: -len(suffix)]
    return word


_PAIRS = (("min_", "max_"), ("start_", "end_"), ("from_", "to_"))


def _ordered(args: dict[str, Any]) -> dict[str, Any]:
    """Bounds in order: ``min_price`` <= ``max_price``, ``start_date`` <= ``end_date``."""
    for lo, hi in _PAIRS:
        for k in list(args):
            if k.startswith(lo) and hi + k[len(lo) :] in args:
                other = hi + k[len(lo) :]
                a, b = args[k], args[other]
                if type(a) is type(b) and not isinstance(a, (list, dict, bool)) and a > b:
                    args[k], args[other] = b, a
    return args


class RuleExplorer:
    """Schema-, role- and state-driven exploration, focused by the signal's context."""

    signal_guided = True
    # probabilities of the step kinds when no pattern or retry decides
    p_focus = 0.7  # a focus tool with filled arguments (the rest: any tool)
    p_coverage = 0.75  # coverage contexts: the next unreached focus tool (the rest: any tool)
    coverage_tries = 3  # attempts per focus tool before a coverage run moves on
    p_retry = 0.6  # after an error: the same function again, with other values
    p_prereq = 0.8  # after an error naming a precondition: the function it points at
    p_flow = 0.45  # a function that takes what the last call returned
    p_optional = 0.3  # fill an optional parameter (one the goal templates mention)
    p_change = 0.6  # prefer functions that change the state among the candidates
    p_replay = 0.5  # a run starts with the policy's own calls that worked (where the context has an attempt)

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
        if mem["replay"]:
            return mem["replay"].pop(0)
        choice: str | ToolCall = mem.pop("prereq", None) or self._choose_function(s)
        for attempt in range(8):
            if isinstance(choice, ToolCall):
                call: ToolCall | None = choice
            else:
                args = self.fill(s, choice)
                call = ToolCall(choice, args) if args is not None else None
            # a call that already succeeded is not made again (asking twice asks nothing new), but moving is
            repeat = call is not None and _key(call) in mem["done"] and mem["kinds"].get(call.name) != "nav"
            if call is not None and _key(call) not in mem["failed"] and not repeat:
                return call
            name = choice.name if isinstance(choice, ToolCall) else choice
            if attempt >= 2 or call is None:  # nothing to fill it with, or it keeps failing: another function
                mem["unfillable"].add(name)
                left = [t for t in tools if t not in mem["unfillable"]]
                choice = s.rng.choice(left or tools)
        return call if call is not None else "no function of this context can be filled with values of their roles"

    # ------------------------------------------------------------------ state
    def _start(self, s: Session) -> None:
        ctx, mem = s.context, s.memory
        table = s.env.value_roles() if s.env is not None and hasattr(s.env, "value_roles") else RoleTable()
        pool = ValuePool(table)
        pool.harvest(s.state_data(), "state")
        params = {name: param_roles(doc, table) for name, doc in s.docs.items()}
        refs: dict[tuple[str, str], list[Any]] = defaultdict(list)
        sound: list[ToolCall] = []  # the attempt's first calls that worked, every value of its role
        prefix = True
        if self.signal_guided:  # the policy's own attempt (failed, unstable, or a cold start's)
            for step in ctx.evidence:
                if not step.get("action_name") or step.get("error") or step["action_name"] not in params:
                    continue
                try:
                    args = json.loads(step.get("action_args") or "{}")
                except json.JSONDecodeError:
                    continue
                if not isinstance(args, dict):
                    continue
                by_name = {p.name: p for p in params[step["action_name"]]}
                ok = [
                    k
                    for k, v in args.items()
                    if k in by_name and role_problem(by_name[k], v, pool, step["action_name"]) is None
                ]
                for k in ok:
                    refs[(step["action_name"], k)].append(args[k])
                prefix = prefix and len(ok) == len(args) and step["action_name"] not in ctx.avoid
                if prefix:
                    sound.append(ToolCall(step["action_name"], args))
        # some runs start where the policy is competent (its calls that worked) and explore onward
        mem["replay"] = (
            sound[: s.rng.randint(1, min(3, len(sound)))] if sound and s.rng.random() < self.p_replay else []
        )
        mem["pool"], mem["params"], mem["refs"] = pool, params, refs
        mem["bad"] = defaultdict(set)  # (function, parameter) -> banned values (JSON)
        mem["failed"] = set()
        mem["retried"] = set()  # failed calls already sent again after their precondition
        mem["done"] = set()  # calls that succeeded: sent again only now and then (a second cd is a move)
        mem["unfillable"] = set()
        mem["tools"] = [t for t in s.docs if t not in ctx.avoid and (not ctx.task.tools or t in ctx.task.tools)]
        mem["reached"] = set()  # functions that ran without error in this run
        mem["tries"] = defaultdict(int)  # attempts per function in this run
        mem["pattern"] = [f for f in ctx.focus if f in s.docs] if ctx.sequence else []
        mem["pattern_cursor"] = 0
        mem["retry"] = None
        mem["mentioned"] = {name: mentioned_params(name, doc) for name, doc in s.docs.items()}
        goals = {name: goal_for(name, doc) for name, doc in s.docs.items()}
        mem["kinds"] = {name: goal.kind if goal is not None else "do" for name, goal in goals.items()}

    def _observe(self, s: Session, last: Any) -> None:
        mem = s.memory
        pool: ValuePool = mem["pool"]
        mem["retry"] = mem.pop("after_prereq", None)  # set while a precondition's call was made
        mem["unfillable"] = set()
        if last.name is not None:
            mem["tries"][last.name] += 1
        by_name = {p.name: p for p in mem["params"].get(last.name, [])}
        if last.error is None:
            mem["reached"].add(last.name)
            mem["done"].add(_key(last))
            data = result_data(s.env, last.observation, last.name or "")
            if isinstance(data, (dict, list)):
                pool.harvest(data, "result", function=last.name or "")
            else:
                pool.fresh = []
            for k, v in last.arguments.items():
                if k in by_name:
                    for item in v if isinstance(v, list) else [v]:
                        pool.add(by_name[k].role, item, "arg")
            pattern = mem["pattern"]
            if pattern and mem["pattern_cursor"] < len(pattern) and last.name == pattern[mem["pattern_cursor"]]:
                mem["pattern_cursor"] += 1
        elif last.name is not None:
            key = _key(last)
            prereq = self._precondition(s, last)
            if prereq and key not in mem["retried"] and s.rng.random() < self.p_prereq:
                # the state was not ready ("press the brake pedal first"): that function, then the same call
                mem["prereq"] = prereq
                mem["after_prereq"] = ToolCall(last.name, dict(last.arguments))
                mem["retried"].add(key)
                return
            mem["failed"].add(key)
            # ban only the values the error names
            for k, v in last.arguments.items():
                for item in v if isinstance(v, list) else [v]:
                    text = str(item)
                    if len(text) >= 2 and text in (last.error or "") + (last.observation or ""):
                        mem["bad"][(last.name, k)].add(_j(item))
            if s.rng.random() < self.p_retry:
                mem["retry"] = last.name

    def _precondition(self, s: Session, last: Any) -> str | None:
        """The function an error message points at ("Please log in first" -> a login), or None:
        the most words of the message in its name (a prefix counts: "log" -> ``ticket_login``),
        ties going to the function that shares most of the failed one's name."""
        words = {_stem(w) for w in tokens(f"{last.error} {last.observation}") if w not in _STOP and len(w) > 2}
        if not words:
            return None
        failed = set(tokens(last.name or ""))
        best, score = None, 0.0
        for name in s.memory["tools"]:
            if name == last.name:
                continue
            parts = {_stem(w) for w in tokens(name)}
            hits = sum(1 for w in words if any(p.startswith(w) or w.startswith(p) for p in parts if len(p) > 2))
            if not hits:
                continue
            value = hits + 0.5 * len(failed & set(tokens(name)))
            if value > score:
                best, score = name, value
        return best

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
        takers = self._takers(s)
        if takers and rng.random() < self.p_flow:
            preferred = [t for t in takers if t in focus] or takers
            return rng.choice(preferred)
        if s.context.coverage:
            todo = [f for f in focus if f not in mem["reached"] and mem["tries"][f] < self.coverage_tries]
            if todo and rng.random() < self.p_coverage:
                return todo[0]
        elif focus and rng.random() < self.p_focus:
            return self._prefer_change(s, focus)
        return self._prefer_change(s, mem["tools"])

    def _prefer_change(self, s: Session, names: list[str]) -> str:
        """One of ``names``, a function that changes the state (goal kind ``do``) more often
        than not: a task is worth more for what it makes the agent do than for what it reads."""
        changing = [n for n in names if s.memory["kinds"].get(n) == "do"]
        if changing and s.rng.random() < self.p_change:
            return s.rng.choice(changing)
        return s.rng.choice(names)

    def _takers(self, s: Session) -> list[str]:
        """Functions with a parameter whose role takes a value the last call just returned."""
        pool: ValuePool = s.memory["pool"]
        fresh_roles = {r for r, _ in pool.fresh}
        if not fresh_roles:
            return []
        out = []
        for name in s.memory["tools"]:
            for p in s.memory["params"].get(name, []):
                if p.required and not p.enum and any(pool.table.accepts(p.role, r) for r in fresh_roles):
                    out.append(name)
                    break
        return out

    def fill(self, s: Session, name: str) -> dict[str, Any] | None:
        """Arguments for ``name``: every required parameter, some optional ones the goal
        templates mention; None when a required parameter has no value of its role."""
        mem, rng = s.memory, s.rng
        args: dict[str, Any] = {}
        context: dict[str, list[Any]] = defaultdict(list)  # role -> the values chosen so far
        mentioned = mem["mentioned"].get(name)
        params = mem["params"].get(name, [])
        bound = mem["pool"].table.bound
        # a value bound to an entity (a limit price to its stock) is chosen after the entity
        for p in sorted(params, key=lambda p: p.role in bound):
            if not p.required:
                if mentioned is not None and p.name not in mentioned:
                    continue
                if rng.random() >= self.p_optional:
                    continue
            value = self._value(s, name, p, taken=[v for k, v in args.items()], context=context)
            if value is None:
                if p.required:
                    return None
                continue
            args[p.name] = value
            context[p.role].extend(value if isinstance(value, list) else [value])
        return _ordered({p.name: args[p.name] for p in params if p.name in args})

    def _value(
        self,
        s: Session,
        fname: str,
        p: ParamRole,
        taken: list[Any] | None = None,
        context: dict[str, list[Any]] | None = None,
    ) -> Any:
        """A value of ``p``'s role (not one another parameter of the call already took)."""
        mem, rng = s.memory, s.rng
        bad = mem["bad"].get((fname, p.name), set()) | {_j(v) for v in taken or []}
        refs = [v for v in mem["refs"].get((fname, p.name), []) if _j(v) not in bad]
        if refs and rng.random() < 0.5:
            return refs[-1]
        return mem["pool"].pick(p, rng, bad, function=fname, context=context)


register("explorer", "rule")(RuleExplorer)
