"""The fast subset of the fault campaign (``coevolve bench reliability``): a few kill points,
a handful of committing processes on local and S3 stores, a short S3 fault run, a fuzz sample."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from coevolve.bench.reliability.campaign import format_table
from coevolve.bench.reliability.common import CampaignConfig, ScenarioResult
from coevolve.bench.reliability.concurrent import concurrent_scenario
from coevolve.bench.reliability.fuzz import fuzz_outputs
from coevolve.bench.reliability.kill import kill_scenario, sample_points
from coevolve.bench.reliability.s3_faults import FaultProxy

CHEAP_RUN = {
    "train.backend": "chaos_plugins:copy_trainer",
    "synth.scenarios": 2,
    "synth.contexts_per_scenario": 1,
    "eval.scenarios": 1,
    "eval.categories": ["multi_turn_base"],
    "eval.step_limit": 1,
    "eval.max_new_tokens": 8,
    "env.step_limit": 1,
    "explore.runs_per_context": 1,
    "explore.steps_per_run": 2,
}


def _assert_clean(res: ScenarioResult) -> None:
    assert res.ok, format_table([res])


def test_kill_points_cover_every_stage_in_order():
    import random

    counts = {"0:seed": 3, "1:train": 5, "1:signals": 1, "1:commit": 4}
    points = sample_points(counts, 6, random.Random(0))
    assert len(points) == 6 and {(p["round"], p["stage"]) for p in points} == {
        (0, "seed"),
        (1, "train"),
        (1, "signals"),
        (1, "commit"),
    }
    order = [(p["round"], p["stage_idx"], p["op"]) for p in points]
    assert order == sorted(order)


def test_kill_and_resume_keeps_every_row(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the children import chaos_plugins
    monkeypatch.setenv("COEVOLVE_PLUGINS", CHEAP_RUN["train.backend"])  # a path the operator trusts (issue 29)
    cc = CampaignConfig(config="configs/tiny.yaml", overrides=CHEAP_RUN, rounds=1, kills=2, run_timeout_s=300)
    # services other tests of the session started (Prefect's harness) are not the campaign's
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    res = kill_scenario(cc, tmp_path, log=print)
    _assert_clean(res)
    assert res.tried == 2
    assert not [p for p in psutil.Process().children(recursive=True) if p.is_running() and p.pid not in before]


def test_processes_committing_at_once_lose_nothing_local_and_s3(tmp_path, s3_endpoint, s3_bucket):
    cc = CampaignConfig(procs=3, commits=2)
    local = concurrent_scenario("local", str(tmp_path / "pool"), "", cc, tmp_path, log=print)
    _assert_clean(local)
    assert local.tried == 12  # 3 processes x 2 commits x (shared run id, own run ids)
    s3 = concurrent_scenario(
        "s3",
        f"s3://{s3_bucket}/pool",
        s3_endpoint,
        CampaignConfig(procs=2, commits=2),
        tmp_path,
        log=print,
        modes=("same-run-id",),
    )
    _assert_clean(s3)


def test_commits_through_a_faulty_s3_proxy_lose_nothing(tmp_path, s3_endpoint, s3_bucket):
    proxy = FaultProxy(s3_endpoint, rate=0.2, seed=1, slow_s=0.2)
    try:
        res = concurrent_scenario(
            "faults",
            f"s3://{s3_bucket}/pool",
            proxy.url,
            CampaignConfig(procs=2, commits=2),
            tmp_path,
            log=print,
            modes=("same-run-id",),
            check_endpoint=s3_endpoint,
        )
    finally:
        proxy.close()
    _assert_clean(res)
    assert sum(v for k, v in proxy.counts.items() if k != "ok") >= 3, proxy.counts  # faults did happen


def test_fuzzed_outputs_raise_nothing():
    res = fuzz_outputs(5000, seed=3)
    _assert_clean(res)
    assert res.tried == 5000


def test_unknown_scenario_is_a_clear_error():
    from coevolve.bench.reliability.campaign import run_campaign

    with pytest.raises(ValueError, match="unknown scenarios"):
        run_campaign(CampaignConfig(scenarios=["nope"]))


# ----------------------------------------------------------------------------- table parts (issue 29 item 2)
def test_torn_writes_kill_between_a_part_and_its_marker_lose_nothing(tmp_path):
    from coevolve.bench.reliability.parts import torn_writes_scenario

    res = torn_writes_scenario(CampaignConfig(rounds=1, kills=4, seed=1, run_timeout_s=120), tmp_path, log=print)
    _assert_clean(res)
    assert res.tried == 4


def test_damaged_and_planted_parts_are_refused_or_ignored(tmp_path):
    from coevolve.bench.reliability.parts import damaged_parts_scenario

    res = damaged_parts_scenario("damaged-parts", str(tmp_path / "store"), CampaignConfig(rounds=1), log=print)
    _assert_clean(res)
    assert res.tried == 8 * (4 + 4)  # every table: four damages, two plants in two partitions


def test_damaged_parts_scenario_fails_when_readers_trust_every_file(tmp_path, monkeypatch):
    from coevolve.bench.reliability.parts import damaged_parts_scenario
    from coevolve.store import Store

    monkeypatch.setattr(Store, "_check_part", lambda self, table, path, entry, size: None)
    monkeypatch.setattr(Store, "unreadable", lambda self, table, files, exc: exc)
    res = damaged_parts_scenario("damaged-parts", str(tmp_path / "store"), CampaignConfig(rounds=1), log=print)
    assert not res.ok and res.survived < res.tried
