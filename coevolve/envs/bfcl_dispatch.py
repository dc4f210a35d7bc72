"""Calls into BFCL's backend classes, checked and isolated: the only way an agent's call reaches one.

    dispatcher = Dispatcher(instances)          # {class name: backend instance} of one episode
    error = dispatcher.check("cd", {"folder": "document"})
    content, error = dispatcher.call("cd", {"folder": "document"}) if error is None else ("", error)

Calls are dispatched by name to the public methods of the episode's instances, with keyword
arguments, never ``eval``. Unknown names, bad or oversized arguments and backend exceptions come
back as an error string, never a crash. ``run_with_timeout`` bounds a call's wall-clock time.
"""

from __future__ import annotations

import copy
import decimal
import json
import re
import threading
from typing import Any

import mpmath

from coevolve.envs import bfcl_data

# Guards applied before a call reaches a backend. BFCL has none, but some backends do
# unbounded work on absurd inputs while holding the GIL (``power`` on huge ints, ``square_root``
# with a huge precision), where no wall-clock limit can interrupt them. The ground truth's
# largest integer is 987654 and its largest precision 10, far inside these bounds.
MAX_ARGS_CHARS = 65536
MAX_ABS_INT = 10**18
ARG_LIMITS: dict[tuple[str, str], float] = {
    ("power", "exponent"): 10_000,
    ("logarithm", "precision"): 10_000,
    ("square_root", "precision"): 10_000,
}
# MathAPI.logarithm sets mpmath's process-wide precision before computing; calls into MathAPI
# are serialized and mpmath's precision restored, so parallel episodes cannot race on it.
_MPMATH_LOCK = threading.Lock()


# A Python set rendered into a backend's message ("Invalid travel class. Must be one of {'first',
# 'economy', 'business'}") lists its members in hash order, which changes from process to process
# (PYTHONHASHSEED): the same call on the same state would read differently in two runs. Their
# members are sorted, so that an observation depends on the state and the call alone.
_SET_OF_STRINGS = re.compile(r"\{'[^'{}:]*'(?:, '[^'{}:]*')+\}")


def stable_sets(text: str) -> str:
    """``text`` with every rendered set of two or more strings in sorted order."""
    return _SET_OF_STRINGS.sub(lambda m: "{" + ", ".join(sorted(re.findall(r"'[^']*'", m.group()))) + "}", text)


def format_result(result: Any) -> str:
    """A backend return value as BFCL's executor renders it (str / JSON for dicts / str())."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except Exception:
            return str(result)
    return str(result)


def _check_value(value: Any, depth: int = 0) -> str | None:
    if depth > 32:
        return "arguments nested too deeply"
    if isinstance(value, bool) or value is None or isinstance(value, (float, str)):
        return None
    if isinstance(value, int):
        return None if abs(value) <= MAX_ABS_INT else f"integer argument out of range (|x| > {MAX_ABS_INT})"
    if isinstance(value, (list, tuple)):
        return next((e for e in (_check_value(v, depth + 1) for v in value) if e), None)
    if isinstance(value, dict):
        return next((e for e in (_check_value(v, depth + 1) for v in value.values()) if e), None)
    return f"unsupported argument type {type(value).__name__}"


class Dispatcher:
    """Name -> bound public method of one episode's instances; the only way calls reach a backend."""

    def __init__(self, instances: dict[str, Any]):
        self.instances = instances
        self._methods: dict[str, Any] = {}
        owner = bfcl_data.method_owner(list(instances))
        for name, class_name in owner.items():
            self._methods[name] = getattr(instances[class_name], name)
        self._math = {name for name, class_name in owner.items() if class_name == "MathAPI"}
        self._defaults = {
            name: bfcl_data.mutable_defaults(class_name)[name]
            for name, class_name in owner.items()
            if name in bfcl_data.mutable_defaults(class_name)
        }

    def check(self, name: Any, arguments: Any) -> str | None:
        """Why the call cannot be dispatched, or None."""
        if not isinstance(name, str) or name not in self._methods:
            shown = name if isinstance(name, str) and len(name) < 80 else f"{str(name)[:80]}..."
            return f"unknown function {shown!r}"
        if not isinstance(arguments, dict) or not all(isinstance(k, str) for k in arguments):
            return "arguments must be an object of named parameters"
        try:
            size = len(json.dumps(arguments))
        except (TypeError, ValueError) as exc:
            return f"arguments are not JSON: {exc}"
        if size > MAX_ARGS_CHARS:
            return f"arguments too large ({size} > {MAX_ARGS_CHARS} characters)"
        for key, value in arguments.items():
            limit = ARG_LIMITS.get((name, key))
            if limit is not None and isinstance(value, (int, float)) and not abs(value) <= limit:
                return f"argument {key}={value!r} out of range (|{key}| <= {limit:g})"
        return _check_value(arguments)

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, str | None]:
        """Run one checked call; returns (result as BFCL renders it, error or None)."""
        # decimal's context is per thread and MathAPI.square_root changes its precision:
        # keep that change inside the call. mpmath's precision is process-wide (see above).
        with decimal.localcontext():
            if name not in self._math:
                return self._invoke(name, arguments)
            with _MPMATH_LOCK, mpmath.workprec(mpmath.mp.prec):
                return self._invoke(name, arguments)

    def _invoke(self, name: str, arguments: dict[str, Any]) -> tuple[str, str | None]:
        # Backends keep argument objects in their state: give them copies, so that neither the
        # caller's dicts (a task's reference calls, a logged action) nor shared defaults change.
        kwargs = {k: copy.deepcopy(v) for k, v in self._defaults.get(name, {}).items() if k not in arguments}
        try:
            kwargs.update(copy.deepcopy(arguments))
            result = self._methods[name](**kwargs)
            # Backends report domain failures as {"error": ...}; surface them in the error field too.
            failed = type(result) is dict and "error" in result
            content, error = format_result(result), (str(result["error"]) if failed else None)
        except Exception as exc:  # a backend failure is an observation, never a crash
            content, error = f"Error during execution: {exc}", f"{type(exc).__name__}: {exc}"
        return stable_sets(content), (stable_sets(error) if error is not None else None)


def run_with_timeout(fn: Any, args: tuple, timeout_s: float | None) -> tuple[Any, bool]:
    """(fn(*args), timed_out). The call runs in a daemon thread so that a runaway backend
    cannot hang the caller; a call that overruns is abandoned (its episode ends)."""
    if not timeout_s:
        return fn(*args), False
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(fn(*args)), daemon=True)
    worker.start()
    worker.join(timeout_s)
    return (box[0], False) if box else (None, True)
