"""What a task pool looks like: quality-gate verdicts and shape figures, per round, beside BFCL's.

    coevolve bench tasks --store .coevolve/store                 # the latest pool, BFCL yardstick on
    coevolve bench tasks --store S --no-yardstick --json out.json

Over the training tasks (``split == 'train'``) of a store's latest pool, overall and per
``created_round``:

- the share of tasks that pass every rule of the quality gate (``coevolve.quality``), and the
  share failing each rule (``filler``, ``wrong role``, ``failing goal``; ``gate error`` where
  the gate itself raised);
- turns per task and calls per turn (means and histograms);
- the share of turns that change the state (the reference calls replayed in a fresh episode,
  ``Episode.state_fingerprint`` before and after each turn's calls);
- the share of calls that reuse an earlier result: a scalar argument value (a string of 2+
  characters, a number other than 0-9) found as a token in an earlier call's result text;
- the functions the reference calls use out of those the tasks offer (``function_docs``).

``bfcl_yardstick`` computes the same figures for BFCL-V3's own ``multi_turn_base`` entries (their
ground truth as the reference): a column to compare with, never data.

    report = pool_report(Store("/tmp/cv"))          # {"overall": figures, "by_round": {...}, ...}
    render(report, bfcl_yardstick(200))             # rich tables on stdout
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from coevolve.envs.base import ToolCall
from coevolve.quality import RULES, rule_of, task_problems
from coevolve.store import Store
from coevolve.tasks import Task

GATE_ERROR = "gate error"  # the gate raised on the task: counted as a broken rule of its own
TURN_BUCKETS = ("1", "2", "3", "4", "5", "6+")
CALL_BUCKETS = ("0", "1", "2", "3", "4+")
N_EXAMPLES = 3  # gate problems shown per rule (pool only)


# ----------------------------------------------------------------------------- one task
@dataclass
class TaskShape:
    """The figures of one task, before they are summed over a group of tasks."""

    task_id: str
    created_round: int
    calls_per_turn: list[int]  # reference calls of each turn
    problems: list[str]  # the gate's problem texts (``[GATE_ERROR: ...]`` when it raised)
    used: set[str]  # names of the reference calls
    offered: set[str]  # names of env.function_docs(task)
    replayed: bool = False  # False: the replay raised; the two figures below are left out
    changing_turns: int = 0
    reusing_calls: int = 0

    @property
    def rules(self) -> set[str]:
        return {rule_of(p) for p in self.problems}


def _scalars(value: Any):
    """The scalar values of an argument that may carry an earlier result: strings of length
    >= 2 and numbers other than the integers 0-9 (bools and None never), lists/dicts walked."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        if len(value) >= 2:
            yield value
    elif isinstance(value, (int, float)):
        if not (float(value).is_integer() and 0 <= value <= 9):
            yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _scalars(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _scalars(v)


def appears(value: Any, text: str) -> bool:
    """Does the scalar ``value`` occur in ``text`` as a whole token, in its str or JSON form?
    ``'1'`` does not match ``'12'``, ``12`` does not match ``12.5``, ``doc`` not ``docs``."""
    if isinstance(value, str):
        forms = {value, json.dumps(value)[1:-1]}  # as it is, and as a JSON result escapes it
        before, after = r"(?<!\w)", r"(?!\w)"
    else:
        forms = {str(value), json.dumps(value)}
        before, after = r"(?<![\w.\-])", r"(?!\w|\.\d)"
    return any(re.search(before + re.escape(f) + after, text) for f in forms if f)


def _replay(env: Any, task: Task, shape: TaskShape) -> None:
    """Replay the reference calls in a fresh episode; count the turns whose calls change the
    state (every turn with a call, if the episode has no ``state_fingerprint``) and the calls
    reusing a value an earlier call's result showed."""
    episode = env.episode(task)
    fingerprint = getattr(episode, "state_fingerprint", None)
    seen = ""  # the text of every earlier result, newline-separated
    for t, calls in enumerate(task.reference_actions):
        episode.user_message(t)
        before = fingerprint() if fingerprint else None
        for call in calls:
            args = call.get("arguments") or {}
            if seen and any(appears(v, seen) for v in _scalars(args)):
                shape.reusing_calls += 1
            obs = episode.step(ToolCall(call.get("name", ""), args))
            seen += "\n" + str(obs.content)
        if calls and (fingerprint is None or fingerprint() != before):
            shape.changing_turns += 1
        episode.end_turn()
    shape.replayed = True


def task_shape(env: Any, task: Task, gate: bool = True) -> TaskShape:
    """The figures of ``task`` in ``env`` (an environment instance, or None when the task's
    environment could not be made). Never raises: the gate raising is problem ``gate error``,
    the replay raising leaves the task out of the state-change and reuse figures."""
    calls = [c for turn in task.reference_actions for c in turn]
    shape = TaskShape(
        task_id=task.task_id,
        created_round=int(task.created_round or 0),
        calls_per_turn=[len(turn) for turn in task.reference_actions],
        problems=[],
        used={c.get("name", "") for c in calls},
        offered=set(),
    )
    if env is None:
        shape.problems = [f"{GATE_ERROR}: no environment {task.env!r}"]
        return shape
    try:
        shape.offered = {d["name"] for d in env.function_docs(task)}
    except Exception:  # noqa: BLE001 - a report never crashes on one task
        pass
    if gate:
        try:
            shape.problems = list(task_problems(env, task))
        except Exception as exc:  # noqa: BLE001
            shape.problems = [f"{GATE_ERROR}: {type(exc).__name__}: {exc}"[:300]]
    try:
        _replay(env, task, shape)
    except Exception:  # noqa: BLE001
        shape.replayed, shape.changing_turns, shape.reusing_calls = False, 0, 0
    return shape


# ----------------------------------------------------------------------------- a group of tasks
def _share(n: int, d: int) -> float | None:
    return round(n / d, 4) if d else None


def _bucket(n: int, buckets: tuple[str, ...]) -> str:
    top = int(buckets[-1].rstrip("+"))
    return f"{top}+" if n >= top else str(n)


def summarize(shapes: list[TaskShape], examples: bool = True) -> dict[str, Any]:
    """Figures of a group of tasks (see the module docstring). Shares are in [0, 1], None where
    their denominator is 0. ``examples``: up to N_EXAMPLES problem texts per rule, with task ids."""
    n = len(shapes)
    rule_counts = Counter(r for s in shapes for r in s.rules)
    rules = {r: rule_counts.get(r, 0) for r in RULES} | dict(rule_counts)
    passing = sum(1 for s in shapes if not s.problems)
    turns = [len(s.calls_per_turn) for s in shapes]
    per_turn = [c for s in shapes for c in s.calls_per_turn]
    turns_hist = dict.fromkeys(TURN_BUCKETS, 0)
    for t in turns:
        turns_hist[_bucket(t, TURN_BUCKETS)] = turns_hist.get(_bucket(t, TURN_BUCKETS), 0) + 1
    calls_hist = dict.fromkeys(CALL_BUCKETS, 0)
    for c in per_turn:
        calls_hist[_bucket(c, CALL_BUCKETS)] += 1
    replayed = [s for s in shapes if s.replayed]
    replayed_turns = sum(len(s.calls_per_turn) for s in replayed)
    replayed_calls = sum(sum(s.calls_per_turn) for s in replayed)
    changing = sum(s.changing_turns for s in replayed)
    reusing = sum(s.reusing_calls for s in replayed)
    offered = set().union(*(s.offered for s in shapes)) if shapes else set()
    used = set().union(*(s.used for s in shapes)) if shapes else set()
    out: dict[str, Any] = {
        "tasks": n,
        "passing": passing,
        "passing_share": _share(passing, n),
        "rule_counts": rules,
        "rule_shares": {r: _share(k, n) for r, k in rules.items()},
        "turns": sum(turns),
        "turns_mean": round(sum(turns) / n, 4) if n else None,
        "turns_hist": turns_hist,
        "calls": sum(per_turn),
        "calls_per_turn_mean": round(sum(per_turn) / len(per_turn), 4) if per_turn else None,
        "calls_hist": calls_hist,
        "replay_errors": n - len(replayed),
        "replayed_turns": replayed_turns,
        "changing_turns": changing,
        "state_change_share": _share(changing, replayed_turns),
        "replayed_calls": replayed_calls,
        "reusing_calls": reusing,
        "reuse_share": _share(reusing, replayed_calls),
        "functions_offered": len(offered),
        "functions_used": len(used & offered),
        "unused_functions": sorted(offered - used),
        "not_offered_functions": sorted(used - offered),  # called by a reference, offered by no doc
    }
    if examples:
        ex: dict[str, list[str]] = {}
        for s in shapes:
            first: dict[str, str] = {}  # one problem per task and rule
            for p in s.problems:
                first.setdefault(rule_of(p), p)
            for rule, p in first.items():
                bucket = ex.setdefault(rule, [])
                if len(bucket) < N_EXAMPLES:
                    bucket.append(f"{s.task_id}: {p}")
        out["examples"] = ex
    return out


def shapes_of(tasks: list[Task], envs: dict[str, Any] | None = None, gate: bool = True) -> list[TaskShape]:
    """``task_shape`` of each task, with one environment per env name (``envs``: a cache of
    name -> instance, filled here; None where the registry cannot make one)."""
    from coevolve.registry import resolve

    envs = {} if envs is None else envs
    out = []
    for task in tasks:
        if task.env not in envs:
            try:
                envs[task.env] = resolve("environment", task.env)()
            except Exception:  # noqa: BLE001 - its tasks count as gate errors
                envs[task.env] = None
        out.append(task_shape(envs[task.env], task, gate=gate))
    return out


def pool_report(store: Store | str, env_name: str | None = None) -> dict[str, Any]:
    """The figures of a store's latest pool: its training tasks (``split == 'train'``; of
    ``env_name`` only, when given), overall and per ``created_round``.

    Returns ``{"store", "pool_version", "pool_tasks", "left_out": {reason: n}, "envs",
    "seconds", "overall": figures, "by_round": {round (str): figures}}``; figures as
    ``summarize`` gives them."""
    store = Store(store) if isinstance(store, str) else store
    start = time.perf_counter()
    version = store.latest_pool()
    rows = store.pool_tasks(version).to_pylist()
    left_out: Counter[str] = Counter()
    tasks = []
    for row in rows:
        if row.get("split") != "train":
            left_out[f"split {row.get('split')}"] += 1
        elif env_name and row.get("env") != env_name:
            left_out[f"env {row.get('env')}"] += 1
        else:
            try:
                tasks.append(Task.from_row(row))
            except Exception:  # noqa: BLE001 - an undecodable row is reported, not fatal
                left_out["undecodable"] += 1
    shapes = shapes_of(tasks)
    rounds = sorted({s.created_round for s in shapes})
    return {
        "store": store.uri,
        "pool_version": version.version if version else None,
        "pool_tasks": len(rows),
        "left_out": dict(left_out),
        "envs": sorted({t.env for t in tasks}),
        "seconds": round(time.perf_counter() - start, 2),
        "overall": summarize(shapes),
        "by_round": {str(r): summarize([s for s in shapes if s.created_round == r]) for r in rounds},
    }


def bfcl_yardstick(limit: int = 200) -> dict[str, Any]:
    """The same figures for the first ``limit`` of BFCL-V3's ``multi_turn_base`` entries, their
    ground truth as the reference calls. Returns ``{"entries", "seconds", "figures"}`` (figures
    without gate examples, which would quote ground-truth values)."""
    from coevolve.envs.bfcl import BfclEnvironment

    # Read for comparison only: nothing of BFCL's entries is written anywhere (store, pool, --json).
    start = time.perf_counter()
    env = BfclEnvironment()
    tasks = env.load_tasks(["multi_turn_base"], limit=limit if limit and limit > 0 else None)
    shapes = shapes_of(tasks, {env.name: env})
    figures = summarize(shapes, examples=False)
    return {"entries": len(tasks), "seconds": round(time.perf_counter() - start, 2), "figures": figures}


# ----------------------------------------------------------------------------- printing
def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def _count(k: int, n: int) -> str:
    return f"{k} ({_pct(_share(k, n))})" if n else str(k)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _rows(f: dict[str, Any], rules: list[str]) -> list[str]:
    """One column of the figures table (the order of ``_LABELS``)."""
    n = f["tasks"]
    cells = [str(n), _count(f["passing"], n)]
    cells += [_count(f["rule_counts"].get(r, 0), n) for r in rules]
    cells.append(_num(f["turns_mean"]))
    cells += [_count(f["turns_hist"].get(b, 0), n) for b in TURN_BUCKETS]
    n_turns = sum(f["calls_hist"].values())
    cells.append(_num(f["calls_per_turn_mean"]))
    cells += [_count(f["calls_hist"].get(b, 0), n_turns) for b in CALL_BUCKETS]
    cells.append(f"{_pct(f['state_change_share'])} ({f['changing_turns']}/{f['replayed_turns']})")
    cells.append(f"{_pct(f['reuse_share'])} ({f['reusing_calls']}/{f['replayed_calls']})")
    cells.append(f"{f['functions_used']}/{f['functions_offered']}")
    return cells


def _labels(rules: list[str]) -> list[str]:
    return (
        ["tasks", "pass every rule"]
        + [f"  fail {r}" for r in rules]
        + ["turns per task (mean)"]
        + [f"  {b} turn{'s' if b != '1' else ''}" for b in TURN_BUCKETS]
        + ["calls per turn (mean)"]
        + [f"  {b} call{'s' if b != '1' else ''}" for b in CALL_BUCKETS]
        + ["turns changing the state", "calls reusing an earlier result", "functions used/offered"]
    )


def render(report: dict[str, Any], yardstick: dict[str, Any] | None = None, console: Any = None) -> None:
    """Print ``pool_report``'s figures (and ``bfcl_yardstick``'s, as the last column) as a rich
    table, then the unused functions and a few gate problems. ``console``: a rich Console
    (default: stdout, at full width when it is not a terminal: pipes and logs get every cell)."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        console = console if console.is_terminal else Console(width=240)

    columns = {"pool": report["overall"]} | {f"round {r}": f for r, f in report["by_round"].items()}
    if yardstick:
        columns[f"BFCL-V3 base ({yardstick['entries']})"] = yardstick["figures"]
    rules = list(RULES) + sorted({r for f in columns.values() for r in f["rule_counts"]} - set(RULES))
    left = ", ".join(f"{n} {why}" for why, n in report["left_out"].items())
    console.print(
        f"pool v{report['pool_version']} of {report['store']}: {report['overall']['tasks']} training tasks "
        f"({', '.join(report['envs']) or 'none'})" + (f"; left out: {left}" if left else ""),
        markup=False,
    )
    table = Table()
    table.add_column("figure")
    for name in columns:
        table.add_column(name, justify="right", style="cyan" if name.startswith("BFCL") else None)
    cells = [_rows(f, rules) for f in columns.values()]
    for i, label in enumerate(_labels(rules)):
        table.add_row(label, *(c[i] for c in cells))
    timing = f"pool read, gated and replayed in {report['seconds']:.1f} s ({os.cpu_count()} cores)"
    if yardstick:
        timing += f"; yardstick ({yardstick['entries']} BFCL entries, read for comparison only) in {yardstick['seconds']:.1f} s"
    console.print(table)
    console.print(timing, markup=False)
    for name, f in columns.items():
        if name.startswith("round"):
            continue
        console.print(
            f"unused functions ({name}, {len(f['unused_functions'])}): {', '.join(f['unused_functions']) or '-'}",
            markup=False,
        )
        if f["not_offered_functions"]:
            console.print(
                f"called but offered by no doc ({name}): {', '.join(f['not_offered_functions'])}", markup=False
            )
        if f["replay_errors"]:
            console.print(f"replay raised on {f['replay_errors']} tasks ({name}): left out of the state/reuse shares")
    for rule, lines in report["overall"].get("examples", {}).items():
        for line in lines:
            console.print(f"  [{rule}] {line}", style="dim", markup=False, highlight=False)


def sample_tasks(store: Store, n: int, seed: float = 0.24) -> list[Task]:
    """``n`` training tasks of the latest pool drawn with DuckDB's ``order by random()`` after
    ``setseed(seed)`` (``seed`` in [0, 1]): the same store and seed give the same tasks."""
    from coevolve.sql import connect

    con = connect(store)
    con.execute("select setseed($seed)", {"seed": seed})
    ids = [
        r[0]
        for r in con.execute(
            "select task_id from (select task_id from tasks where split = 'train' order by task_id) "
            "order by random() limit $n",
            {"n": n},
        ).fetchall()
    ]
    by_id = {r["task_id"]: Task.from_row(r) for r in store.pool_tasks().to_pylist()}
    return [by_id[i] for i in ids if i in by_id]


def render_tasks(tasks: list[Task], console: Any) -> None:
    """Each task whole: its turns and the reference calls of each."""
    for task in tasks:
        console.print(
            f"--- {task.task_id} (round {task.created_round}, {task.origin}/{task.signal_type})", markup=False
        )
        for i, (text, calls) in enumerate(zip(task.turns, task.reference_actions)):
            console.print(f"  [{i}] {text}", markup=False, soft_wrap=True)
            for c in calls:
                args = ", ".join(f"{k}={json.dumps(v)}" for k, v in (c.get("arguments") or {}).items())
                console.print(f"        {c.get('name')}({args})", markup=False, soft_wrap=True)
