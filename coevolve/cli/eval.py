"""``coevolve eval`` (BFCL accuracy of a policy per category, on held-out entries) and ``coevolve bench env``.

    coevolve eval --policy .coevolve/checkpoints/default/round-2    # a checkpoint dir, or a model name
    coevolve eval --limit 4                                         # first 4 held-out entries per category
    coevolve eval --scenarios 0 --category multi_turn_base          # every held-out scenario, one category
    coevolve eval --env bfcl-v3 --replay-ground-truth --all         # env + scorer faithfulness: 200/200 x4
    coevolve bench env                                              # time to replay + score all 800 entries

A policy is only ever evaluated on held-out entries (``env.heldout_scenarios`` of the config,
drawn with its seed): ``--scenarios`` / ``--limit`` / ``--category`` choose among them, and
``--ids`` must name held-out entries. ``--all`` (every entry of the benchmark) is for
``--replay-ground-truth`` only, which runs no model. The protocol is the config's ``eval``
section (BFCL's: every turn, 20 model messages per turn, greedy).
Rollouts go to table ``rollouts`` (phase=eval) of the store (``--store``, else the config's).
"""

from __future__ import annotations

from typing import Optional

import typer

from coevolve.cli.app import app, bench_app
from coevolve.cli.common import console, fail, load_config_or_fail


def _select(env, categories: list[str], ids: list[str], limit: Optional[int]):
    """Every entry: tasks by ids, or the first ``limit`` of each category (all categories by default)."""
    try:
        if ids:
            return env.load_tasks(ids=ids)
        cats = categories or list(getattr(env, "categories", [])) or [None]
        return [t for c in cats for t in env.load_tasks(categories=[c] if c else None, limit=limit)]
    except KeyError as exc:
        fail(str(exc.args[0]))


def _select_heldout(cfg, env, categories: list[str], ids: list[str], limit: Optional[int], scenarios: Optional[int]):
    """Held-out entries only: ``ids`` (each must be held out) or ``eval_tasks`` of the config."""
    from coevolve.evaluate import eval_tasks

    try:
        if ids:
            allowed = {t.task_id for t in eval_tasks(cfg, env, scenarios=0, categories=list(env.categories))}
            outside = [i for i in ids if i not in allowed]
            tasks = env.load_tasks(ids=ids)  # unknown ids fail here first
            if outside:
                fail(
                    f"not held-out entries (env.heldout_scenarios): {', '.join(outside[:5])}; "
                    "only --replay-ground-truth may run other entries"
                )
            return tasks
        return eval_tasks(cfg, env, scenarios=scenarios, categories=categories or None, limit=limit)
    except (KeyError, ValueError, TypeError) as exc:
        fail(str(exc.args[0]))


def _table(title: str, per_category: dict, seconds: float):
    from rich.table import Table

    from coevolve.evaluate import overall_accuracy

    table = Table(title=title)
    for col in ("category", "correct", "accuracy", "train reward"):
        table.add_column(col, justify="left" if col == "category" else "right")
    n = correct = reward = 0.0
    for cat, row in per_category.items():
        table.add_row(cat, f"{row['correct']}/{row['n']}", f"{100 * row['accuracy']:.1f}%", f"{row['reward']:.3f}")
        n, correct, reward = n + row["n"], correct + row["correct"], reward + row["reward"] * row["n"]
    if n:
        table.add_row("all", f"{int(correct)}/{int(n)}", f"{100 * correct / n:.1f}%", f"{reward / n:.3f}", style="bold")
    table.caption = (
        f"BFCL overall accuracy (mean over categories): {100 * overall_accuracy(per_category):.1f}%; "
        f"{int(n)} episodes in {seconds:.2f}s"
    )
    return table


@app.command("eval")
def eval_command(
    env_name: str = typer.Option("bfcl-v3", "--env", help="Environment plug-in."),
    category: list[str] = typer.Option([], "--category", help="Category to evaluate (repeatable; default all)."),
    ids: list[str] = typer.Option(
        [], "--ids", help="Exact held-out task ids (repeatable; overrides --category/--limit)."
    ),
    limit: Optional[int] = typer.Option(None, "--limit", help="First N held-out entries of each category."),
    scenarios: Optional[int] = typer.Option(
        None, "--scenarios", help="Held-out scenarios evaluated in each category (0 = all; default eval.scenarios)."
    ),
    all_entries: bool = typer.Option(
        False, "--all", help="Every entry of the benchmark, training scenarios included (--replay-ground-truth only)."
    ),
    replay_ground_truth: bool = typer.Option(
        False, "--replay-ground-truth", help="Replay the reference calls instead of a model (checks env + scorer)."
    ),
    store: Optional[str] = typer.Option(None, "--store", help="Store URI (default: the config's)."),
    config: Optional[str] = typer.Option(None, "--config", help="Run config YAML."),
    model: Optional[str] = typer.Option(
        None, "--policy", "--model", help="Checkpoint directory or model name to evaluate (overrides policy.model)."
    ),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="run_id of the rollouts rows (default: run_name)."),
    round_: int = typer.Option(0, "--round", help="Partition the rollouts rows are written to."),
    no_store: bool = typer.Option(False, "--no-store", help="Do not write rollouts."),
) -> None:
    """Evaluate a policy (or the ground truth) on held-out entries; print BFCL accuracy per category."""
    from coevolve.evaluate import evaluate
    from coevolve.registry import resolve
    from coevolve.store import StoreError
    from coevolve.store_open import open_run_store

    cfg = load_config_or_fail(config, {"env.name": env_name, "policy.model": model, "store": store})
    try:
        env = resolve("environment", cfg.env.name)()
    except KeyError as exc:
        fail(str(exc.args[0]))
    if all_entries and not replay_ground_truth:
        fail("--all runs training scenarios too: it is allowed with --replay-ground-truth only")
    if all_entries:
        tasks = _select(env, category, ids, limit)
    else:
        tasks = _select_heldout(cfg, env, category, ids, limit, scenarios)
    if not tasks:
        fail("no tasks selected")
    if replay_ground_truth:
        from coevolve.policy.replay import ReplayPolicy

        policy = ReplayPolicy(tasks)
    else:
        from coevolve.policy import load_policy

        policy = load_policy(cfg.policy)
    out = None
    if not no_store:
        try:
            out = open_run_store(cfg)
        except StoreError as exc:
            fail(str(exc))
    result = evaluate(out, cfg, run_id or cfg.run_name, round_, policy, tasks, env=env)
    who = (
        "ground truth (replayed)"
        if replay_ground_truth
        else f"{cfg.policy.backend}:{getattr(policy, 'version', cfg.policy.model)}"
    )
    console.print(_table(f"{cfg.env.name} eval: {who}", result.per_category, result.seconds))
    stats = getattr(policy, "stats", None)  # the local backend's DecodeStats
    if stats is not None and stats.steps:
        console.print(
            f"generation: {stats.prefill_tokens} prompt tokens computed in {stats.prefill_s:.1f}s; "
            f"{stats.row_steps + stats.accepted} tokens in {stats.steps} decoding steps (mean batch "
            f"{stats.row_steps / stats.steps:.1f}; {stats.accepted} of {stats.drafted} drafted tokens kept) "
            f"in {stats.decode_s:.1f}s"
        )
    if out is not None:
        console.print(
            f"{result.n_rows} rollouts rows -> {out.table_uri('rollouts')} (round={round_}, part {run_id or cfg.run_name}-eval)"
        )


@bench_app.command("env")
def bench_env(
    env_name: str = typer.Option("bfcl-v3", "--env", help="Environment plug-in."),
    category: list[str] = typer.Option([], "--category", help="Categories (repeatable; default all)."),
    engine: bool = typer.Option(
        True, "--engine/--no-engine", help="Also time the full pipeline (policy + rollout engine)."
    ),
) -> None:
    """Time replaying and scoring every entry's ground truth: env only, then through the engine."""
    from coevolve.bench.env import load_tasks, replay, replay_through_engine
    from coevolve.registry import resolve

    env = resolve("environment", env_name)()
    try:
        tasks, t_load = load_tasks(env, category)
    except KeyError as exc:
        fail(str(exc.args[0]))
    per_category, t_env = replay(env, tasks)
    console.print(f"loaded {len(tasks)} tasks in {t_load:.2f}s")
    console.print(_table(f"{env_name}: reference replay, env only", per_category, t_env))
    if engine:
        result = replay_through_engine(env, tasks)
        console.print(
            _table(f"{env_name}: reference replay, policy + rollout engine", result.per_category, result.seconds)
        )
