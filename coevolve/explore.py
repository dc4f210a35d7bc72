"""Stage 2a of a round: exploration of the environment, signal-guided or for coverage.

For every signal of the round, one **context** says where to explore and what to look at:

- the start state: the signal's task (forgetting, boundary), or a pool task in which the
  rare pattern occurred;
- the focus tools: those the failing or unstable episode called, else the task's tools; or
  the calls of the rare pattern, in order;
- the evidence: the steps of the failed attempt, read back from the ``rollouts`` table.

A round explores at most ``explore.contexts`` contexts. When fewer than ``explore.min_contexts``
signal contexts exist (a cold start), the rest of that budget goes to **coverage contexts**
(``signal_type = 'fallback'``): pool tasks' start states, with focus tools that together
reach every tool of the task, led by what the policy itself called on that task in the
round's training (its attempt is the context's evidence). Round 0 (``coevolve.synth``) explores coverage contexts on
training-scenario states the same way (``signal_type = 'static'``). The ``random`` explorer
(the ablation baseline) gets exactly as many contexts as the signal-guided one would, on
uniformly drawn pool tasks, with the same runs, steps, state access and retry logic.

An explorer (registry kind ``"explorer"``: ``rule``, ``llm``, ``random``) then drives
``runs_per_context`` independent runs of ``steps_per_run`` steps, each in a fresh episode
of the environment, each step seeing the observations so far. Every step becomes a row
of the ``explorations`` table (part ``<run_id>-explore`` of the round).

**What exploration may read.** A context carries a start *state*, the tool names and docs,
the focus, and the evidence of the policy's own failed attempt. It never carries or reads a
task's instruction turns or reference calls: argument values come from the tool schemas,
the start state and the observations of the run (and the failed attempt's own calls). Pool
tasks' reference calls are themselves products of exploration, but not reading them at all
keeps benchmark ground truth unreachable by construction, whatever a pool holds.

    n = explore(store, cfg, run_id, round)
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds

from coevolve.config import RunConfig
from coevolve.envs.base import Environment
from coevolve.types import ToolCall
from coevolve.explorers.base import (  # noqa: F401  (Step, observed_error: re-exported for callers)
    ExploreContext,
    Explorer,
    Session,
    Step,
    observed_error,
)
from coevolve.registry import resolve
from coevolve.store import Store
from coevolve.tasks import Task


# ----------------------------------------------------------------------------- contexts
def pattern_names(pattern: str) -> list[str]:
    """Function names of a rare pattern: ``"cd>mv"`` or ``"cd(folder)>mv(destination,source)"``."""
    names = []
    for part in re.split(r">", pattern or ""):
        name = part.split("(", 1)[0].strip()
        if name:
            names.append(name)
    return names


# where the signal miners put the episodes a signal was seen in
_EPISODE_KEYS = ("failing_episode_id", "failing_episode_ids", "episode_ids", "episode_id")


def _evidence_doc(raw: str | None) -> dict[str, Any]:
    try:
        doc = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _listed(doc: dict[str, Any], *keys: str) -> list[str]:
    """Values of the first present key, as a list of strings (evidence may hold one or many)."""
    for key in keys:
        value = doc.get(key)
        if value is None:
            continue
        return [str(v) for v in (value if isinstance(value, list) else [value])]
    return []


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


# the rollout columns an exploration context's evidence is read from
_STEP_COLUMNS = [
    "episode_id",
    "task_id",
    "turn",
    "step",
    "action_name",
    "action_args",
    "observation",
    "error",
    "parse_error",
]


def _load_evidence(store: Store, run_id: str, round_no: int, episode_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Steps of the given episodes of the round, grouped by episode id, in order (every
    signal's evidence episodes are the round's: the failing 'now' or the pattern's)."""
    if not episode_ids:
        return {}
    table = store.read(
        "rollouts",
        filter=(ds.field("run_id") == run_id)
        & (ds.field("round") == round_no)
        & pc.field("episode_id").isin(episode_ids),
        columns=_STEP_COLUMNS,
    )
    by_episode: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(table.to_pylist(), key=lambda r: (r["episode_id"], r["turn"] or 0, r["step"] or 0)):
        by_episode.setdefault(row["episode_id"], []).append(row)
    return by_episode


def signal_contexts(
    signals: list[dict[str, Any]], pool: list[Task], evidence: dict[str, list[dict[str, Any]]], avoid: frozenset[str]
) -> list[ExploreContext]:
    """One context per signal whose start task is in the pool (others cannot be explored).

    ``signals`` are ``signals`` rows; ``evidence`` maps episode ids to their rollout steps.
    """
    by_id = {t.task_id: t for t in pool}
    contexts = []
    for sig in signals:
        doc = _evidence_doc(sig.get("evidence"))
        if sig.get("task_id"):
            task = by_id.get(sig["task_id"])
            if task is None:
                continue
            steps = [s for e in _listed(doc, *_EPISODE_KEYS) for s in evidence.get(e, [])]
            used = [s["action_name"] for s in steps if s.get("action_name")]
            # what the failing episode called; with no call at all, the task's tools
            focus = _unique(used) or list(task.tools)
            sequence = False
        else:
            names = pattern_names(sig.get("pattern") or "")
            where = [by_id[t] for t in _listed(doc, "task_ids", "task_id") if t in by_id]
            # a task where the pattern occurred, else any pool task whose tools allow it
            where = where or [t for t in pool if names and set(names) <= set(t.tools)]
            if not where or not names:
                continue
            task = where[0]
            episodes = [evidence.get(e, []) for e in _listed(doc, *_EPISODE_KEYS)]
            steps = next((e for e in episodes if e and e[0].get("task_id") == task.task_id), [])
            focus, sequence = names, True
        contexts.append(
            ExploreContext(
                signal_id=sig["signal_id"],
                signal_type=sig["signal_type"],
                task=task,
                focus=[f for f in focus if f not in avoid],
                evidence=[
                    {k: s.get(k) for k in ("action_name", "action_args", "observation", "error", "parse_error")}
                    for s in steps
                ],
                sequence=sequence,
                avoid=avoid,
            )
        )
    return contexts


def random_contexts(n: int, pool: list[Task], rng: random.Random, avoid: frozenset[str]) -> list[ExploreContext]:
    """``n`` contexts on uniformly drawn pool tasks, no focus (the ablation baseline: the
    ``random`` explorer then draws a tool uniformly at every step)."""
    return [ExploreContext(f"random-{i:04d}", "random", rng.choice(pool), [], avoid=avoid) for i in range(n)]


def coverage_contexts(
    tasks: list[Task], n: int, rng: random.Random, avoid: frozenset[str], signal_type: str
) -> list[ExploreContext]:
    """``n`` coverage contexts over ``tasks`` (cycled in order): the contexts of one task split
    its tools (shuffled with ``rng``) into as many focus groups, so that together they reach
    every tool of the task. Ids are ``<signal_type>-<i>``; no evidence, no reference read."""
    if not tasks or n <= 0:
        return []
    parts = -(-n // len(tasks))
    groups: dict[int, list[list[str]]] = {}
    contexts = []
    for i in range(n):
        k = i % len(tasks)
        task = tasks[k]
        if k not in groups:
            tools = [t for t in task.tools if t not in avoid]
            rng.shuffle(tools)
            groups[k] = [tools[j::parts] for j in range(parts)]
        focus = groups[k][(i // len(tasks)) % parts]
        contexts.append(ExploreContext(f"{signal_type}-{i:04d}", signal_type, task, focus, avoid=avoid, coverage=True))
    return contexts


def budgeted_contexts(
    guided: list[ExploreContext],
    pool: list[Task],
    cfg: RunConfig,
    round_no: int,
    avoid: frozenset[str],
    prefer: frozenset[str] = frozenset(),
) -> list[ExploreContext]:
    """The round's contexts under the budget: signal contexts up to ``explore.contexts``, and
    when fewer than ``explore.min_contexts`` of them exist, coverage ('fallback') contexts on
    pool tasks for the rest of the budget (those in ``prefer`` first: tasks the policy attempted)."""
    e = cfg.explore
    chosen = guided[: e.contexts]
    if len(chosen) < e.min_contexts and pool:
        rng = random.Random(f"{cfg.seed}/fallback-contexts/{round_no}")
        order = list(pool)
        rng.shuffle(order)
        order.sort(key=lambda t: t.task_id not in prefer)  # tasks the policy attempted this round first
        chosen += coverage_contexts(order, e.contexts - len(chosen), rng, avoid, "fallback")
    return chosen


# ----------------------------------------------------------------------------- running
def start_task(task: Task, env: Environment | None = None) -> Task:
    """The context task as exploration (and the tasks it yields) start from it
    (``Environment.start_state`` of ``env``, default the task's own environment):

    - its state exactly as a ``tasks`` row stores it (encoded and decoded), because that is
      what validation and the pool will replay;
    - every tool available from the first step (a synthesized task has its own turns);
    - state only: one open turn with no instruction and no reference calls, so that nothing
      downstream of here (explorers, abstractors) can read the context task's turns or
      reference calls.
    """
    env = env if env is not None else resolve("environment", task.env)()
    start = env.start_state(task)
    if start.turns != [""] or start.reference_actions != [[]]:
        raise ValueError(f"{env.name}.start_state must return one open turn and no reference calls")
    return start


def run_sessions(
    explorer: Explorer, contexts: list[ExploreContext], env: Environment, runs: int, steps: int, seed: int
) -> list[Session]:
    """Drive ``runs`` fresh episodes per context for ``steps`` steps; return the sessions."""
    sessions = []
    for c in contexts:
        start = start_task(c.task, env)
        c = dataclasses.replace(c, task=start)  # explorers see the start state, never turns or reference
        docs = {d["name"]: d for d in env.function_docs(start)}
        for r in range(runs):
            rng = random.Random(f"{seed}/{c.signal_id}/{r}")
            sessions.append(Session(c, r, env.episode(start), docs, rng, steps, env=env))
    for _ in range(steps):
        proposals = explorer.propose(sessions)
        for session, proposal in zip(sessions, proposals):
            if isinstance(proposal, ToolCall):
                session.execute(proposal)
            else:
                session.execute(None, str(proposal))
    return sessions


def session_rows(run_id: str, sessions: list[Session]) -> list[dict[str, Any]]:
    """``explorations`` rows of the sessions, one per step."""
    rows = []
    for s in sessions:
        for i, step in enumerate(s.history):
            rows.append(
                {
                    "run_id": run_id,
                    "signal_id": s.context.signal_id,
                    "signal_type": s.context.signal_type,
                    "context_task_id": s.context.task.task_id,
                    "run_idx": s.run_idx,
                    "step": i,
                    "action_name": step.name,
                    "action_args": json.dumps(step.arguments, sort_keys=True, default=str),
                    "observation": step.observation,
                    "error": step.error,
                }
            )
    return rows


def make_explorer(cfg: RunConfig, name: str | None = None) -> Explorer:
    """The explorer named ``name`` (default ``cfg.explore.explorer``), built from the run config."""
    return resolve("explorer", name or cfg.explore.explorer)(cfg)


def policy_attempts(store: Store, run_id: str, round_no: int, task_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The policy's own training episode of each of ``task_ids`` in the round (the first by
    episode id), as evidence steps in order; tasks it did not attempt are absent."""
    if not task_ids:
        return {}
    rows = store.read(
        "rollouts",
        filter=(ds.field("run_id") == run_id)
        & (ds.field("round") == round_no)
        & (ds.field("phase") == "train")
        & pc.field("task_id").isin(task_ids),
        columns=_STEP_COLUMNS,
    ).to_pylist()
    first: dict[str, str] = {}
    for r in rows:
        if r["task_id"] not in first or r["episode_id"] < first[r["task_id"]]:
            first[r["task_id"]] = r["episode_id"]
    out: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["turn"] or 0, r["step"] or 0)):
        if first[r["task_id"]] == r["episode_id"]:
            out.setdefault(r["task_id"], []).append(
                {k: r.get(k) for k in ("action_name", "action_args", "observation", "error", "parse_error")}
            )
    return out


def with_attempts(contexts: list[ExploreContext], attempts: dict[str, list[dict[str, Any]]]) -> list[ExploreContext]:
    """Cold-start ('fallback') contexts explore outward from what the policy did on their task:
    its training attempt becomes the context's evidence (the explorer may start from the calls
    of it that worked, with values of their role) and the functions it called lead the focus."""
    out = []
    for c in contexts:
        steps = attempts.get(c.task.task_id, [])
        if c.signal_type != "fallback" or c.evidence or not steps:
            out.append(c)
            continue
        called = [s["action_name"] for s in steps if s.get("action_name") and not s.get("error")]
        focus = _unique([f for f in called if f in c.task.tools and f not in c.avoid] + c.focus)
        out.append(dataclasses.replace(c, evidence=steps, focus=focus))
    return out


def round_contexts(
    store: Store, cfg: RunConfig, run_id: str, round_no: int, signal_guided: bool
) -> list[ExploreContext]:
    """The contexts the round explores: signal contexts plus the cold-start fallback
    (``budgeted_contexts``, outward from the policy's own attempts: ``with_attempts``); for the
    ``random`` baseline, as many random contexts."""
    signals = store.read("signals", filter=(ds.field("run_id") == run_id) & (ds.field("round") == round_no)).to_pylist()
    # round-robin over the types by rank (every type's best first), so that no type, built-in or
    # a user's, takes the whole budget because its name sorts first
    signals.sort(key=lambda s: (s.get("rank") or 0, s["signal_type"], s["signal_id"]))
    pool = [Task.from_row(r) for r in store.pool_tasks().to_pylist() if r["split"] == "train"]
    avoid = frozenset(cfg.validate.blocked_functions)
    episode_ids = [e for s in signals for e in _listed(_evidence_doc(s.get("evidence")), *_EPISODE_KEYS)]
    guided = signal_contexts(signals, pool, _load_evidence(store, run_id, round_no, episode_ids), avoid)
    if signal_guided:
        attempts = policy_attempts(store, run_id, round_no, [t.task_id for t in pool])
        return with_attempts(budgeted_contexts(guided, pool, cfg, round_no, avoid, frozenset(attempts)), attempts)
    contexts = budgeted_contexts(guided, pool, cfg, round_no, avoid)
    # the baseline: the same number of contexts, only where it starts is random
    rng = random.Random(f"{cfg.seed}/random-contexts/{round_no}")
    return random_contexts(len(contexts), pool, rng, avoid) if pool else []


def explore(store: Store, cfg: RunConfig, run_id: str, round_no: int) -> int:
    """Explore from this round's signals; write ``explorations`` rows; return their count.

    Reads ``signals`` (run_id, round) and the latest pool's train tasks (their states).
    """
    explorer = make_explorer(cfg)
    contexts = round_contexts(store, cfg, run_id, round_no, explorer.signal_guided)
    env = resolve("environment", cfg.env.name)()
    sessions = run_sessions(explorer, contexts, env, cfg.explore.runs_per_context, cfg.explore.steps_per_run, cfg.seed)
    rows = session_rows(run_id, sessions)
    return store.write("explorations", round_no, f"{run_id}-explore", rows)
