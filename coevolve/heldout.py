"""The held-out synthesized split: tasks made from held-out scenarios' states, for evaluation only.

Besides the benchmark's own entries, each store freezes an evaluation set synthesized the way
the seed pool is (``coevolve.synth``: coverage contexts, the round-0 explorer, the abstractor,
pass 1 of validation), but from the *states* of held-out scenarios
(``Environment.heldout_states``) and with its own seed. Round 0 commits it into pool v1 with
``split = origin = 'heldout'``; training, exploration and validation read the ``train`` split
only, so it is never trained on, explored from or shown to validation. Every round evaluates
the policy on it with the benchmark's protocol (``eval.*``) next to the benchmark entries.

    tasks = synthesize_heldout(cfg)     # deterministic for a config and seed; [] without held-out states

No question or ground-truth call of the benchmark is read: only held-out scenarios' initial
configurations and tool docs, which the benchmark's evaluation reads anyway.
"""

from __future__ import annotations

import random

from coevolve.abstract import candidate_rows, group_runs
from coevolve.config import RunConfig
from coevolve.envs.base import Environment
from coevolve.explore import session_rows
from coevolve.registry import resolve
from coevolve.synth import explore_states
from coevolve.tasks import Task
from coevolve.validate import validate_rows

HELDOUT = "heldout"  # split and origin of the held-out synthesized tasks
SEED_OFFSET = 7919  # the split's own seed: run seed + this (a prime, far from seed + 1, seed + 2 of other runs)


def heldout_states(cfg: RunConfig, env: Environment) -> list[Task]:
    """Up to ``synth.scenarios`` held-out scenarios' state-only tasks (drawn with the split's
    seed), one per (category in ``synth.categories``, scenario); [] when the environment has none."""
    if not hasattr(env, "heldout_states"):
        return []
    states = env.heldout_states(cfg.env.heldout_scenarios, cfg.seed, cfg.synth.categories)
    scenarios = sorted({env.scenario_of(t) for t in states})
    rng = random.Random(f"heldout-synth/{cfg.seed + SEED_OFFSET}")
    chosen = set(rng.sample(scenarios, min(cfg.synth.scenarios, len(scenarios))))
    return [t for t in states if env.scenario_of(t) in chosen]


def synthesize_heldout(cfg: RunConfig, env: Environment | None = None) -> list[Task]:
    """``eval.synth_tasks`` tasks synthesized from held-out states that pass validation's pass 1
    (every rule of the quality gate included), drawn with the split's seed, ordered by id."""
    if cfg.eval.synth_tasks == 0:
        return []
    env = env or resolve("environment", cfg.env.name)()
    states = heldout_states(cfg, env)
    if not states:
        return []
    seed = cfg.seed + SEED_OFFSET
    sessions = explore_states(cfg, env, states, seed, "heldout-contexts")
    run_id = f"{cfg.run_name}-{HELDOUT}"
    runs = group_runs(session_rows(run_id, sessions), {t.task_id: t for t in states}, env)
    pending = [r for r in candidate_rows(cfg, runs, run_id, 0) if not r.get("verdict")]
    judged = validate_rows(pending, [], env, cfg, solver=None)
    accepted = [Task.from_json(r["spec"]) for r in judged if r["verdict"] == "accepted"]
    picked = random.Random(f"{seed}/heldout-pick").sample(accepted, min(cfg.eval.synth_tasks, len(accepted)))
    out = []
    for task in picked:
        task.split = task.origin = task.signal_type = HELDOUT
        root = (task.seed_task_id or task.task_id).split("~")[0]  # make_task sets seed_task_id
        task.task_id = f"{root}~{HELDOUT}.{task.content_hash[:10]}"
        task.run_id, task.created_round = cfg.run_name, 0
        out.append(task)
    return sorted(out, key=lambda t: t.task_id)
