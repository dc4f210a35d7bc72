"""Stage 3 of a round: validate candidate tasks in two real passes, after dedup and safety.

Each pending row of part ``<run_id>-candidates`` goes through, in this order (cheapest
checks first; the first failing check is the reason):

1. **spec**: the JSON spec decodes into a ``Task`` with one reference list per turn and at
   least one reference call;
2. **contamination** (``coevolve.contamination``): the similarity to the nearest held-out
   benchmark turn (instruction word n-grams, calls on the same start state) is recorded in
   ``contamination`` / ``contamination_id``; above ``validate.contamination_threshold`` the
   candidate is refused (reason ``contamination: ...``);
3. **safety** (``coevolve.safety``): no reference call to a blocked function, no argument
   matching a blocked pattern (``validate.blocked_functions`` / ``blocked_arguments``), and
   none of the general rules over the environment's action roles and the start state
   (``validate.safety_rules``: unknown parties, secrets sent out, credential changes,
   deletions of existing records, backdated actions) broken;
4. **duplicates** (``coevolve.duplicates``): not the same content as a pool task or an earlier candidate (exact),
   nor a near-duplicate: same start state and a Jaccard similarity of the sets of
   reference calls >= ``near_duplicate_threshold``;
5. **quality** (``coevolve.quality``): no schema filler, no value of the wrong role, no
   reference call whose result is a failure (reasons ``filler: ...``, ``wrong role: ...``,
   ``failing goal: ...``);
6. **pass 1, executable**: in a fresh episode every reference call runs without error from
   the initial state and the replay reaches the task's own goal (``replay``); and every turn
   has an effect (``no_effect_turn``, unless ``require_effect`` is off): its calls change the
   state or return an answer the agent has not already been given. A turn is probed in a
   fresh episode that replays the earlier turns and then makes one call to a function that
   does not exist (an error, no effect); if the environment's own checker passes that turn
   anyway (BFCL: state equal to the reference's and the reference results already among
   the agent's), the turn's calls did nothing the task could ask for (a repeated read, a
   zero-amount update), and the task is rejected;
7. **pass 2, learnable**: the solver (``validate.solver``, default the round's policy)
   attempts the task ``attempts`` times, batched through the rollout engine; kept if an
   attempt succeeds or makes progress (``progress``: reference effects reproduced, never a
   format bonus); dropped as too easy when every attempt succeeds (``drop_solved``).
   **Auditable**: an accepted row records how it passed, ``pass_kind`` = ``success`` (an attempt
   solved it) or ``partial`` (every attempt failed, with positive progress); when the partial
   share of the round's accepted rows is above ``validate.max_partial_share``, the partial ones
   with the lowest reward are rejected (reason ``partial cap: ...``) until it is not. The share
   is ``partial_share`` in the stage summary and in ``rounds``.

Without a policy (``policy_path=None``: round 0, no trained policy yet) the 'policy' solver
has nothing to attempt with: candidates get the mechanical checks and pass 1 only
(``pass_kind = 'mechanical'``).

Every row gets a verdict and a reason; a rejection's reason names its pass and check, e.g.
``pass 1 no effect: ...``, ``pass 2 too easy: ...``; its kind (``reason_kind``) is the text
before the first colon. The part is rewritten, never appended to.

    table = validate(store, cfg, run_id, round, policy_path)
    summary = summarize_candidates(table)

Pass 2 may run elsewhere: ``validate(..., pass2=...)`` runs pass 1 here, in order (each
candidate is deduplicated against the ones before it), and hands the specs that passed to
``pass2``, which returns their verdicts and the attempts' rollouts in order. ``pass2_specs``
is pass 2 on any list of specs, in any process: the flows cut the specs into chunks and run
``pass2_specs`` on each as a Prefect task on Ray or Dask (``flows/fanout.py``); the store
ends up with the same rows as in-process.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import pyarrow.dataset as ds

from coevolve.config import ConfigError, RunConfig
from coevolve.duplicates import pool_index, state_key, task_calls
from coevolve.envs.base import Environment
from coevolve.types import EpisodeScore, ToolCall
from coevolve.explorers.base import observed_error
from coevolve.contamination import contamination_reason, heldout_index
from coevolve.quality import quality_reason
from coevolve.registry import register, resolve
from coevolve.safety import SafetyPolicy
from coevolve.schemas import to_table
from coevolve.store import Store
from coevolve.tasks import Task
from coevolve.timing import Splits

log = logging.getLogger("coevolve.validate")


# ----------------------------------------------------------------------------- safety
def safety_policy(cfg: RunConfig, env: Environment) -> SafetyPolicy:
    """The run's safety policy (``coevolve.safety``): the configured lists and rules over the
    environment's action roles (``Environment.safety_profile``; none for an environment without one)."""
    v = cfg.validate
    profile = env.safety_profile() if hasattr(env, "safety_profile") else None
    return SafetyPolicy(v.blocked_functions, v.blocked_arguments, rules=v.safety_rules, profile=profile)


# ----------------------------------------------------------------------------- pass 1
def replay(env: Environment, task: Task) -> tuple[str | None, EpisodeScore | None]:
    """Pass 1a: run the reference calls in a fresh episode and score it.

    Returns ``(reason, score)``: a reason when a call fails or the replay does not reach the
    task's own goal (e.g. a call whose result is not reproducible), else ``(None, score)``.
    """
    try:
        ep = env.episode(task)
        for t in range(ep.n_turns):
            ep.user_message(t)
            for call in task.reference_actions[t]:
                obs = ep.step(ToolCall(call["name"], call.get("arguments") or {}))
                err = observed_error(obs, env)
                if err:
                    return f"pass 1 replay: turn {t} {call['name']} failed: {err[:200]}", None
            ep.end_turn()
        score = ep.score()
    except Exception as exc:  # a spec the environment cannot even open
        return f"pass 1 replay: {type(exc).__name__}: {str(exc)[:200]}", None
    if not score.success:
        return f"pass 1 replay: reference does not reach its own goal ({score.reason[:200]})", score
    return None, score


# A call no environment knows: it comes back as an error and changes nothing, but it is a
# call, so a checker that wants "some call in this turn" gets one.
PROBE_CALL = ToolCall("coevolve_validate_probe_no_op", {})


def no_effect_turn(env: Environment, task: Task) -> int | None:
    """Pass 1b: the first turn whose reference calls have no effect, or None.

    For each turn ``t`` with reference calls: a fresh episode replays turns ``< t`` and makes
    only ``PROBE_CALL`` in turn ``t``. If the environment's checker still passes turn ``t``,
    its calls changed no state the checker compares and returned nothing the agent had not
    already received, so nothing in the turn could have been asked for.
    """
    for t, calls in enumerate(task.reference_actions):
        if not calls:
            continue
        ep = env.episode(task)
        for u in range(t):
            ep.user_message(u)
            for call in task.reference_actions[u]:
                ep.step(ToolCall(call["name"], call.get("arguments") or {}))
            ep.end_turn()
        ep.user_message(t)
        ep.step(PROBE_CALL)
        ep.end_turn()
        if ep.score().turn_passed[t]:
            return t
    return None


def executable(env: Environment, task: Task, require_effect: bool = True) -> str | None:
    """Pass 1: why ``task`` is not executable, or None (``require_effect``: also probe every turn)."""
    reason, _ = replay(env, task)
    if reason or not require_effect:
        return reason
    try:
        t = no_effect_turn(env, task)
    except Exception as exc:  # the replay ran, so this is the environment's fault; still a verdict
        return f"pass 1 probe: {type(exc).__name__}: {str(exc)[:200]}"
    if t is not None:
        names = ", ".join(c["name"] for c in task.reference_actions[t])
        return f"pass 1 no effect: turn {t} ({names}) changes no state and returns nothing new"
    return None


# ----------------------------------------------------------------------------- pass 2
def progress(score: Any) -> float:
    """The task-progress reward of one attempt: the single place validation reads it.

    ``EpisodeScore.progress`` (the share of reference effects reproduced, no format bonus)
    where the environment's score has it, else ``reward`` (BFCL before partial credit: the
    fraction of turns passed, which has no format term either).
    """
    value = getattr(score, "progress", None)
    return float(score.reward if value is None else value)


@dataclass
class Attempts:
    """The solver's attempts at one task: task progress and success of each."""

    progress: list[float] = field(default_factory=list)
    successes: list[bool] = field(default_factory=list)


# A solver gets the tasks that passed pass 1 and returns the attempts at each, in order.
Solver = Callable[[list[Task]], list[Attempts]]


def _episode_solver(policy: Any, cfg: RunConfig, store: Store | None, run_id: str, round_no: int) -> Solver:
    """``attempts`` episodes of every task, batched through the rollout engine."""
    from coevolve.rollout import rollout_settings, run_episodes

    def solve(tasks: list[Task]) -> list[Attempts]:
        if not tasks:
            return []
        env = resolve("environment", cfg.env.name)()
        results = run_episodes(
            policy,
            env,
            tasks,
            n_samples=cfg.validate.attempts,
            phase="validate",
            run_id=run_id,
            round_no=round_no,
            **rollout_settings(cfg, "validate"),
        )
        if store is not None:  # the attempts are rollouts like any other (phase "validate")
            store.write("rollouts", round_no, f"{run_id}-validate", [row for r in results for row in r.steps])
        by_task: dict[str, Attempts] = defaultdict(Attempts)
        for r in results:
            by_task[r.task_id].progress.append(progress(r.score))
            by_task[r.task_id].successes.append(bool(r.score.success))
        return [by_task[t.task_id] for t in tasks]

    return solve


# A solver factory returns None when it has nothing to attempt with: pass 2 is skipped.
@register("solver", "policy")
def make_policy_solver(
    cfg: RunConfig, store: Store, run_id: str, round_no: int, policy_path: str | None
) -> Solver | None:
    """The round's policy (its checkpoint), ``attempts`` samples per task; None before any training."""
    if policy_path is None:
        return None
    from coevolve.policy import load_policy

    return _episode_solver(load_policy(cfg.policy, policy_path), cfg, store, run_id, round_no)


@register("solver", "explorer")
def make_explorer_solver(cfg: RunConfig, store: Store, run_id: str, round_no: int, policy_path: str | None) -> Solver:
    """The explorer's LLM behind its OpenAI-compatible endpoint."""
    from coevolve.explorers.llm import endpoint_policy

    if not cfg.explore.base_url:
        raise ConfigError("validate.solver 'explorer' needs explore.base_url (the explorer LLM's endpoint)")

    return _episode_solver(endpoint_policy(cfg, cfg.explore), cfg, store, run_id, round_no)


@register("solver", "none")
def make_no_solver(cfg: RunConfig, store: Store, run_id: str, round_no: int, policy_path: str | None) -> None:
    """No pass 2: the mechanical checks and pass 1 decide."""
    return None


def learnable(a: Attempts, drop_solved: bool) -> dict[str, Any]:
    """Pass 2's verdict on one task's attempts: verdict, reason, reward (best progress), success."""
    k, solved = len(a.successes), sum(a.successes)
    best = max(a.progress, default=0.0)
    row: dict[str, Any] = {"reward": best, "success": solved > 0}
    if not k:
        return {**row, "verdict": "rejected", "reason": "pass 2 no attempt: the solver returned none"}
    if drop_solved and solved == k:
        return {**row, "verdict": "rejected", "reason": f"pass 2 too easy: solved in all {k} attempts"}
    if solved:
        return {
            **row,
            "verdict": "accepted",
            "pass_kind": "success",
            "reason": f"accepted: pass 2 solved in {solved} of {k} attempts",
        }
    if best > 0.0:
        return {
            **row,
            "verdict": "accepted",
            "pass_kind": "partial",
            "reason": f"accepted: pass 2 failed {k} attempts with progress {best:.2f}",
        }
    return {
        **row,
        "verdict": "rejected",
        "reason": f"pass 2 no progress: no success and no reference effect in {k} attempts",
    }


def pass2_verdicts(solver: Solver, tasks: list[Task], vcfg: Any) -> list[dict[str, Any]]:
    """Pass 2's verdict fields of each of ``tasks``, in order (``vcfg``: ``cfg.validate``). A
    solver that fails (e.g. its endpoint is down) rejects them all, saying so: the round goes on."""
    try:
        attempts = solver(tasks)
    except Exception as exc:
        log.exception("validation solver %r failed", vcfg.solver)
        reason = f"pass 2 solver: {vcfg.solver} failed: {type(exc).__name__}: {str(exc)[:200]}"
        return [{"verdict": "rejected", "reason": reason} for _ in tasks]
    return [learnable(a, vcfg.drop_solved) for a in attempts]


class RolloutSink:
    """Where a solver writes away from the store (its attempts' rollouts), kept for the stage
    to write once."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, table: str, round_no: int, part: str, rows: list[dict]) -> int:
        assert table == "rollouts", f"a solver wrote to {table}"
        self.rows += list(rows)
        return len(rows)


# Pass 2 run elsewhere: the specs of the candidates pass 1 let through, in order, in; the
# verdict fields of each ({} = pass 1's verdict stands) and the attempts' rollout rows out.
Pass2 = Callable[[list[str]], tuple[list[dict[str, Any]], list[dict[str, Any]]]]


def pass2_specs(
    cfg: RunConfig, run_id: str, round_no: int, policy_path: str | None, specs: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pass 2 on ``specs`` (task specs that passed pass 1, e.g. one chunk of a fan-out), in any
    process: the verdict fields of each ({} for all when the solver has nothing to attempt with:
    pass 1's verdicts stand) and the attempts' rollout rows, for the stage to write."""
    sink = RolloutSink()
    solver = resolve("solver", cfg.validate.solver)(cfg, sink, run_id, round_no, policy_path)
    if solver is None:
        return [{} for _ in specs], []
    return pass2_verdicts(solver, [Task.from_json(s) for s in specs], cfg.validate), sink.rows


# ----------------------------------------------------------------------------- the pass
def validate_rows(
    rows: list[dict[str, Any]],
    pool_rows: list[dict[str, Any]],
    env: Environment,
    cfg: RunConfig,
    solver: Solver | None,
    splits: Splits | None = None,
) -> list[dict[str, Any]]:
    """Give every pending ``candidates`` row a verdict and reason (rows already judged are kept).

    ``pool_rows`` are the latest pool's ``tasks`` rows; ``solver`` None skips pass 2.
    Returns new row dicts, same order. ``splits`` gets the seconds of pass 1 and pass 2.
    """
    splits = splits or Splits()
    with splits.part("pass1"):
        out, passed = _pass1(rows, pool_rows, env, cfg)
    if solver is None:
        for i, _ in passed:
            out[i].update(
                verdict="accepted",
                pass_kind="mechanical",
                reason="accepted: pass 1 (no policy to attempt it yet: pass 2 skipped)",
            )
        return out
    with splits.part("pass2"):
        for (i, _), verdict in zip(passed, pass2_verdicts(solver, [t for _, t in passed], cfg.validate)):
            out[i].update(verdict)
    return out


def _pass1(
    rows: list[dict[str, Any]], pool_rows: list[dict[str, Any]], env: Environment, cfg: RunConfig
) -> tuple[list[dict[str, Any]], list[tuple[int, Task]]]:
    """The mechanical checks: the judged rows, and (index, task) of those that passed."""
    vcfg = cfg.validate
    safety = safety_policy(cfg, env)
    index = pool_index(pool_rows, vcfg.near_duplicate_threshold)
    heldout = heldout_index(env, cfg.env.heldout_scenarios, cfg.seed)
    out = [dict(r) for r in rows]
    passed: list[tuple[int, Task]] = []
    for i, row in enumerate(out):
        if row.get("verdict"):
            continue
        try:
            task = Task.from_json(row["spec"])
            if len(task.reference_actions) != len(task.turns) or not task.turns:
                raise ValueError("needs one reference list per turn")
            if not any(task.reference_actions):
                raise ValueError("no reference call: a synthesized task must act")
        except Exception as exc:  # any malformed spec is a rejection, never a crash
            row.update(verdict="rejected", reason=f"spec: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        calls, state = task_calls(task), state_key(task.env, task.initial_state)
        similarity, nearest = heldout.nearest(task)
        row.update(contamination=similarity, contamination_id=nearest)
        reason = contamination_reason(similarity, nearest, vcfg.contamination_threshold)
        reason = (
            reason or safety.check(task) or index.find(task.content_hash, state, calls) or quality_reason(env, task)
        )
        reason = reason or executable(env, task, vcfg.require_effect)
        if reason:
            row.update(verdict="rejected", reason=reason)
            continue
        index.add(task.task_id, task.content_hash, state, calls)  # later candidates dedup against it
        passed.append((i, task))
    return out, passed


def validate(
    store: Store,
    cfg: RunConfig,
    run_id: str,
    round_no: int,
    policy_path: str | None,
    pass2: Pass2 | None = None,
    *,
    splits: Splits | None = None,
) -> pa.Table:
    """Validate this round's candidates; rewrite their part with verdicts; return the table.

    ``policy_path``: the round's policy checkpoint for pass 2, or None (no trained policy yet:
    the 'policy' solver skips pass 2). ``pass2``: where pass 2 runs (see the module's docstring);
    None = here, with the solver of ``validate.solver``. ``splits`` gets the seconds of pass 1
    and pass 2 (loading the solver's model included).
    """
    splits = splits or Splits()
    part = f"{run_id}-candidates"
    rows = store.read("candidates", filter=(ds.field("run_id") == run_id) & (ds.field("round") == round_no)).to_pylist()
    for r in rows:
        r.pop("round", None)
    rows.sort(key=lambda r: r["candidate_id"])
    env = resolve("environment", cfg.env.name)()
    # the training split only: the held-out synthesized split is never shown to validation
    pool_rows = [r for r in store.pool_tasks().to_pylist() if r["split"] == "train"]
    if pass2 is None:
        pending = any(not r.get("verdict") for r in rows)
        with splits.part("pass2"):
            # the solver (a model) is loaded only when some candidate may need it
            solver = (
                resolve("solver", cfg.validate.solver)(cfg, store, run_id, round_no, policy_path) if pending else None
            )
        out = validate_rows(rows, pool_rows, env, cfg, solver, splits)
    else:
        out = _validate_elsewhere(store, run_id, round_no, rows, pool_rows, env, cfg, pass2, splits)
    table = to_table("candidates", cap_partial(out, cfg.validate.max_partial_share))
    store.write("candidates", round_no, part, table)
    return table


def cap_partial(rows: list[dict[str, Any]], max_share: float) -> list[dict[str, Any]]:
    """Reject accepted ``partial`` rows, lowest reward first (ties: candidate id), until their share
    of the accepted rows is <= ``max_share``; the others are returned as they are."""
    out = [dict(r) for r in rows]
    accepted = [r for r in out if r.get("verdict") == "accepted"]
    partial = sorted(
        (r for r in accepted if r.get("pass_kind") == "partial"),
        key=lambda r: (r.get("reward") or 0.0, r.get("candidate_id") or ""),
    )
    n_acc, n_part = len(accepted), len(partial)
    for r in partial:
        if n_acc == 0 or n_part / n_acc <= max_share + 1e-12:
            break
        r.update(
            verdict="rejected",
            pass_kind=None,
            reason=f"partial cap: the round's partial share {n_part / n_acc:.2f} is above validate.max_partial_share "
            f"{max_share:.2f} (progress {r.get('reward') or 0.0:.2f}, among the lowest)",
        )
        n_acc, n_part = n_acc - 1, n_part - 1
    return out


def partial_share(rows: list[dict[str, Any]]) -> float | None:
    """Share of the accepted rows that passed by failure with positive reward (None: none accepted)."""
    accepted = [r for r in rows if r.get("verdict") == "accepted"]
    if not accepted:
        return None
    return round(sum(r.get("pass_kind") == "partial" for r in accepted) / len(accepted), 4)


def _validate_elsewhere(
    store: Store,
    run_id: str,
    round_no: int,
    rows: list[dict[str, Any]],
    pool_rows: list[dict[str, Any]],
    env: Environment,
    cfg: RunConfig,
    pass2: Pass2,
    splits: Splits,
) -> list[dict[str, Any]]:
    """Pass 1 here, in order; pass 2 by ``pass2`` on what pass 1 let through; its attempts'
    rollouts written once, as the in-process solver writes them."""
    pending = {i for i, r in enumerate(rows) if not r.get("verdict")}
    out = validate_rows(rows, pool_rows, env, cfg, solver=None, splits=splits)  # pass 1 only
    passed = [i for i in sorted(pending) if out[i]["verdict"] == "accepted"]
    if passed:
        with splits.part("pass2"):
            verdicts, rollouts = pass2([rows[i]["spec"] for i in passed])
        for i, verdict in zip(passed, verdicts, strict=True):
            out[i].update(verdict)
        store.write("rollouts", round_no, f"{run_id}-validate", rollouts)
    return out


def summarize_candidates(table: pa.Table) -> dict[str, Any]:
    """Round-summary figures: counts, pass rate, rejection reasons (by kind and by pass),
    accepted tasks by signal type, and the turn-count distribution of accepted tasks."""
    rows = table.to_pylist()
    accepted = [r for r in rows if r["verdict"] == "accepted"]
    rejected = [r for r in rows if r["verdict"] != "accepted"]
    return {
        "candidates": len(rows),
        "accepted": len(accepted),
        "rejected": len(rejected),
        "pass_rate": round(len(accepted) / len(rows), 4) if rows else 0.0,
        "rejections": dict(Counter(reason_kind(r["reason"]) for r in rejected).most_common()),
        "rejections_by_pass": dict(sorted(Counter(reason_pass(r["reason"]) for r in rejected).items())),
        "accepted_by_signal_type": dict(sorted(Counter(r["signal_type"] for r in accepted).items())),
        "accepted_by_pass_kind": dict(sorted(Counter(r.get("pass_kind") or "?" for r in accepted).items())),
        "partial_share": partial_share(rows),
        "accepted_turns": {str(k): v for k, v in sorted(Counter(r["n_turns"] for r in accepted).items())},
    }


def reason_kind(reason: str | None) -> str:
    """The kind of a reason: its text before the first colon ('pass 1 replay', 'unsafe', ...)."""
    return (reason or "none").split(":", 1)[0]


def reason_pass(reason: str | None) -> str:
    """Where a rejection happened: 'pass 1', 'pass 2', or 'checks' (spec, safety, duplicates,
    and rejections made before validation, e.g. by the abstractor)."""
    kind = reason_kind(reason)
    return kind[:6] if kind.startswith(("pass 1", "pass 2")) else "checks"
