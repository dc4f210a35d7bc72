"""The SFT warm start is cached per machine by content: computed once, loaded after, and
recomputed whenever what it depends on changes (or the cached file is unreadable)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from coevolve.config import load_config
from coevolve.registry import resolve
from coevolve.round import pool_tasks, run_round
from coevolve.store import Store

TINY = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml")


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    cfg = load_config(TINY, {"store": str(tmp_path_factory.mktemp("ws") / "store")})
    store = Store(cfg.store)
    run_round(store, cfg, 0)
    return pool_tasks(store, "train")


def _warm(cfg, tasks, progress=None):
    from coevolve.policy import load_policy
    from coevolve.train.local import _warm_start

    policy = load_policy(cfg.policy)
    env = resolve("environment", cfg.env.name)()
    on_step = (lambda step, steps, loss: progress.append((step, steps, loss))) if progress is not None else None
    _warm_start(policy, policy.model, env, tasks, cfg, seed=7, on_step=on_step)
    return {n: p.detach().clone() for n, p in policy.model.named_parameters()}


def test_warm_start_is_computed_once_then_loaded(pool, tmp_path, monkeypatch):
    import coevolve.train.sft as sft
    import coevolve.train.warm_start_cache as wsc

    monkeypatch.setattr(wsc, "cache_root", lambda: tmp_path)
    calls = []
    real = sft.run_sft
    monkeypatch.setattr(sft, "run_sft", lambda *a, **kw: calls.append(kw["steps"]) or real(*a, **kw))
    cfg = load_config(TINY, {"train.sft_steps": 4})

    progress: list = []
    first = _warm(cfg, pool, progress)
    assert calls == [4] and len(list((tmp_path / "warm-start").glob("*.safetensors"))) == 1
    # each computed step is reported (the CLI's live status), with its loss
    assert [(s, n) for s, n, _ in progress] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert all(loss > 0 and loss == loss for _, _, loss in progress)
    from coevolve.policy import load_policy

    base = {n: p for n, p in load_policy(cfg.policy).model.named_parameters()}
    assert any(not torch.equal(first[n], base[n]) for n in base)  # the warm start trained something

    again = _warm(cfg, pool, progress)  # a fresh policy: loaded from the cache, not retrained
    assert calls == [4] and all(torch.equal(again[n], first[n]) for n in first)
    assert len(progress) == 4  # nothing computed, nothing reported

    _warm(load_config(TINY, {"train.sft_steps": 5}), pool)  # other settings: another warm start
    _warm(cfg, pool[:-1])  # other examples: another warm start
    assert calls == [4, 5, 4] and len(list((tmp_path / "warm-start").glob("*.safetensors"))) == 3

    for f in (tmp_path / "warm-start").glob("*.safetensors"):
        f.write_bytes(b"torn")  # an unreadable file is a miss, never a crash
    assert all(torch.equal(a, b) for a, b in zip(_warm(cfg, pool).values(), first.values()))
    assert calls == [4, 5, 4, 4]

    off = load_config(TINY, {"train.sft_steps": 4, "train.warm_start_cache": False})
    _warm(off, pool)
    assert calls == [4, 5, 4, 4, 4]
