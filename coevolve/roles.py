"""Roles of values: what a tool parameter takes and what a value in a state or a result is.

A **role** names the kind of thing a value is: ``file``, ``dir``, ``stock_symbol``,
``user_id``, ``money``, ``date``... A synthesized task may only give a parameter a value of
the parameter's own role, so that no request ever reads "log in as Open with password NVDA".
Roles come from three places, most specific first:

1. the environment's ``RoleTable`` (``Environment.value_roles``): where names mislead
   (BFCL's ``estimate_distance.cityA`` takes a zip code), what dict keys of its state are
   (the keys of TradingBot's ``stocks`` are symbols), what an ``id`` field of a result is;
2. generic rules over the parameter's name and description (``*_id``, ``file_name``,
   ``password``, a stated ``YYYY-MM-DD`` format, ``amount``, ``content``...);
3. the JSON type (``number``, ``count``) or, for a string nobody could name, a role of its
   own (``name:<param>``), which only a value found under the same name can take.

Which values of a role are known, and how one is made, is ``coevolve.values``. A value is
never ``"<param> 12"`` or ``"item_7"``: ``is_filler`` is the check the validation gate runs
on every reference value.

    table = env.value_roles()
    params = param_roles(doc, table)            # [ParamRole(name, type, role, enum, fmt, ...)]
    key_role("symbol", table)                   # "stock_symbol": the role of scalars under a key
    fits(3, params[0].type)                     # the value has the parameter's JSON type
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_ENUM = re.compile(r"\[Enum\]:\s*(\[[^\]]*\]|[^.\n]*)")
_EXAMPLE = re.compile(r"e\.g\.,?\s*'([^']+)'")
_TOKENS = re.compile(r"[_\W]+|(?<=[a-z])(?=[A-Z])")

# Values no user would write: a parameter's name with a number ("city 72", "name 14"), the
# explorer's old placeholders ("item_36", "notes_12.txt", "folder_3"), bare schema words.
_FILLER = re.compile(
    r"^(?:item_\d+|notes_\d+\.txt|folder_\d+|[a-z]+(?:[ _][a-z]+)* \d{1,3}|(?:string|value|text|example|test|foo|bar)\d*)$"
)


def is_filler(value: Any) -> bool:
    """Is ``value`` (or any string in it) schema filler rather than something a user would say?"""
    if isinstance(value, str):
        return bool(_FILLER.fullmatch(value.strip()))
    if isinstance(value, list):
        return any(is_filler(v) for v in value)
    if isinstance(value, dict):
        return any(is_filler(v) for v in value.values())
    return False


def tokens(name: str) -> list[str]:
    """Lower-case words of a name or a text: ``pressBrakePedal`` -> press, brake, pedal."""
    return [t.lower() for t in _TOKENS.split(name) if t]


# ----------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class RoleTable:
    """An environment's role knowledge (all optional; the generic rules do the rest).

    - ``params``: ``"function.param"`` or ``"param"`` -> role, where names mislead;
    - ``keys``: a state or result key -> the role of the scalars under it (``"symbol"`` ->
      ``stock_symbol``); ``"function.key"`` for one function's results (``post_tweet.id``);
    - ``dict_keys``: a state key -> ``(role of its dict's keys, role of its values or "")``
      (TradingBot's ``stocks``: its keys are symbols);
    - ``known``: role -> values the environment itself defines (BFCL's company names);
    - ``creatable``: roles a task may invent a value of, with the generator's name
      (``{"file": "file_name", "money": "money"}``; see ``coevolve.values.GENERATORS``);
    - ``aliases``: role -> {value: how a user names it} (``stock_symbol``: TSLA -> Tesla), said
      only where a tool maps the name back (``alias_via``: the role that tool takes, ``company``);
    - ``compatible``: role -> other roles whose values it also takes (``node``: file, dir);
    - ``formats``: role -> a regular expression every value of the role matches;
    - ``new``: ``"function.param"`` that names a thing the call creates (``mkdir.dir_name``):
      a made-up value is tried first, since an existing one would only collide;
    - ``existing``: creatable roles whose values must otherwise exist (``cat`` reads a file
      that is there: a name is made up only where a call creates it);
    - ``bound``: role -> ``(entity role, attribute, low, high)``: in a call that also names an
      entity of that role, a value is made from the entity's attribute in the state, times a
      factor in ``[low, high]`` (a limit price near *its* stock's price, not another's).
    """

    params: dict[str, str] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    dict_keys: dict[str, tuple[str, str]] = field(default_factory=dict)
    known: dict[str, list[Any]] = field(default_factory=dict)
    creatable: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, dict[Any, str]] = field(default_factory=dict)
    compatible: dict[str, tuple[str, ...]] = field(default_factory=dict)
    formats: dict[str, str] = field(default_factory=dict)
    new: frozenset[str] = frozenset()  # "function.param" naming a thing the call creates: made up first
    existing: frozenset[str] = frozenset()  # creatable roles made up only for ``new`` parameters
    alias_via: dict[str, str] = field(default_factory=dict)  # role -> the role of its aliases (a mapping tool's input)
    bound: dict[str, tuple[str, str, float, float]] = field(default_factory=dict)

    def accepts(self, param_role: str, value_role: str) -> bool:
        return value_role == param_role or value_role in self.compatible.get(param_role, ())


# ----------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class ParamRole:
    name: str
    type: str  # JSON-schema type name as the doc gives it
    required: bool
    role: str
    enum: tuple[Any, ...] = ()
    item_type: str = "string"
    fmt: str = ""  # a format the description states: YYYY-MM-DD, MM/YYYY, HH:MM AM/PM
    description: str = ""
    examples: tuple[str, ...] = ()  # values the description gives as examples


_FORMATS = ("YYYY-MM-DD HH:MM", "YYYY-MM-DD", "MM/YYYY", "MM/YY", "HH:MM AM/PM", "HH:MM")


def _enum_of(p: dict[str, Any]) -> list[Any]:
    if p.get("enum"):
        return list(p["enum"])
    items = p.get("items") or {}
    if items.get("enum"):
        return list(items["enum"])
    m = _ENUM.search(p.get("description", ""))
    if not m:
        return []
    text = m.group(1).strip()
    if text.startswith("["):
        try:
            return list(json.loads(text))
        except json.JSONDecodeError:
            text = text.strip("[]")
    return [v.strip().strip("'\"") for v in text.split(",") if v.strip().strip("'\"")]


def _generic_role(name: str, ptype: str, description: str, fmt: str) -> str:
    """The role a parameter's name, description and type suggest (see the module docstring)."""
    t = tokens(name)
    last = t[-1] if t else ""
    d = description.lower()
    if fmt.startswith("YYYY-MM-DD"):
        return "date"
    if fmt.startswith("HH:MM"):
        return "clock_time"
    if fmt.startswith("MM/"):
        return "expiry"
    if last == "id" and len(t) > 1:
        return "_".join(t[:-1]) + "_id"
    if last == "ids" and len(t) > 1:
        return "_".join(t[:-1]) + "_id"
    if "password" in t:
        return "password"
    if "email" in t or "emails" in t or "recipients" in t:
        return "email"
    if name in ("file_name", "filename") or (("file" in t) and "name" in t):
        return "file"
    if "dir" in t or "folder" in t or ("directory" in t and ptype == "string"):
        return "dir"
    if {"content", "message", "body", "comment", "resolution"} & set(t):
        return "text"
    if {"title", "subject"} & set(t):
        return "title"
    if "description" in t:
        return "text"
    if {"keyword", "query", "pattern"} & set(t):
        return "keyword"
    if ptype in ("number", "float", "integer") and {"amount", "price", "cost", "balance", "budget", "limit"} & set(t):
        return "money"
    if ptype in ("number", "float"):
        return "number"
    if ptype == "integer":
        return "count"
    if ptype == "boolean":
        return "flag"
    if "date" in t or "day" in t or "date" in d.split():
        return "date"
    return f"name:{name}"


def param_roles(doc: dict[str, Any], table: RoleTable | None = None) -> list[ParamRole]:
    """The parameters of a function doc, each with its role (table first, then the rules)."""
    table = table or RoleTable()
    spec = doc.get("parameters") or {}
    required = set(spec.get("required") or [])
    fname = doc.get("name", "")
    out = []
    for name, p in (spec.get("properties") or {}).items():
        desc = p.get("description", "") or ""
        fmt = next((f for f in _FORMATS if f in desc), "")
        ptype = p.get("type", "string")
        role = table.params.get(f"{fname}.{name}") or table.params.get(name) or _generic_role(name, ptype, desc, fmt)
        item = (p.get("items") or {}).get("type", "string")
        out.append(
            ParamRole(
                name, ptype, name in required, role, tuple(_enum_of(p)), item, fmt, desc, tuple(_EXAMPLE.findall(desc))
            )
        )
    return out


# ----------------------------------------------------------------------------- values' roles
_TYPES = {
    "string": (str,),
    "integer": (int,),
    "float": (int, float),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "list": (list,),
    "dict": (dict,),
    "object": (dict,),
}


def fits(value: Any, type_name: str) -> bool:
    """Does ``value`` have the JSON-schema type ``type_name`` (bools are not numbers)?"""
    types = _TYPES.get(type_name)
    if types is None:
        return True
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def key_role(key: str, table: RoleTable, function: str = "") -> str:
    """The role of the scalars found under ``key`` (in a state or in ``function``'s result)."""
    if function and f"{function}.{key}" in table.keys:
        return table.keys[f"{function}.{key}"]
    if key in table.keys:
        return table.keys[key]
    return table.params.get(key) or _generic_role(key, "string", "", "")


def plausible(role: str, value: Any, table: RoleTable) -> bool:
    """Does a made-up value of ``role`` look like one (its table format, no filler)?"""
    if is_filler(value):
        return False
    fmt = table.formats.get(role)
    if fmt and isinstance(value, str):
        return re.fullmatch(fmt, value) is not None
    return True
