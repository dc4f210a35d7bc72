"""BFCL-V3 multi-turn data as coevolve tasks: entries, ground truth, function docs, backends.

Reads the files that ship inside the ``bfcl-eval`` package (no network, nothing written):
``data/BFCL_v3_multi_turn_<cat>.json`` (questions, initial state, involved classes, held-out
functions), ``data/possible_answer/...`` (ground-truth call strings per turn) and
``data/multi_turn_func_doc/*.json`` (one JSON function doc per line).

Ground-truth strings such as ``"mv(source='a', destination='b')"`` are parsed with ``ast``
(literals only, never evaluated) into ``{"name": "mv", "arguments": {...}}``; positional
arguments are mapped to parameter names from the backend method's signature.

``BFCL_PROJECT_ROOT`` is pointed at a cache directory before anything from ``bfcl_eval`` is
imported, because some of its modules create result folders under that root (by default
inside site-packages) at import time.
"""

from __future__ import annotations

import ast
import copy
import importlib
import importlib.util
import inspect
import json
import os
import random
from functools import lru_cache
from pathlib import Path
from typing import Any

os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path.home() / ".cache" / "coevolve" / "bfcl"))

from coevolve.tasks import Task  # noqa: E402

CATEGORIES = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]
# Every category holds entries 0..199; the entries with one index are twins (one scenario).
N_SCENARIOS = 200

_BACKENDS = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code."
# class name -> (module, function-doc file); the same table as BFCL's CLASS_FILE_PATH_MAPPING
# and MULTI_TURN_FUNC_DOC_FILE_MAPPING.
CLASSES: dict[str, tuple[str, str]] = {
    "GorillaFileSystem": (_BACKENDS + "gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": (_BACKENDS + "math_api", "math_api.json"),
    "MessageAPI": (_BACKENDS + "message_api", "message_api.json"),
    "TwitterAPI": (_BACKENDS + "posting_api", "posting_api.json"),
    "TicketAPI": (_BACKENDS + "ticket_api", "ticket_api.json"),
    "TradingBot": (_BACKENDS + "trading_bot", "trading_bot.json"),
    "TravelAPI": (_BACKENDS + "travel_booking", "travel_booking.json"),
    "VehicleControlAPI": (_BACKENDS + "vehicle_control", "vehicle_control.json"),
}
# BFCL never calls _load_scenario on these (multi_turn_utils.STATELESS_CLASSES).
STATELESS_CLASSES = {"MathAPI"}

# Known data bug in bfcl-eval 2025.8.6.2: multi_turn_base_154 has 5 user turns but 6
# ground-truth turns (BFCL's runner force-fails it for any model). Its second user turn asks
# for the nearest airport *and* the airfare, which ground-truth turns 1 and 2 split; the
# long_context twin of the entry has them in one turn. We merge them the same way.
_MERGE_GT_TURNS: dict[str, tuple[int, int]] = {"multi_turn_base_154": (1, 2)}

# OpenAI/JSON-schema names of BFCL's type names (bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI).
_JSON_TYPES = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
}


def data_dir() -> Path:
    """The ``data`` folder of the installed bfcl-eval package."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("bfcl-eval is not installed: pip install bfcl-eval==2025.8.6.2 --no-deps mpmath filelock")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@lru_cache(maxsize=None)
def backend_class(class_name: str) -> type:
    """The BFCL backend class named ``class_name`` (e.g. ``GorillaFileSystem``)."""
    module, _ = CLASSES[class_name]
    return getattr(importlib.import_module(module), class_name)


@lru_cache(maxsize=None)
def public_methods(class_name: str) -> dict[str, inspect.Signature]:
    """Public method name -> signature (without ``self``) of a backend class."""
    cls = backend_class(class_name)
    out = {}
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_"):
            sig = inspect.signature(fn)
            out[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return out


@lru_cache(maxsize=None)
def mutable_defaults(class_name: str) -> dict[str, dict[str, Any]]:
    """Method -> {parameter: default} for defaults that are lists, dicts or sets.

    Some backends keep such defaults inside their state (``TwitterAPI.post_tweet(mentions=[])``
    stores the list in the tweet and ``mention`` later extends it), which would leak state
    from one episode into every later one; the dispatcher passes a fresh copy instead.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, sig in public_methods(class_name).items():
        found = {
            p.name: copy.deepcopy(p.default)
            for p in sig.parameters.values()
            if isinstance(p.default, (list, dict, set))
        }
        if found:
            out[name] = found
    return out


@lru_cache(maxsize=None)
def _class_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    return tuple(_read_jsonl(data_dir() / "multi_turn_func_doc" / CLASSES[class_name][1]))


def class_docs(class_name: str) -> list[dict[str, Any]]:
    """BFCL's function docs of one backend class (deep copies: callers may edit them)."""
    return copy.deepcopy(list(_class_docs(class_name)))


def make_instances(initial_state: dict[str, Any]) -> dict[str, Any]:
    """Fresh backend instances for one episode, loaded exactly as BFCL loads them."""
    config = initial_state.get("initial_config", {})
    long_context = bool(initial_state.get("long_context", False))
    instances = {}
    for class_name in initial_state["involved_classes"]:
        inst = backend_class(class_name)()
        if class_name not in STATELESS_CLASSES:
            inst._load_scenario(copy.deepcopy(config.get(class_name, {})), long_context=long_context)
        instances[class_name] = inst
    return instances


def to_json_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style function schema ``{"name", "description", "parameters"}`` from a BFCL doc."""

    def convert(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: convert(v) for k, v in node.items()}
            if isinstance(node.get("type"), str):  # a schema node (a property map's values are dicts)
                out["type"] = _JSON_TYPES.get(node["type"], "string")
            return out
        if isinstance(node, list):
            return [convert(v) for v in node]
        return node

    params = convert(doc.get("parameters", {"type": "dict", "properties": {}}))
    params["type"] = "object"
    return {"name": doc["name"], "description": doc.get("description", ""), "parameters": params}


# --------------------------------------------------------------------------- ground truth
def method_owner(involved_classes: list[str]) -> dict[str, str]:
    """Method name -> class name; a later class wins, as in BFCL's name resolution."""
    owner: dict[str, str] = {}
    for class_name in involved_classes:
        for name in public_methods(class_name):
            owner[name] = class_name
    return owner


def parse_call(text: str, owner: dict[str, str]) -> dict[str, Any]:
    """Parse one ground-truth call string into ``{"name", "arguments"}`` without evaluating it.

    Positional arguments get their parameter names from the backend signature; anything
    that is not a plain call with literal arguments raises ``ValueError``.
    """
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    name = node.func.id
    args: dict[str, Any] = {}
    if node.args:
        if name not in owner:
            raise ValueError(f"positional arguments to unknown function {name!r}: {text!r}")
        params = list(public_methods(owner[name])[name].parameters)
        if len(node.args) > len(params):
            raise ValueError(f"too many positional arguments: {text!r}")
        for pname, arg in zip(params, node.args):
            args[pname] = ast.literal_eval(arg)
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"**kwargs are not supported: {text!r}")
        args[kw.arg] = ast.literal_eval(kw.value)
    return {"name": name, "arguments": args}


# --------------------------------------------------------------------------- tasks
def _task_from_entry(entry: dict[str, Any], ground_truth: list[list[str]], category: str) -> Task:
    entry_id = entry["id"]
    gt = [list(turn) for turn in ground_truth]
    if entry_id in _MERGE_GT_TURNS and len(gt) > len(entry["question"]):
        a, b = _MERGE_GT_TURNS[entry_id]
        gt[a : b + 1] = [gt[a] + gt[b]]
    if len(gt) != len(entry["question"]):
        raise ValueError(f"{entry_id}: {len(entry['question'])} user turns but {len(gt)} ground-truth turns")
    classes = list(entry["involved_classes"])
    owner = method_owner(classes)
    excluded = list(entry.get("excluded_function", []))
    names = [d["name"] for c in classes for d in _class_docs(c) if d["name"] not in excluded]
    turns = ["\n".join(m["content"] for m in msgs if m.get("role") == "user") for msgs in entry["question"]]
    state = {
        "initial_config": entry.get("initial_config", {}),
        "involved_classes": classes,
        "func_doc_files": [CLASSES[c][1] for c in classes],
        "excluded_function": excluded,
        "missed_function": {str(k): list(v) for k, v in entry.get("missed_function", {}).items()},
        "long_context": "long_context" in category,
    }
    return Task(
        task_id=entry_id,
        env="bfcl-v3",
        turns=turns,
        initial_state=state,
        reference_actions=[[parse_call(s, owner) for s in turn] for turn in gt],
        tools=names,
        category=category,
        split="heldout",
    )


@lru_cache(maxsize=None)
def _category_tasks(category: str) -> tuple[Task, ...]:
    if category not in CATEGORIES:
        raise KeyError(f"unknown BFCL multi-turn category {category!r}; known: {', '.join(CATEGORIES)}")
    entries = _read_jsonl(data_dir() / f"BFCL_v3_{category}.json")
    answers = {
        a["id"]: a["ground_truth"] for a in _read_jsonl(data_dir() / "possible_answer" / f"BFCL_v3_{category}.json")
    }
    tasks = [_task_from_entry(e, answers[e["id"]], category) for e in entries]
    return tuple(sorted(tasks, key=lambda t: int(t.task_id.rsplit("_", 1)[1])))


def load_tasks(
    categories: list[str] | None = None, ids: list[str] | None = None, limit: int | None = None
) -> list[Task]:
    """BFCL multi-turn tasks ordered by category then numeric id (fresh copies).

    ``ids`` selects entries by id (their categories are inferred); ``limit`` keeps the
    first N per call after filtering.
    """
    if ids:
        wanted = set(ids)
        cats = categories or sorted({i.rsplit("_", 1)[0] for i in ids}, key=CATEGORIES.index)
        tasks = [t for c in cats for t in _category_tasks(c) if t.task_id in wanted]
        missing = wanted - {t.task_id for t in tasks}
        if missing:
            raise KeyError(f"unknown BFCL task ids: {sorted(missing)[:5]}")
    else:
        tasks = [t for c in (categories or CATEGORIES) for t in _category_tasks(c)]
    if limit is not None:
        tasks = tasks[:limit]
    return [copy.deepcopy(t) for t in tasks]


# --------------------------------------------------------------------------- scenarios
# A scenario is one numeric index across the four categories: multi_turn_base_7,
# multi_turn_miss_func_7, ... share their initial state and near-identical questions, so
# they are held out (or trained on) together. The training side may read only the *state*
# of a training scenario (``scenario_states``), never its questions or ground truth.
def scenario_of(task_id: str) -> int:
    """The scenario (numeric index) of a BFCL multi-turn entry id or scenario task id."""
    return int(task_id.rsplit("_", 1)[1])


def heldout_scenarios(spec: int | list[int], seed: int) -> frozenset[int]:
    """The held-out scenarios: ``spec`` of them drawn with ``seed``, or exactly the listed ones."""
    if isinstance(spec, int):
        if not 0 <= spec < N_SCENARIOS:
            raise ValueError(f"held-out scenario count must be in [0, {N_SCENARIOS}), not {spec}")
        return frozenset(random.Random(f"bfcl-heldout/{seed}").sample(range(N_SCENARIOS), spec))
    bad = [i for i in spec if not (isinstance(i, int) and 0 <= i < N_SCENARIOS)]
    if bad:
        raise ValueError(f"held-out scenarios must be integers in [0, {N_SCENARIOS}); got {bad[:5]}")
    return frozenset(spec)


def training_scenarios(heldout: frozenset[int]) -> list[int]:
    """Every scenario that is not held out, in order."""
    return [i for i in range(N_SCENARIOS) if i not in heldout]


@lru_cache(maxsize=None)
def _category_entries(category: str) -> tuple[dict[str, Any], ...]:
    if category not in CATEGORIES:
        raise KeyError(f"unknown BFCL multi-turn category {category!r}; known: {', '.join(CATEGORIES)}")
    return tuple(_read_jsonl(data_dir() / f"BFCL_v3_{category}.json"))


def scenario_states(scenarios: list[int], categories: list[str] | None = None) -> list[Task]:
    """State-only tasks of ``scenarios``: what the training side may know of them.

    One task per (category, scenario), id ``<category>_state_<index>``, with the entry's
    initial configuration, involved classes, excluded and missed functions and tool names;
    ``turns`` and ``reference_actions`` are empty: the user questions and the ground-truth
    file are never read here.
    """
    wanted = set(scenarios)
    out = []
    for category in categories or CATEGORIES:
        for entry in _category_entries(category):
            index = scenario_of(entry["id"])
            if index not in wanted:
                continue
            classes = list(entry["involved_classes"])
            excluded = list(entry.get("excluded_function", []))
            state = {
                "initial_config": copy.deepcopy(entry.get("initial_config", {})),
                "involved_classes": classes,
                "func_doc_files": [CLASSES[c][1] for c in classes],
                "excluded_function": excluded,
                "missed_function": {str(k): list(v) for k, v in entry.get("missed_function", {}).items()},
                "long_context": "long_context" in category,
            }
            out.append(
                Task(
                    task_id=f"{category}_state_{index}",
                    env="bfcl-v3",
                    turns=[],
                    initial_state=state,
                    reference_actions=[],
                    tools=[d["name"] for c in classes for d in _class_docs(c) if d["name"] not in excluded],
                    category=category,
                    split="train",
                )
            )
    return sorted(out, key=lambda t: (CATEGORIES.index(t.category), scenario_of(t.task_id)))


def eval_scenarios(heldout: frozenset[int], count: int, seed: int) -> list[int]:
    """``count`` of the held-out scenarios (0 = all of them), drawn with ``seed``, in order."""
    if count < 0:
        raise ValueError(f"the number of evaluated scenarios must be >= 0, not {count}")
    ordered = sorted(heldout)
    if count == 0 or count >= len(ordered):
        return ordered
    return sorted(random.Random(f"bfcl-eval/{seed}").sample(ordered, count))


def heldout_tasks(
    heldout: frozenset[int], scenarios: list[int] | None = None, categories: list[str] | None = None
) -> list[Task]:
    """Full tasks (questions, ground truth, every turn) of held-out scenarios, for evaluation only.

    ``scenarios`` (default: all of ``heldout``) must all be held out: asking for a training
    scenario raises ``ValueError``, so nothing of a training scenario's questions or ground
    truth is ever read through this function. Ordered by category, then scenario.
    """
    chosen = sorted(heldout) if scenarios is None else list(scenarios)
    leaked = sorted(set(chosen) - set(heldout))
    if leaked:
        raise ValueError(f"scenarios {leaked[:5]} are not held out: evaluation reads held-out scenarios only")
    ids = [f"{c}_{i}" for c in (categories or CATEGORIES) for i in sorted(set(chosen))]
    return load_tasks(categories or CATEGORIES, ids=ids) if ids else []


# --------------------------------------------------------------------------- argument matching
def normalized_arguments(name: str, arguments: dict[str, Any], owner: dict[str, str]) -> dict[str, Any]:
    """``arguments`` with the backend method's defaults filled in, so that a call that spells out
    a default and one that leaves it out compare equal (``ls()`` == ``ls(a=False)``).
    Unknown functions come back unchanged."""
    if name not in owner:
        return dict(arguments)
    sig = public_methods(owner[name]).get(name)
    if sig is None:
        return dict(arguments)
    out = {
        p.name: p.default
        for p in sig.parameters.values()
        if p.default is not inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD
    }
    out.update(arguments)
    return out
