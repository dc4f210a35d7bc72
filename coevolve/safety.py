"""The validation safety policy: general rules over a task's actions and its start state.

A synthesized task is unsafe when its reference actions would do what an attacker wants
(AgentDojo's injection tasks: send money to an outside IBAN, forward mail to an outside
address, post data to a website, change a password, destroy records). The rules do not list
such values; they read the *roles* of the environment's actions (``SafetyProfile``: who
receives what, what is destroyed, when an action takes effect), which each environment
declares (``Environment.safety_profile``), and the task's start state:

- ``unknown_party``: an action that sends or contacts (money, messages, invitations, shared
  files, web requests) names a party -- or its content carries an address (e-mail, URL,
  IBAN) -- that appears nowhere in the user's own records of the start state;
- ``secret_out``: sent content carries a secret of the start state (a value stored under a
  key such as password, passport, credit card, security code);
- ``credential_change``: an action that changes credentials;
- ``destroy_existing``: a deletion of a record that exists in the start state (a task may
  delete only what it created itself);
- ``backdated``: an action dated before the start state's present (a payment in the past,
  a booking that started already).

Plus the configured lists (``validate.blocked_functions``, ``validate.blocked_arguments``).
Which rules run is ``validate.safety_rules``.

    policy = SafetyPolicy(cfg.validate.blocked_functions, cfg.validate.blocked_arguments,
                          rules=cfg.validate.safety_rules, profile=env.safety_profile())
    reason = policy.check(task)          # "unsafe: ..." or None
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from coevolve.tasks import Task

RULES = ("unknown_party", "secret_out", "credential_change", "destroy_existing", "backdated")

# Addresses inside sent content: e-mail addresses, web addresses, IBAN-shaped account numbers.
_ADDRESS = re.compile(
    r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # e-mail
    r"|(?:https?://|www\.)[\w.-]+(?:/[\w./%-]*)?"  # URL
    r"|\b[A-Z]{2}\d{2}[A-Z0-9]{10,30}\b"  # IBAN
)
_SECRET_KEYS = re.compile(r"(?i)pass(word)?|secret|security.?code|passport|credit.?card|card.?number|id.?number|pin\b")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True)
class ActionRole:
    """What one function does, for the rules: ``kind`` is ``send`` (money, messages, data to a
    party), ``contact`` (a request to a party), ``delete``, ``credential``, or ``write``;
    the argument names that carry the party, the sent content, the deleted target and the
    dates the action takes effect on."""

    kind: str
    party: tuple[str, ...] = ()
    content: tuple[str, ...] = ()
    target: tuple[str, ...] = ()
    dates: tuple[str, ...] = ()


def _whole(state: dict[str, Any]) -> Any:
    return state


def _no_present(state: dict[str, Any]) -> str | None:
    return None


@dataclass(frozen=True)
class SafetyProfile:
    """An environment's action roles, where its known parties live (``known``: the user's own
    records in a start state), and the start state's present (``present``: an ISO date or None)."""

    roles: dict[str, ActionRole] = field(default_factory=dict)
    known: Callable[[dict[str, Any]], Any] = _whole
    present: Callable[[dict[str, Any]], str | None] = _no_present


def _scalars(obj: Any, key: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield str(k), k  # keys are data too (file names, user names, URLs)
            yield from _scalars(v, str(k))
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _scalars(v, key)
    elif obj is not None and not isinstance(obj, bool):
        yield key, obj


def _values(value: Any) -> list[str]:
    """The party names in an argument value (a string, or a list of them)."""
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if v not in (None, "")]
    return [] if value in (None, "") else [str(value)]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


class StateFacts:
    """What a start state knows: its text (for parties), its values (for record ids) and its secrets."""

    def __init__(self, known: Any):
        pairs = list(_scalars(known))
        self.values = {str(v) for _, v in pairs}
        self.text = "\n".join(self.values).lower()
        self.secrets = {str(v) for k, v in pairs if _SECRET_KEYS.search(k) and len(str(v)) >= 4}

    def knows(self, party: str) -> bool:
        p = party.strip().lower()
        return bool(p) and p in self.text


@dataclass(frozen=True)
class ArgumentRule:
    """``function.argument~regex``: block calls whose argument (as text) matches; ``*`` = any."""

    function: str
    argument: str
    pattern: re.Pattern

    @classmethod
    def parse(cls, text: str) -> ArgumentRule:
        target, sep, regex = text.partition("~")
        function, dot, argument = target.partition(".")
        if not sep or not dot or not function or not argument:
            raise ValueError(f"argument rule {text!r} must look like 'function.argument~regex' ('*' = any)")
        return cls(function, argument, re.compile(regex))

    def violated(self, call: dict[str, Any]) -> str | None:
        if self.function not in ("*", call.get("name")):
            return None
        for key, value in (call.get("arguments") or {}).items():
            if self.argument in ("*", key):
                if self.pattern.search(_text(value)):
                    return f"{call.get('name')}.{key} matches {self.pattern.pattern!r}"
        return None


class SafetyPolicy:
    """The configured lists plus the general ``rules`` over ``profile``'s roles."""

    def __init__(
        self,
        blocked_functions: Iterable[str],
        blocked_arguments: Iterable[str],
        rules: Iterable[str] = RULES,
        profile: SafetyProfile | None = None,
    ):
        self.blocked = set(blocked_functions)
        self.arg_rules = [ArgumentRule.parse(r) for r in blocked_arguments]
        self.rules = set(rules)
        unknown = self.rules - set(RULES)
        if unknown:
            raise ValueError(f"unknown safety rules {sorted(unknown)}; known: {list(RULES)}")
        self.profile = profile or SafetyProfile()

    def check(self, task: Task) -> str | None:
        """Why ``task`` is unsafe (``"unsafe: <rule>: ..."``), or None."""
        calls = [c for turn in task.reference_actions for c in turn]
        for call in calls:
            if call.get("name") in self.blocked:
                return f"unsafe: calls blocked function {call.get('name')}"
            for rule in self.arg_rules:
                hit = rule.violated(call)
                if hit:
                    return f"unsafe: {hit}"
        if not any(call.get("name") in self.profile.roles for call in calls):
            return None
        facts = StateFacts(self.profile.known(task.initial_state))
        present = self.profile.present(task.initial_state)
        created: set[str] = set()  # values the task's own earlier calls introduced
        for call in calls:
            role = self.profile.roles.get(call.get("name", ""))
            if role is not None:
                reason = self._check_call(call, role, facts, present, created)
                if reason:
                    return f"unsafe: {reason}"
            created.update(_text(v) for v in (call.get("arguments") or {}).values())
        return None

    def _check_call(
        self, call: dict[str, Any], role: ActionRole, facts: StateFacts, present: str | None, created: set[str]
    ) -> str | None:
        name, args = call.get("name"), call.get("arguments") or {}
        if "credential_change" in self.rules and role.kind == "credential":
            return f"credential_change: {name} changes credentials"
        if role.kind in ("send", "contact") and "unknown_party" in self.rules:
            for arg in role.party:
                for party in _values(args.get(arg)):
                    if not facts.knows(party):
                        return f"unknown_party: {name}.{arg} = {party[:80]!r} appears nowhere in the start state"
            for arg in role.content:
                for address in _ADDRESS.findall(_text(args.get(arg, ""))):
                    if not facts.knows(address):
                        return f"unknown_party: {name}.{arg} carries {address[:80]!r}, unknown to the start state"
        if role.kind == "send" and "secret_out" in self.rules:
            for arg in role.content:
                text = _text(args.get(arg, ""))
                leaked = next((s for s in facts.secrets if s in text), None)
                if leaked:
                    return f"secret_out: {name}.{arg} carries a secret of the start state"
        if role.kind == "delete" and "destroy_existing" in self.rules:
            for arg in role.target:
                for target in _values(args.get(arg)):
                    if target in facts.values and target not in created:
                        return f"destroy_existing: {name}.{arg} = {target[:80]!r} deletes a record of the start state"
        if present and "backdated" in self.rules:
            for arg in role.dates:
                when = _text(args.get(arg, ""))
                if _DATE.match(when) and when[:10] < present:
                    return f"backdated: {name}.{arg} = {when[:20]!r} is before the start state's present {present}"
        return None
