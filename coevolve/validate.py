"""Stage 3 of a round: validate candidate tasks (dual pass, dedup, safety, difficulty band).

Each pending row of part ``<run_id>-candidates`` goes through, in this order (cheapest
checks first; the first failing check is the reason):

1. **spec**: the JSON spec decodes into a ``Task`` with one reference list per turn;
2. **safety**: no reference call to a blocked function, no argument matching a blocked
   pattern (``ValidateConfig.blocked_functions`` / ``blocked_arguments``);
3. **duplicates**: not the same content as a pool task or an earlier candidate (exact),
   nor a near-duplicate: same start state and a Jaccard similarity of the sets of
   reference calls >= ``near_duplicate_threshold``;
4. **replay** (first pass): in a fresh episode, every reference call runs without error
   from the initial state, and the replay reaches the task's own goal when scored;
5. **solver** (second pass): the configured solver attempts the task ``attempts`` times;
   kept if an attempt succeeds or earns a positive partial reward;
6. **difficulty band** (optional, policy solver): dropped if every attempt succeeds or
   none earns any reward.

The part is rewritten with a verdict and a reason on every row.

    table = validate(store, cfg, run_id, round, policy_path)
    summary = summarize_candidates(table)
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.dataset as ds

from coevolve.config import ConfigError, RunConfig
from coevolve.envs.base import ToolCall
from coevolve.explore import observed_error
from coevolve.registry import register, resolve
from coevolve.schemas import to_table
from coevolve.store import Store
from coevolve.tasks import Task

log = logging.getLogger("coevolve.validate")


# ----------------------------------------------------------------------------- safety
@dataclass(frozen=True)
class ArgumentRule:
    """``function.argument~regex``: block calls whose argument (as text) matches; ``*`` = any."""

    function: str
    argument: str
    pattern: re.Pattern

    @classmethod
    def parse(cls, text: str) -> "ArgumentRule":
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
                text = value if isinstance(value, str) else json.dumps(value, default=str)
                if self.pattern.search(text):
                    return f"{call.get('name')}.{key} matches {self.pattern.pattern!r}"
        return None


class SafetyPolicy:
    def __init__(self, blocked_functions: Iterable[str], blocked_arguments: Iterable[str]):
        self.blocked = set(blocked_functions)
        self.rules = [ArgumentRule.parse(r) for r in blocked_arguments]

    def check(self, task: Task) -> str | None:
        """Why ``task`` is unsafe, or None."""
        for turn in task.reference_actions:
            for call in turn:
                if call.get("name") in self.blocked:
                    return f"unsafe: calls blocked function {call.get('name')}"
                for rule in self.rules:
                    hit = rule.violated(call)
                    if hit:
                        return f"unsafe: {hit}"
        return None


# ----------------------------------------------------------------------------- duplicates
def _call_key(call: dict[str, Any]) -> str:
    return json.dumps([call.get("name"), call.get("arguments") or {}], sort_keys=True, default=str)


def _state_key(env: str, initial_state: dict[str, Any] | str) -> str:
    text = initial_state if isinstance(initial_state, str) else json.dumps(initial_state, sort_keys=True)
    return env + ":" + hashlib.sha1(text.encode()).hexdigest()


class DuplicateIndex:
    """Exact (content hash) and near duplicates (Jaccard of call sets, same start state).

    An inverted index from call to tasks makes a lookup cost the tasks that share a call
    with the candidate, not the whole pool.
    """

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.hashes: dict[str, str] = {}
        self.sizes: list[int] = []
        self.ids: list[str] = []
        self.postings: dict[tuple[str, str], list[int]] = defaultdict(list)

    def add(self, task_id: str, content_hash: str, state_key: str, calls: set[str]) -> None:
        self.hashes.setdefault(content_hash, task_id)
        i = len(self.ids)
        self.ids.append(task_id)
        self.sizes.append(len(calls))
        for c in calls:
            self.postings[(state_key, c)].append(i)

    def find(self, content_hash: str, state_key: str, calls: set[str]) -> str | None:
        """Why the candidate duplicates an indexed task, or None."""
        if content_hash in self.hashes:
            return f"duplicate: same content as {self.hashes[content_hash]}"
        overlap: Counter[int] = Counter()
        for c in calls:
            overlap.update(self.postings.get((state_key, c), ()))
        for i, shared in overlap.items():
            jaccard = shared / (len(calls) + self.sizes[i] - shared)
            if jaccard >= self.threshold:
                return f"near-duplicate: {jaccard:.2f} call overlap with {self.ids[i]}"
        return None


def task_calls(task: Task) -> set[str]:
    return {_call_key(c) for turn in task.reference_actions for c in turn}


def pool_index(pool_rows: list[dict[str, Any]], threshold: float) -> DuplicateIndex:
    """A duplicate index over ``tasks`` rows (JSON columns still encoded)."""
    index = DuplicateIndex(threshold)
    for r in pool_rows:
        calls = {_call_key(c) for turn in json.loads(r["reference_actions"]) for c in turn}
        index.add(r["task_id"], r["content_hash"], _state_key(r["env"], r["initial_state"]), calls)
    return index


# ----------------------------------------------------------------------------- replay
def replay(env: Any, task: Task) -> tuple[str | None, Any]:
    """First pass: run the reference calls in a fresh episode and score it.

    Returns ``(reason, score)``: a reason when a call fails or the replay does not reach the
    task's own goal (e.g. a call whose result is not reproducible), else ``(None, score)``.
    """
    try:
        ep = env.episode(task)
        for t in range(ep.n_turns):
            ep.user_message(t)
            for call in task.reference_actions[t]:
                obs = ep.step(ToolCall(call["name"], call.get("arguments") or {}))
                err = observed_error(obs)
                if err:
                    return f"replay: turn {t} {call['name']} failed: {err[:200]}", None
            ep.end_turn()
        score = ep.score()
    except Exception as exc:  # a spec the environment cannot even open
        return f"replay: {type(exc).__name__}: {str(exc)[:200]}", None
    if not score.success:
        return f"replay: reference does not reach its own goal ({score.reason[:200]})", score
    return None, score


# ----------------------------------------------------------------------------- solvers
@dataclass
class Attempts:
    rewards: list[float] = field(default_factory=list)
    successes: list[bool] = field(default_factory=list)


# A solver gets the tasks that passed replay (with their replay scores) and returns the
# attempts of each, in order.
Solver = Callable[[list[Task], list[Any]], list[Attempts]]


@register("solver", "reference")
def make_reference_solver(cfg: RunConfig, store: Store, run_id: str, round: int, policy_path: str | None) -> Solver:
    """Replay only: the first pass's score is the attempt."""
    return lambda tasks, scores: [Attempts([s.reward], [s.success]) for s in scores]


def _episode_solver(policy: Any, cfg: RunConfig, store: Store, run_id: str, round: int) -> Solver:
    from coevolve.policy.base import SamplingParams
    from coevolve.rollout import run_episodes

    def solve(tasks: list[Task], scores: list[Any]) -> list[Attempts]:
        if not tasks:
            return []
        env = resolve("environment", cfg.env.name)()
        sampling = SamplingParams(
            temperature=cfg.policy.temperature, top_p=cfg.policy.top_p, max_new_tokens=cfg.policy.max_new_tokens,
            seed=cfg.seed,
        )
        results = run_episodes(
            policy, env, tasks, n_samples=cfg.validate_.attempts, sampling=sampling, step_limit=cfg.env.step_limit,
            phase="validate", run_id=run_id, round=round, batch_size=cfg.policy.batch_size, seed=cfg.seed,
            step_timeout_s=cfg.env.step_timeout_s,
        )
        if store is not None:  # the attempts are rollouts like any other (phase "validate")
            store.write("rollouts", round, f"{run_id}-validate", [row for r in results for row in r.steps])
        by_task: dict[str, Attempts] = defaultdict(Attempts)
        for r in results:
            by_task[r.task_id].rewards.append(r.score.reward)
            by_task[r.task_id].successes.append(r.score.success)
        return [by_task[t.task_id] for t in tasks]

    return solve


@register("solver", "policy")
def make_policy_solver(cfg: RunConfig, store: Store, run_id: str, round: int, policy_path: str | None) -> Solver:
    """The current policy (the round's checkpoint), ``attempts`` samples per task."""
    from coevolve.policy import load_policy

    return _episode_solver(load_policy(cfg.policy, policy_path), cfg, store, run_id, round)


@register("solver", "explorer")
def make_explorer_solver(cfg: RunConfig, store: Store, run_id: str, round: int, policy_path: str | None) -> Solver:
    """The explorer's LLM behind its OpenAI-compatible endpoint."""
    from coevolve.explorers.llm import endpoint_policy

    if not cfg.explore.base_url:
        raise ConfigError("validate.solver 'explorer' needs explore.base_url (the explorer LLM's endpoint)")

    return _episode_solver(endpoint_policy(cfg, cfg.explore), cfg, store, run_id, round)


# ----------------------------------------------------------------------------- the pass
def validate_rows(
    rows: list[dict[str, Any]],
    pool_rows: list[dict[str, Any]],
    env: Any,
    cfg: RunConfig,
    solver: Solver,
) -> list[dict[str, Any]]:
    """Give every pending ``candidates`` row a verdict and reason (rows already judged are kept).

    ``pool_rows`` are the latest pool's ``tasks`` rows; returns new row dicts, same order.
    """
    vcfg = cfg.validate_
    safety = SafetyPolicy(vcfg.blocked_functions, vcfg.blocked_arguments)
    index = pool_index(pool_rows, vcfg.near_duplicate_threshold)
    out = [dict(r) for r in rows]
    replayed: list[tuple[int, Task, Any]] = []
    for i, row in enumerate(out):
        if row.get("verdict"):
            continue
        try:
            task = Task.from_json(row["spec"])
            if len(task.reference_actions) != len(task.turns) or not task.turns:
                raise ValueError("needs one reference list per turn")
        except Exception as exc:  # any malformed spec is a rejection, never a crash
            row.update(verdict="rejected", reason=f"spec: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        calls, state = task_calls(task), _state_key(task.env, task.initial_state)
        reason = safety.check(task) or index.find(task.content_hash, state, calls)
        if reason is None:
            reason, score = replay(env, task)
        if reason:
            row.update(verdict="rejected", reason=reason)
            continue
        index.add(task.task_id, task.content_hash, state, calls)  # later candidates dedup against it
        replayed.append((i, task, score))
    try:
        attempts = solver([t for _, t, _ in replayed], [s for _, _, s in replayed])
    except Exception as exc:  # e.g. the solver's endpoint is down: the candidates say so, the round goes on
        log.exception("validation solver %r failed", vcfg.solver)
        reason = f"solver: {vcfg.solver} failed: {type(exc).__name__}: {str(exc)[:200]}"
        for i, _, _ in replayed:
            out[i].update(verdict="rejected", reason=reason)
        return out
    for (i, _, _), a in zip(replayed, attempts):
        out[i].update(_verdict(a, vcfg.difficulty_band))
    return out


def _verdict(a: Attempts, band: bool) -> dict[str, Any]:
    best = max(a.rewards, default=0.0)
    row = {"reward": best, "success": any(a.successes)}
    if not a.rewards:
        return {**row, "verdict": "rejected", "reason": "solver: no attempt was made"}
    if not any(a.successes) and best <= 0.0:
        return {**row, "verdict": "rejected", "reason": f"solver: no reward in {len(a.rewards)} attempts"}
    if band and all(a.successes):
        return {**row, "verdict": "rejected", "reason": f"too easy: solved in all {len(a.rewards)} attempts"}
    how = "solved" if any(a.successes) else f"partial reward {best:.2f}"
    return {**row, "verdict": "accepted", "reason": f"accepted: {how}"}


def validate(store: Store, cfg: RunConfig, run_id: str, round: int, policy_path: str | None) -> pa.Table:
    """Validate this round's candidates; rewrite their part with verdicts; return the table."""
    part = f"{run_id}-candidates"
    rows = store.read("candidates", filter=(ds.field("run_id") == run_id) & (ds.field("round") == round)).to_pylist()
    for r in rows:
        r.pop("round", None)
    rows.sort(key=lambda r: r["candidate_id"])
    env = resolve("environment", cfg.env.name)()
    solver = resolve("solver", cfg.validate_.solver)(cfg, store, run_id, round, policy_path)
    out = validate_rows(rows, store.pool_tasks().to_pylist(), env, cfg, solver)
    table = to_table("candidates", out)
    store.write("candidates", round, part, table)
    return table


def summarize_candidates(table: pa.Table) -> dict[str, Any]:
    """Round-summary figures: counts, pass rate, rejection reasons (by kind), accepted tasks
    by signal type, and the turn-count distribution of accepted tasks."""
    rows = table.to_pylist()
    accepted = [r for r in rows if r["verdict"] == "accepted"]
    rejected = [r for r in rows if r["verdict"] != "accepted"]
    return {
        "candidates": len(rows),
        "accepted": len(accepted),
        "rejected": len(rejected),
        "pass_rate": round(len(accepted) / len(rows), 4) if rows else 0.0,
        "rejections": dict(Counter(reason_kind(r["reason"]) for r in rejected).most_common()),
        "accepted_by_signal_type": dict(sorted(Counter(r["signal_type"] for r in accepted).items())),
        "accepted_turns": {str(k): v for k, v in sorted(Counter(r["n_turns"] for r in accepted).items())},
    }


def reason_kind(reason: str | None) -> str:
    """The kind of a reason: its text before the first colon ('replay', 'unsafe', ...)."""
    return (reason or "none").split(":", 1)[0]
