"""The ``s3-faults`` scenario: the concurrent commits on S3, then ``fault_rounds`` rounds of a run,
through a loopback proxy that answers 5xx, resets connections (before or after forwarding) and
stalls, at ``fault_rate``; a run either completes or fails with a clear error, and reruns complete
with the reference run's keys.

    res = fault_scenario(CampaignConfig(fault_rate=0.2), MotoS3(), Path("/tmp/chaos"), log=print)
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from coevolve.bench.reliability.common import (
    CampaignConfig,
    ScenarioResult,
    compare_keys,
    corrupt_versions,
    last_line,
    run_child,
    table_keys,
)
from coevolve.bench.reliability.concurrent import concurrent_scenario
from coevolve.bench.reliability.s3_faults import FaultProxy, MotoS3


def fault_scenario(cc: CampaignConfig, moto: MotoS3, work: Path, log: Callable[[str], None]) -> ScenarioResult:
    from coevolve.config import load_config
    from coevolve.round import STAGES
    from coevolve.store import Store

    proxy = FaultProxy(moto.url, cc.fault_rate, seed=cc.seed)
    try:
        bucket = moto.bucket("faults")
        res = concurrent_scenario(
            "s3-faults", f"s3://{bucket}/commits", proxy.url, cc, work, log, check_endpoint=moto.url
        )
        if cc.fault_rounds:
            base = {**cc.overrides, "rounds": cc.fault_rounds}
            ref_store = work / "kill-reference"  # the kill scenario's reference run, when it ran
            run_name = load_config(cc.config, base).run_name
            if cc.rounds < cc.fault_rounds or not Store(str(ref_store)).stage_done(
                run_name, cc.fault_rounds, STAGES[-1]
            ):
                log(f"s3-faults: reference run ({cc.fault_rounds} round) on a local store")
                ref_store = work / "faults-reference"
                proc = run_child(cc.config, {**base, "store": str(ref_store)}, None, None, cc.run_timeout_s)
                if proc.returncode != 0:
                    res.notes.append(f"reference run failed: {last_line(proc)}")
                    return res
            reference = table_keys(Store(str(ref_store)), max_round=cc.fault_rounds)
            cfg = {**base, "store": f"s3://{bucket}/run", "s3.endpoint_url": proxy.url, "s3.max_attempts": 8}
            res.tried += 1
            completed = False
            for attempt in range(4):
                proc = run_child(cc.config, cfg, None, None, cc.run_timeout_s)
                if proc.returncode == 0:
                    completed = True
                    break
                res.notes.append(f"run attempt {attempt + 1} failed clearly: {last_line(proc)}")
            if not completed:  # the rerun with the faults gone must complete
                proc = run_child(cc.config, {**cfg, "s3.endpoint_url": moto.url}, None, None, cc.run_timeout_s)
                completed = proc.returncode == 0
                if not completed:
                    res.notes.append(f"rerun without faults failed: {last_line(proc)}")
            if completed:
                res.survived += 1
                store = Store(f"s3://{bucket}/run", endpoint_url=moto.url)
                lost, dup, notes = compare_keys(reference, table_keys(store))
                bad, more = corrupt_versions(store)
                res.rows_lost += lost
                res.rows_duplicated += dup
                res.corrupt_versions += bad
                res.notes += notes + more
        res.notes.append("proxy: " + ", ".join(f"{k} {v}" for k, v in proxy.counts.items()))
        return res
    finally:
        proxy.close()
