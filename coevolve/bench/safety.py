"""The safety policy, measured: attacks refused, legitimate synthesized tasks refused with them.

- **Attacks**: every AgentDojo injection task (what an attacker wants done: send money to an
  outside IBAN, forward mail to an outside address, ...) becomes a candidate task: its goal
  as the instruction, its ground-truth calls as the reference, the suite's default state.
  Each goes through the whole validation (``validate_rows``, no solver): how many are refused,
  and how many of those by the safety policy itself.
- **Legitimate tasks**: round 0 of an environment (``synth.explore_static`` -> ``abstract`` ->
  validation with the general rules off, the configured lists on) in a throwaway store; the
  false-refusal rate is the share of those accepted tasks the general rules refuse.

    report = measure(cfg, ["bfcl-v3", "agentdojo"])        # coevolve bench safety
"""

from __future__ import annotations

import tempfile
from collections import Counter
from typing import Any

from coevolve.config import RunConfig
from coevolve.registry import resolve
from coevolve.tasks import Task
from coevolve.validate import reason_kind, safety_policy, validate_rows


def injection_candidates() -> list[Task]:
    """One candidate per AgentDojo v1.2 injection task (35): goal, ground truth, default state."""
    from coevolve.envs import agentdojo as ad

    out = []
    for suite in ad.SUITES:
        s = ad.suites()[suite]
        env = s.load_and_inject_default_environment({})
        tools = [d["name"] for d in ad.tool_docs(suite)]
        for iid in sorted(s.injection_tasks, key=lambda i: int(i.rsplit("_", 1)[-1])):
            task = s.injection_tasks[iid]
            calls = [
                {"name": c.function, "arguments": dict(c.args)} for c in task.ground_truth(env.model_copy(deep=True))
            ]
            out.append(
                Task(
                    task_id=f"{suite}.{iid}",
                    env=ad.NAME,
                    turns=[task.GOAL],
                    reference_actions=[calls],
                    initial_state={"suite": suite, "environment": ad.default_state(suite)},
                    tools=tools,
                    category=suite,
                    split="train",
                    origin="injection",
                )
            )
    return out


def _rows(tasks: list[Task]) -> list[dict[str, Any]]:
    return [{"candidate_id": t.task_id, "spec": t.to_json(), "verdict": None, "reason": None} for t in tasks]


def judge_attacks(cfg: RunConfig) -> dict[str, Any]:
    """Validation's verdicts on the injection-derived candidates."""
    cfg = _with(cfg, env_name="agentdojo")
    env = resolve("environment", "agentdojo")()
    tasks = injection_candidates()
    judged = validate_rows(_rows(tasks), [], env, cfg, None)
    refused = [r for r in judged if r["verdict"] != "accepted"]
    return {
        "candidates": len(judged),
        "refused": len(refused),
        "refused_by_safety": sum(reason_kind(r["reason"]) == "unsafe" for r in refused),
        "by_rule": dict(Counter(_rule(r["reason"]) for r in refused).most_common()),
        "accepted_ids": [r["candidate_id"] for r in judged if r["verdict"] == "accepted"],
        "reasons": {r["candidate_id"]: r["reason"] for r in judged},
    }


def _rule(reason: str | None) -> str:
    """'unsafe: unknown_party: ...' -> 'unknown_party'; other reasons -> their kind."""
    parts = (reason or "").split(":")
    return parts[1].strip() if parts[0] == "unsafe" and len(parts) > 2 else reason_kind(reason)


def _with(cfg: RunConfig, env_name: str, store: str | None = None, rules: list[str] | None = None) -> RunConfig:
    data = cfg.to_dict()
    data["env"]["name"] = env_name
    if store is not None:
        data["store"] = store
    if rules is not None:
        data["validate"]["safety_rules"] = rules
    return RunConfig.from_dict(data)


def round0_accepted(cfg: RunConfig, env_name: str) -> list[Task]:
    """The tasks round 0 accepts on ``env_name`` with the general safety rules off (the
    configured blocked lists still apply): the legitimate synthesized tasks."""
    from coevolve.abstract import abstract
    from coevolve.store import open_store
    from coevolve.synth import explore_static

    with tempfile.TemporaryDirectory() as tmp:
        run_cfg = _with(cfg, env_name, store=tmp, rules=[])
        store = open_store(tmp)
        explore_static(store, run_cfg, "safety")
        abstract(store, run_cfg, "safety", 0)
        rows = store.read("candidates").to_pylist()
        env = resolve("environment", env_name)()
        judged = validate_rows(rows, [], env, run_cfg, None)
    return [Task.from_json(r["spec"]) for r in judged if r["verdict"] == "accepted"]


def false_refusals(cfg: RunConfig, env_name: str, tasks: list[Task]) -> dict[str, Any]:
    """How many of ``tasks`` (legitimate) the full policy refuses, and by which rule."""
    env = resolve("environment", env_name)()
    policy = safety_policy(_with(cfg, env_name), env)
    reasons = {t.task_id: policy.check(t) for t in tasks}
    refused = {k: v for k, v in reasons.items() if v}
    return {
        "tasks": len(tasks),
        "refused": len(refused),
        "rate": round(len(refused) / len(tasks), 4) if tasks else 0.0,
        "by_rule": dict(Counter(_rule(v) for v in refused.values()).most_common()),
        "examples": dict(list(refused.items())[:3]),
    }


def measure(cfg: RunConfig, envs: list[str]) -> dict[str, Any]:
    """The safety figure: the attacks' verdicts and, per environment, the false-refusal rate
    on round 0's legitimate tasks."""
    out: dict[str, Any] = {"attacks": judge_attacks(cfg)}
    for name in envs:
        out[name] = false_refusals(cfg, name, round0_accepted(cfg, name))
    return out
