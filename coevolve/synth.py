"""Round 0: synthesize the seed pool from training-scenario states (no human data).

The pool starts from nothing a human wrote for the benchmark. The environment offers the
*states* of its training scenarios (``Environment.training_states``: BFCL's initial
configuration, involved classes, tool docs, excluded functions; AgentDojo's suite
environments; never a question, never a ground-truth call, nothing of a held-out scenario).
Round 0 draws ``synth.scenarios`` of them (``Environment.scenario_of``) with the run seed and explores each from ``synth.contexts_per_scenario`` coverage
contexts (their focus tools together reach every tool of the scenario's classes; argument
values come from the tool schemas, the state and the observations). The rest of round 0 is
an ordinary round's tail: abstract -> validate (mechanical checks only: there is no trained
policy yet) -> commit pool v1, whose tasks have ``origin = 'static'`` (the paper's "static
synthetic data").

    states = synthesis_states(cfg)                 # state-only tasks round 0 starts from
    n = explore_static(store, cfg, run_id)         # ``explorations`` rows of round 0
"""

from __future__ import annotations

import random
from typing import Any

from coevolve.config import ConfigError, RunConfig
from coevolve.envs.base import Environment
from coevolve.registry import resolve
from coevolve.store import Store
from coevolve.tasks import Task

STATIC = "static"  # signal_type of round-0 contexts and origin of the tasks they yield


def synthesis_states(cfg: RunConfig, env: Environment | None = None) -> list[Task]:
    """The start states of round 0: ``synth.scenarios`` training scenarios drawn with the run
    seed, one state-only task per (category in ``synth.categories``, scenario)."""
    env = env or resolve("environment", cfg.env.name)()
    if not hasattr(env, "training_states") or not hasattr(env, "scenario_of"):
        raise ConfigError(
            f"environment {cfg.env.name!r} offers no training states to synthesize a seed pool from "
            "(it needs training_states(heldout, seed, categories) and scenario_of(task): see coevolve.envs.base); commit a pool to the store first"
        )
    states = env.training_states(cfg.env.heldout_scenarios, cfg.seed, cfg.synth.categories)
    scenarios = sorted({env.scenario_of(t) for t in states})
    chosen = set(random.Random(f"synth/{cfg.seed}").sample(scenarios, min(cfg.synth.scenarios, len(scenarios))))
    return [t for t in states if env.scenario_of(t) in chosen]


def explore_states(cfg: RunConfig, env: Environment, states: list[Task], seed: int, label: str) -> list[Any]:
    """Round 0's synthesizer up to exploration: ``synth.contexts_per_scenario`` coverage contexts
    per state (their focus tools drawn with ``<seed>/<label>``), each explored ``synth.runs_per_context``
    times for ``synth.steps_per_run`` steps by ``synth.explorer``; returns the sessions."""
    from coevolve.explore import coverage_contexts, make_explorer, run_sessions

    s = cfg.synth
    avoid = frozenset(cfg.validate.blocked_functions)
    rng = random.Random(f"{seed}/{label}")
    contexts = coverage_contexts(states, len(states) * s.contexts_per_scenario, rng, avoid, STATIC)
    return run_sessions(make_explorer(cfg, s.explorer), contexts, env, s.runs_per_context, s.steps_per_run, seed)


def explore_static(store: Store, cfg: RunConfig, run_id: str) -> int:
    """Explore round 0's coverage contexts; write ``explorations`` rows (round 0); return their count."""
    from coevolve.explore import session_rows

    env = resolve("environment", cfg.env.name)()
    sessions = explore_states(cfg, env, synthesis_states(cfg, env), cfg.seed, "static-contexts")
    return store.write("explorations", 0, f"{run_id}-explore", session_rows(run_id, sessions))
