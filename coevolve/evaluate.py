"""Evaluation: run a policy on held-out tasks, log the rollouts, report accuracy per category.

    tasks = eval_tasks(cfg)                            # held-out entries only, from the environment
    result = evaluate(store, cfg, run_id, round, policy, tasks)
    result.score          # episodes that succeed as the benchmark scores them, over all tasks
    result.overall        # BFCL's overall accuracy: the mean of the per-category accuracies
    result.reward         # mean training reward (coevolve.reward), for reference
    result.per_category   # {"multi_turn_base": {"n", "correct", "accuracy", "reward"}, ...}

What is evaluated: ``eval.scenarios`` of the held-out scenarios (``env.heldout_scenarios``,
drawn with the run seed; 0 = all of them) in every category of ``eval.categories``, loaded
from the environment (held-out tasks never live in the ``tasks`` table). How, following
BFCL's protocol: every turn of every entry, up to ``eval.step_limit`` model messages per turn
(BFCL: 20), ``eval.max_new_tokens`` per message, ``eval.temperature`` (greedy by default),
scored by the environment's checker; an entry counts as correct when it succeeds.

Episodes run through the rollout engine with ``phase="eval"`` (one sample per task); their
step rows are written to part ``<run_id>-eval`` of table ``rollouts`` in partition ``round``,
replacing an earlier evaluation of the same round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from coevolve.config import RunConfig
from coevolve.types import EpisodeScore, ToolCall
from coevolve.policy.base import Policy
from coevolve.registry import resolve
from coevolve.store import Store
from coevolve.tasks import Task


@dataclass
class EvalResult:
    score: float  # success rate over all episodes, in [0, 1]
    reward: float  # mean training reward over all episodes, in [0, 1]
    per_category: dict[str, dict[str, Any]] = field(default_factory=dict)  # n, correct, accuracy, reward
    n_episodes: int = 0
    n_rows: int = 0  # rollouts rows written
    seconds: float = 0.0
    failures: dict[str, str] = field(default_factory=dict)  # task_id -> first failing check

    @property
    def overall(self) -> float:
        """BFCL's overall accuracy: the unweighted mean of the per-category accuracies."""
        return overall_accuracy(self.per_category)


def overall_accuracy(per_category: dict[str, dict[str, Any]]) -> float:
    """Mean of the categories' accuracies, as BFCL's leaderboard averages multi-turn categories."""
    return sum(r["accuracy"] for r in per_category.values()) / len(per_category) if per_category else 0.0


def eval_tasks(
    cfg: RunConfig,
    env: Any = None,
    *,
    scenarios: int | None = None,
    categories: list[str] | None = None,
    limit: int | None = None,
) -> list[Task]:
    """The held-out tasks to evaluate, by category then scenario.

    ``scenarios`` held-out scenarios (default ``cfg.eval.scenarios``; 0 = all; all when only
    ``limit`` is given) in each of ``categories`` (default ``cfg.eval.categories``), drawn with
    ``cfg.seed`` from ``cfg.env.heldout_scenarios``; ``limit`` keeps the first N per category.
    Raises ``ValueError`` when nothing is held out and ``TypeError`` for an environment
    without held-out tasks (one that has no ``heldout_tasks`` method).
    """
    env = env or resolve("environment", cfg.env.name)()
    if not hasattr(env, "heldout_tasks"):
        raise TypeError(f"environment {cfg.env.name!r} has no held-out tasks (it needs a heldout_tasks method)")
    if scenarios is None:
        scenarios = 0 if limit is not None else cfg.eval.scenarios
    categories = list(categories or cfg.eval.categories)
    tasks = env.heldout_tasks(cfg.env.heldout_scenarios, cfg.seed, scenarios, categories)
    if not tasks:
        raise ValueError("no held-out tasks to evaluate: env.heldout_scenarios holds nothing out")
    if limit is not None:
        by_cat: dict[str, list[Task]] = {}
        for t in tasks:
            by_cat.setdefault(t.category, []).append(t)
        # an environment may ignore the category names it does not know (AgentDojo: suites)
        order = [c for c in categories if c in by_cat] + [c for c in by_cat if c not in categories]
        tasks = [t for c in order for t in by_cat[c][:limit]]
    return tasks


def summarize(tasks: list[Task], scores: dict[str, Any]) -> tuple[float, float, dict[str, dict[str, Any]]]:
    """(score, reward, per_category) from ``scores[task_id] -> EpisodeScore`` of one sample each."""
    per: dict[str, dict[str, Any]] = {}
    for t in tasks:
        s = scores[t.task_id]
        row = per.setdefault(t.category or "uncategorized", {"n": 0, "correct": 0, "reward_sum": 0.0})
        row["n"] += 1
        row["correct"] += int(bool(s.success))
        row["reward_sum"] += float(s.reward)
    for row in per.values():
        row["accuracy"] = row["correct"] / row["n"]
        row["reward"] = row.pop("reward_sum") / row["n"]
    n = sum(r["n"] for r in per.values())
    score = sum(r["correct"] for r in per.values()) / n if n else 0.0
    reward = sum(r["reward"] * r["n"] for r in per.values()) / n if n else 0.0
    return score, reward, per


def replay_reference(env: Any, tasks: list[Task]) -> dict[str, EpisodeScore]:
    """Drive each task's episode with its own reference calls, without a policy or the rollout
    engine, and score it: the environment-only half of ``--replay-ground-truth``."""
    scores = {}
    for task in tasks:
        ep = env.episode(task)
        for turn, calls in enumerate(task.reference_actions):
            ep.user_message(turn)
            ep.tools(turn)
            for c in calls:
                ep.step(ToolCall(c["name"], c.get("arguments", {})))
            ep.end_turn()
        scores[task.task_id] = ep.score()
    return scores


def evaluate(
    store: Store | None,
    cfg: RunConfig,
    run_id: str,
    round_no: int,
    policy: Policy,
    tasks: list[Task] | None = None,
    *,
    env: Any = None,
    progress: Callable[[int, int], None] | None = None,
    part: str = "eval",
) -> EvalResult:
    """Run ``policy`` once on each of ``tasks`` (default: ``eval_tasks(cfg)``) with phase "eval".

    Writes the step rows to ``store`` (table rollouts, partition ``round``, part
    ``<run_id>-<part>``: ``eval`` for the benchmark, ``eval-synth`` for the held-out
    synthesized split) unless ``store`` is None; returns an ``EvalResult``.
    """
    env = env or resolve("environment", cfg.env.name)()
    tasks = eval_tasks(cfg, env) if tasks is None else list(tasks)
    return evaluate_parts(store, cfg, run_id, round_no, policy, {part: tasks}, env=env, progress=progress)[part]


def evaluate_parts(
    store: Store | None,
    cfg: RunConfig,
    run_id: str,
    round_no: int,
    policy: Policy,
    parts: dict[str, list[Task]],
    *,
    env: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, EvalResult]:
    """``evaluate`` of several task sets (``{part: tasks}``: the benchmark and the held-out
    synthesized split) in one run of episodes, so that one set's episodes fill the batch
    while the other's last ones finish; each set is written to its own part and scored on its
    own. ``seconds`` of each result is the whole run's."""
    from coevolve.rollout import rollout_settings, run_episodes

    env = env or resolve("environment", cfg.env.name)()
    everything = [task for tasks in parts.values() for task in tasks]
    started = time.perf_counter()
    # BFCL's protocol (eval.*): its generation budget and step limit; an undecodable message ends the turn
    results = run_episodes(
        policy,
        env,
        everything,
        n_samples=1,
        phase="eval",
        run_id=run_id,
        round_no=round_no,
        progress=progress,
        **rollout_settings(cfg, "eval"),
    )
    seconds = time.perf_counter() - started
    out, at = {}, 0
    for part, tasks in parts.items():
        mine, at = results[at : at + len(tasks)], at + len(tasks)  # results come in task order
        rows = [row for r in mine for row in r.steps]
        n_rows = store.write("rollouts", round_no, f"{run_id}-{part}", rows) if store is not None and tasks else 0
        score, reward, per = summarize(tasks, {r.task_id: r.score for r in mine})
        out[part] = EvalResult(
            score=score,
            reward=reward,
            per_category=per,
            n_episodes=len(mine),
            n_rows=n_rows,
            seconds=seconds,
            failures={r.task_id: r.score.reason for r in mine if not r.score.success},
        )
    return out
