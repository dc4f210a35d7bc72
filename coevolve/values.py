"""Values by role: where a value comes from, and how one is made where none is known.

Where a value comes from decides whether it may fill a parameter (``ValuePool.options``):
a result observed earlier in the run, an entity of the start state, the parameter's enum (a
hard rule), or a realistic generator (``GENERATORS``), only for the roles a task may *create*
(a new file name, a message, an amount in the range the state suggests, a date in the stated
format). ``role_problem`` checks a value against the same rules the picker follows. The
roles themselves (``RoleTable``, ``param_roles``) are ``coevolve.roles``.

    table = env.value_roles()
    params = param_roles(doc, table)
    pool = ValuePool(table); pool.harvest(state_data)
    pool.harvest(json.loads(result), function="post_tweet")
    value = pool.pick(params[0], rng)           # None: nothing of that role is known
    role_problem(params[0], value, pool, "post_tweet")  # None: the value may fill it
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from coevolve.roles import ParamRole, RoleTable, fits, is_filler, key_role, plausible

_MAX_PER_ROLE = 60
_OWN_WORDS = {"text", "title"}  # roles whose values a user writes: never taken from a backend's reply


@dataclass
class Source:
    """Where a value came from: ``result`` (an earlier call's output), ``state``, ``arg``
    (an earlier call's argument: a folder just created), ``known`` (the environment's table)."""

    kind: str
    role: str


class ValuePool:
    """Values by role, newest last, each with where it was seen."""

    def __init__(self, table: RoleTable | None = None) -> None:
        self.table = table or RoleTable()
        self.by_role: dict[str, list[Any]] = defaultdict(list)
        self.sources: dict[str, str] = {}  # json(value)+role -> kind
        self.fresh: list[tuple[str, Any]] = []  # (role, value) revealed by the latest result
        self.attributes: dict[str, dict[str, Any]] = {}  # _k(role, entity) -> its numeric fields (a stock's price)
        for role, values in self.table.known.items():
            for v in values:
                self.add(role, v, "known")

    @staticmethod
    def _k(role: str, value: Any) -> str:
        return role + "\x00" + json.dumps(value, sort_keys=True, default=str)

    def add(self, role: str, value: Any, kind: str) -> None:
        if value is None or value in ("", "None", "null") or isinstance(value, dict):
            return
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0 and kind != "arg":
            if not role.endswith("_id"):
                return  # an empty tank or a zero count is no quantity a user asks about (id 0 is an id)
        if isinstance(value, str) and value.isdigit() and role.endswith("_id") and len(value) < 18:
            self.add(role, int(value), kind)  # an id as a dict key ("0": {...}) is also the number
        if isinstance(value, str) and (len(value) > 200 or is_filler(value)):
            return
        fmt = self.table.formats.get(role)
        if fmt and isinstance(value, str) and re.fullmatch(fmt, value) is None:
            return  # not a value of this role after all ("12/25" under a key named like a date)
        values = self.by_role[role]
        if value in values:
            values.remove(value)
        values.append(value)
        del values[:-_MAX_PER_ROLE]
        k = self._k(role, value)
        # a result outranks state outranks the rest: the first proof of a value is kept
        rank = {"result": 0, "state": 1, "arg": 2, "known": 3}
        if k not in self.sources or rank.get(kind, 9) < rank.get(self.sources[k], 9):
            self.sources[k] = kind

    def source(self, role: str, value: Any) -> str | None:
        return self.sources.get(self._k(role, value))

    def attribute(self, role: str, entity: Any, name: str) -> Any:
        """A numeric field of an entity the state or a result listed (``stocks``' NVDA: its price)."""
        return self.attributes.get(self._k(role, entity), {}).get(name)

    def bound_value(self, p: ParamRole, context: dict[str, list[Any]], rng: random.Random) -> Any:
        """For a role the table binds to an entity (``RoleTable.bound``), a value made from the
        attribute of the entity the call names (``context``: role -> the call's values so far);
        None when the call names none with that attribute."""
        spec = self.table.bound.get(p.role)
        if spec is None:
            return None
        entity_role, name, low, high = spec
        for entity in context.get(entity_role, []):
            base = self.attribute(entity_role, entity, name)
            if isinstance(base, (int, float)) and not isinstance(base, bool) and base > 0:
                value = round(base * rng.uniform(low, high), 2)
                return int(value) if p.type == "integer" else value
        return None

    def harvest(self, obj: Any, kind: str = "state", function: str = "", key: str = "") -> None:
        """Record every scalar of ``obj`` under the role of its nearest key (dict keys too,
        where the table says what they are)."""
        if kind == "result" and not key:
            self.fresh = []
        if isinstance(obj, dict):
            krole, vrole = self.table.dict_keys.get(key, ("", ""))
            for k, v in obj.items():
                if krole:
                    self._add(krole, k, kind)
                    if isinstance(v, dict):
                        fields = {f: x for f, x in v.items() if isinstance(x, (int, float)) and not isinstance(x, bool)}
                        self.attributes.setdefault(self._k(krole, k), {}).update(fields)
                if isinstance(v, dict) and v.get("type") in ("file", "directory"):
                    self._add("file" if v["type"] == "file" else "dir", k, kind)
                if krole and not isinstance(v, (dict, list)):
                    if vrole:
                        self._add(vrole, v, kind)
                    continue
                self.harvest(v, kind, function, str(k))
        elif isinstance(obj, list):
            for v in obj[:_MAX_PER_ROLE]:
                self.harvest(v, kind, function, key)
        elif isinstance(obj, (str, int, float)) and not isinstance(obj, bool) and key:
            self._add(key_role(key, self.table, function), obj, kind)

    def _add(self, role: str, value: Any, kind: str) -> None:
        if kind == "result" and role in _OWN_WORDS:
            return  # a backend's status text ("Message sent to USR008") is no message a user writes
        self.add(role, value, kind)
        if kind == "result":
            self.fresh.append((role, value))

    def options(self, p: ParamRole, bad: frozenset[str] | set[str] = frozenset()) -> list[tuple[Any, str]]:
        """Values that may fill ``p``, best first: results, state, earlier arguments, the
        environment's own values; each once, with its source kind. Enums are a hard rule."""
        rank = {"result": 0, "state": 1, "arg": 2, "known": 3}
        roles = [p.role, *self.table.compatible.get(p.role, ())]
        found: list[tuple[int, int, Any, str]] = []
        for r in roles:
            values = self.by_role.get(r, [])
            for age, v in enumerate(reversed(values)):
                if not fits(v, p.type if p.type != "array" else p.item_type):
                    continue
                if p.enum and v not in p.enum:
                    continue
                if json.dumps(v, default=str) in bad:
                    continue
                kind = self.sources.get(self._k(r, v), "known")
                found.append((rank.get(kind, 9), age, v, kind))
        found.sort(key=lambda x: (x[0], x[1]))
        seen, out = set(), []
        for _, _, v, kind in found:
            k = json.dumps(v, default=str)
            if k not in seen:
                seen.add(k)
                out.append((v, kind))
        return out

    def pick(
        self,
        p: ParamRole,
        rng: random.Random,
        bad: frozenset[str] | set[str] = frozenset(),
        function: str = "",
        context: dict[str, list[Any]] | None = None,
    ) -> Any:
        """A value for ``p``, or None when no value of its role is known and none may be made:
        for a role bound to an entity the call names (``context``: role -> the call's values so
        far), a value made from that entity (``bound_value``); for a parameter naming a new
        thing, a made-up value; else known values first (a fresh result most often), then the
        enum, then a generator. Arrays get 1-4 such values."""
        if context and p.type != "array":
            value = self.bound_value(p, context, rng)
            if value is not None and json.dumps(value, default=str) not in bad:
                return value
        if p.type == "array":
            k = rng.randint(2, 4) if p.role in ("number",) else rng.randint(1, 2)
            items: list[Any] = []
            for _ in range(k * 2):
                v = self._pick_one(p, rng, set(bad) | {json.dumps(x, default=str) for x in items}, function)
                if v is not None and v not in items:
                    items.append(v)
                if len(items) >= k:
                    break
            return items or None
        return self._pick_one(p, rng, bad, function)

    def _pick_one(self, p: ParamRole, rng: random.Random, bad: frozenset[str] | set[str], function: str) -> Any:
        if f"{function}.{p.name}" in self.table.new:
            made = generate(p, self, rng)
            taken = self.by_role.get(p.role, [])
            if made is not None and json.dumps(made, default=str) not in bad and made not in taken:
                return made
        options = self.options(p, bad)
        fresh = [v for r, v in self.fresh if self.table.accepts(p.role, r) and any(v == o for o, _ in options)]
        if fresh and rng.random() < 0.7:
            return _scalar(fresh[-1], p)
        if options and rng.random() < 0.85:
            i = min(int(rng.expovariate(0.6)), len(options) - 1)
            return _scalar(options[i][0], p)
        if p.enum:
            allowed = [v for v in p.enum if json.dumps(v, default=str) not in bad]
            if allowed:
                return rng.choice(allowed)
        made = generate(p, self, rng) if p.role not in self.table.existing else None
        if made is not None and json.dumps(made, default=str) not in bad:
            return made
        if options:
            return _scalar(options[0][0], p)
        return None


def _scalar(value: Any, p: ParamRole) -> Any:
    """A known value as the parameter's type wants it (an int where a float is asked)."""
    kind = p.item_type if p.type == "array" else p.type
    if kind in ("float", "number") and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


# ----------------------------------------------------------------------------- generators
_FILE_STEMS = [
    "meeting_notes",
    "budget_2024",
    "project_plan",
    "todo",
    "summary",
    "draft_report",
    "ideas",
    "expenses",
    "schedule",
    "reading_list",
    "contacts_backup",
    "release_notes",
    "minutes",
    "invoice",
]
_FILE_EXTS = [".txt", ".md", ".csv", ".log", ".pdf"]
_DIRS = ["reports", "drafts", "backup", "archive_2024", "projects", "temp", "notes", "photos", "invoices", "shared"]
_SENTENCES = [
    "Please review the latest figures before Friday.",
    "The meeting moved to 3 pm tomorrow.",
    "Thanks for the quick turnaround on this.",
    "Can you send me the updated schedule?",
    "Reminder: the deadline is next Monday.",
    "All tasks for this week are done.",
    "Let's sync on the budget later today.",
    "The shipment arrived this morning.",
]
_TITLES = [
    "Login issue",
    "Refund request",
    "Printer not working",
    "Update billing address",
    "Weekly sync",
    "Quarterly review",
    "Access request",
    "Broken link on the site",
]
_KEYWORDS = ["report", "budget", "meeting", "update", "project", "file"]


def _money(pool: ValuePool, rng: random.Random) -> float:
    """An amount in the range the state suggests (a fraction of the balances it holds)."""
    known = [v for r in ("money", "balance") for v in pool.by_role.get(r, []) if isinstance(v, (int, float)) and v > 0]
    top = max(known) if known else 1000.0
    step = 50 if top >= 500 else 5
    return float(max(step, round(rng.uniform(0.05, 0.4) * top / step) * step))


def _date(p: ParamRole, rng: random.Random) -> str:
    y, m, d = rng.choice([2024, 2025]), rng.randint(1, 12), rng.randint(1, 28)
    if p.fmt.startswith("YYYY-MM-DD HH:MM"):
        return f"{y}-{m:02d}-{d:02d} {rng.choice([9, 10, 13, 15, 17]):02d}:{rng.choice(['00', '30'])}"
    return f"{y}-{m:02d}-{d:02d}"


_FIRST = ["Emma", "Liam", "Olivia", "Noah", "Sophia", "Lucas", "Mia", "Ethan", "Ava", "Mason"]
_LAST = ["Johnson", "Garcia", "Miller", "Davis", "Martinez", "Wilson", "Anderson", "Taylor"]
_STREETS = ["123 Main Street", "45 Oak Avenue", "9 Lakeview Drive", "780 Pine Road", "2100 Elm Street"]
_STATES = ["CA", "NY", "TX", "WA", "IL"]


def _price(pool: ValuePool, rng: random.Random) -> float:
    """A price near one the state holds (a stock's), else a round figure."""
    known = [v for v in pool.by_role.get("price", []) if isinstance(v, (int, float)) and v > 0]
    base = rng.choice(known) if known else rng.choice([50.0, 120.0, 300.0])
    return round(base * rng.uniform(0.9, 1.1), 2)


def _number(pool: ValuePool, rng: random.Random) -> float:
    """A number of the magnitude the state's figures have, with one decimal now and then."""
    known = [v for v in pool.by_role.get("number", []) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if known and rng.random() < 0.5:
        return float(rng.choice(known))
    return float(rng.choice([rng.randint(2, 250), round(rng.uniform(1, 100), 1)]))


def _full_name(pool: ValuePool, rng: random.Random) -> str:
    first, last = pool.by_role.get("first_name", []), pool.by_role.get("last_name", [])
    if first and last:
        return f"{first[-1]} {last[-1]}"
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


def _handle(pool: ValuePool, rng: random.Random) -> str:
    users = [u for u in pool.by_role.get("twitter_user", []) if isinstance(u, str)]
    return "@" + (rng.choice(users).lstrip("@") if users else rng.choice(_FIRST).lower())


GENERATORS: dict[str, Any] = {
    "file_name": lambda p, pool, rng: rng.choice(_FILE_STEMS) + rng.choice(_FILE_EXTS),
    "dir_name": lambda p, pool, rng: rng.choice(_DIRS),
    "text": lambda p, pool, rng: rng.choice(_SENTENCES),
    "title": lambda p, pool, rng: rng.choice(_TITLES),
    "keyword": lambda p, pool, rng: rng.choice(_KEYWORDS),
    "money": lambda p, pool, rng: _money(pool, rng),
    "price": lambda p, pool, rng: _price(pool, rng),
    "number": lambda p, pool, rng: _number(pool, rng),
    "date": lambda p, pool, rng: _date(p, rng),
    "birth_date": lambda p, pool, rng: f"{rng.randint(1960, 2000)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
    "expiry": lambda p, pool, rng: f"{rng.randint(1, 12):02d}/{rng.randint(2026, 2030)}",
    "clock_time": lambda p, pool, rng: (
        f"{rng.choice([9, 10, 11, 1, 2, 3])}:{rng.choice(['00', '15', '30'])} " + rng.choice(["AM", "PM"])
    ),
    "flag": lambda p, pool, rng: rng.random() < 0.5,
    "person_name": lambda p, pool, rng: rng.choice(_FIRST),
    "full_name": lambda p, pool, rng: _full_name(pool, rng),
    "login": lambda p, pool, rng: rng.choice(_FIRST).lower() + rng.choice(["_ops", ".support", "_m", "88"]),
    "password": lambda p, pool, rng: rng.choice(["Blue", "Sun", "River", "Maple"]) + f"#{rng.randint(100, 999)}x",
    "token": lambda p, pool, rng: "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(10)),
    "passport": lambda p, pool, rng: f"US{rng.randint(1000000, 9999999)}",
    "card_number": lambda p, pool, rng: "4" + "".join(str(rng.randint(0, 9)) for _ in range(15)),
    "hashtag": lambda p, pool, rng: rng.choice(["#update", "#news", "#teamwork", "#travel", "#tech", "#weekend"]),
    "handle": lambda p, pool, rng: _handle(pool, rng),
    "address": lambda p, pool, rng: (
        f"{rng.choice(_STREETS)}, {rng.choice(pool.by_role.get('city') or ['Springfield'])}, {rng.choice(_STATES)}"
    ),
    "ticket_updates": lambda p, pool, rng: rng.choice(
        [{"priority": rng.randint(1, 5)}, {"status": "In Progress"}, {"title": rng.choice(_TITLES)}]
    ),
}


def generate(p: ParamRole, pool: ValuePool, rng: random.Random) -> Any:
    """A made-up value for ``p`` where its role may be created (the table's ``creatable``)."""
    gen_name = pool.table.creatable.get(p.role)
    if p.type == "boolean" and gen_name is None:
        gen_name = "flag"
    if gen_name is None:
        return None
    if p.examples and gen_name in ("text", "keyword", "title") and rng.random() < 0.3:
        return rng.choice(p.examples)
    gen = GENERATORS.get(gen_name)
    if gen is None and gen_name.startswith("range:"):  # "range:lo:hi[:step]" numbers
        lo, hi, *rest = (float(x) for x in gen_name.split(":")[1:])
        step = rest[0] if rest else 1.0
        value = lo + step * rng.randint(0, int((hi - lo) / step))
        return int(value) if p.type == "integer" else round(value, 2)
    if gen is None and gen_name.startswith("choice:"):  # "choice:a|b|c" realistic picks
        choice = rng.choice(gen_name.split(":", 1)[1].split("|"))
        return float(choice) if p.type in ("float", "number") else int(choice) if p.type == "integer" else choice
    if gen is None:
        return None
    value = gen(p, pool, rng)
    if p.type == "integer" and isinstance(value, float):
        return int(value)
    return value


def role_problem(p: ParamRole, value: Any, pool: ValuePool, function: str = "") -> str | None:
    """Why ``value`` may not fill ``p`` (the same rules the picker follows), or None: the
    enum is a hard rule; otherwise the value must have been seen with ``p``'s role (a result,
    the state, an earlier argument, the environment's own values) or be a plausible made-up
    value of a role a task may create."""
    table = pool.table
    if isinstance(value, list) and p.type == "array":
        return next(
            (
                e
                for e in (role_problem(dataclasses.replace(p, type=p.item_type), v, pool, function) for v in value)
                if e
            ),
            None,
        )
    if is_filler(value):
        return f"filler: {function}.{p.name}={value!r}"
    if isinstance(value, bool):  # a yes/no has no role beyond its type
        return None if p.type == "boolean" else f"wrong role: {function}.{p.name}={value!r} is no {p.role}"
    if p.enum:
        return None if value in p.enum else f"wrong role: {function}.{p.name}={value!r} is not one of its enum"
    if isinstance(value, dict):
        return None if p.role in table.creatable else f"wrong role: {function}.{p.name} takes no object"
    roles = [p.role, *table.compatible.get(p.role, ())]
    if any(pool.source(r, value) for r in roles):
        return None
    made_ok = p.role in table.creatable and (p.role not in table.existing or f"{function}.{p.name}" in table.new)
    if made_ok and plausible(p.role, value, table):
        return None
    return f"wrong role: {function}.{p.name}={value!r} is no known {p.role}"
