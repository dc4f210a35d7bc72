"""A lineage: a run name in a store, continued run after run (the nightly deployment).

    cfg, rounds = plan_lineage("configs/tiny.yaml", rounds_per_run=2, store="", run_name="", overrides={})
    # night 1 (empty store): rounds [0, 1, 2] (round 0 first: the seed pool); night 2: [3, 4]

``rounds_per_run = 0`` runs (or resumes) rounds 0..``rounds`` of the config, as ``coevolve run``
does; ``rounds_per_run = n`` plans the n rounds after the lineage's last finished one. The flow
(``flows/evolve.py``) runs the plan; a round already done skips its stages.
"""

from __future__ import annotations

from typing import Any

import pyarrow.dataset as ds

from coevolve.config import ConfigError, RunConfig, load_config
from coevolve.round import last_finished_round
from coevolve.store import StoreError
from coevolve.store_open import open_run_store


def plan_lineage(
    config: str, rounds_per_run: int, store: str, run_name: str, overrides: dict[str, Any]
) -> tuple[RunConfig, list[int]]:
    """The run's config and the rounds it runs. Empty parameters never override the config
    file; any bad value raises ``ConfigError`` naming it, before anything is written.

    With ``rounds_per_run``, ``cfg.rounds`` becomes the last round planned; a lineage killed
    between its last round's final marker and its ``rounds`` row gets that round back (every
    stage of it is skipped as done: only the row is written)."""
    given = {"store": store.strip(), "run_name": run_name.strip()}
    dotted = {**{k: v for k, v in given.items() if v}, **(overrides or {})}
    if rounds_per_run < 0:
        raise ConfigError(f"rounds_per_run must be >= 0, not {rounds_per_run}")
    if rounds_per_run and "rounds" in dotted:
        raise ConfigError("set either rounds_per_run or overrides['rounds'], not both")
    cfg = load_config(config.strip() or None, dotted)
    from coevolve.registry import check_plugins

    check_plugins(cfg)
    try:
        run_store = open_run_store(cfg)
    except StoreError as exc:
        raise ConfigError(f"store {cfg.store!r}: {exc}") from None
    if not rounds_per_run:
        return cfg, list(range(0, cfg.rounds + 1))
    last = last_finished_round(run_store, cfg.run_name)
    cfg.rounds = last + rounds_per_run
    first = [] if run_store.stage_done(cfg.run_name, 0, "commit") is not None else [0]
    if (
        last
        and not run_store.read(
            "rounds", filter=(ds.field("run_id") == cfg.run_name) & (ds.field("round") == last), columns=["run_id"]
        ).num_rows
    ):
        first.append(last)
    return cfg, first + list(range(last + 1, last + rounds_per_run + 1))
