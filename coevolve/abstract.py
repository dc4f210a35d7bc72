"""Stage 2c of a round: abstract exploration runs into candidate task specs.

The steps of one run (one ``(signal_id, run_idx)`` group of the ``explorations`` table)
become one ``Task``: instruction turns, the start state the run explored from, and the
reference calls per turn. An abstractor (registry kind ``"abstractor"``) writes the turns:

- ``template`` (``coevolve.abstractors.template``): no LLM; instructions that state goals
  ("Go into document, create a folder named temp and move final_report.pdf to temp."), from
  per-function goal templates; calls that change nothing and answer nothing are dropped,
  repeats collapse, and turns split at goal boundaries (at most ``max_turns``);
- ``llm``: an OpenAI-compatible model returns the turns and calls as JSON, checked against
  a schema (``check_spec``); the start state is the run's, never the model's.

Every run yields a ``candidates`` row (part ``<run_id>-candidates``): pending (verdict
NULL) with its spec, or already ``rejected`` with the reason (a useless run, malformed LLM
output). ``coevolve.validate`` decides the rest.

    n = abstract(store, cfg, run_id, round)
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pyarrow.dataset as ds

from coevolve.abstractors.base import Abstractor, Call, Run, describe, split_turns  # noqa: F401  (the stage's types)
from coevolve.config import RunConfig
from coevolve.explore import start_task
from coevolve.registry import register, resolve
from coevolve.store import Store
from coevolve.synth import STATIC, synthesis_states
from coevolve.tasks import Task

def make_task(run: Run, turns: list[str], reference: list[list[Call]], run_id: str, round: int) -> Task:
    """The candidate task of ``run``: the seed's state, env and category, the new turns
    (origin ``static`` for round 0's runs, ``explored`` otherwise)."""
    seed = run.seed
    task = dataclasses.replace(
        seed,
        task_id="",
        turns=list(turns),
        reference_actions=reference,
        split="train",
        origin=STATIC if run.signal_type == STATIC else "explored",
        signal_type=run.signal_type,
        seed_task_id=seed.task_id,
        created_round=round,
        run_id=run_id,
    )
    # ids name the seed and the round; the content hash keeps them unique
    task.task_id = f"{seed.task_id.split('~')[0]}~x{round}.{task.content_hash[:10]}"
    return task


# ----------------------------------------------------------------------------- llm
LLM_SYSTEM = (
    "You write training tasks for a tool-calling assistant. Given a log of function calls that "
    "succeeded in an environment, write a realistic user task that these calls accomplish. "
    "Reply with one JSON object and nothing else:\n"
    '{"turns": [{"instruction": "<what the user asks in this turn>", '
    '"calls": [{"name": "<function>", "arguments": {...}}]}]}\n'
    "Use {max_turns} turns at most. Use only calls from the log, in their order, with their "
    "exact arguments. Each instruction must state every value its calls need."
)


def _json_object(text: str) -> Any:
    """The first JSON object in ``text`` (code fences and chatter around it allowed)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the output")
    obj, _ = json.JSONDecoder().raw_decode(text[start:])
    return obj


def check_spec(obj: Any, docs: dict[str, dict[str, Any]], max_turns: int) -> tuple[list[str], list[list[Call]]]:
    """``(turns, reference)`` from an LLM's JSON answer, or ``ValueError`` saying what is wrong.

    ``obj`` may be any JSON value: every shape other than the schema's is a ``ValueError``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("turns"), list):
        raise ValueError("the answer must be an object whose 'turns' is a list")
    if not 1 <= len(obj["turns"]) <= max_turns:
        raise ValueError(f"needs 1 to {max_turns} turns, got {len(obj['turns'])}")
    turns, reference = [], []
    for i, turn in enumerate(obj["turns"]):
        if not isinstance(turn, dict):
            raise ValueError(f"turn {i} must be an object, got {type(turn).__name__}")
        text, calls = turn.get("instruction"), turn.get("calls")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"turn {i} needs a non-empty 'instruction'")
        if not isinstance(calls, list) or not calls:
            raise ValueError(f"turn {i} needs a non-empty list of 'calls'")
        checked = []
        for j, call in enumerate(calls):
            if not isinstance(call, dict):
                raise ValueError(f"turn {i} call {j} must be an object, got {type(call).__name__}")
            name, arguments = call.get("name"), call.get("arguments", {})
            if not isinstance(name, str) or name not in docs:
                raise ValueError(f"turn {i}: unknown function {str(name)[:60]!r}")
            if not isinstance(arguments, dict):
                raise ValueError(f"turn {i}: arguments of {name} must be an object")
            checked.append({"name": name, "arguments": arguments})
        turns.append(text.strip())
        reference.append(checked)
    return turns, reference


def log_prompt(run: Run, calls: list[Call]) -> str:
    lines = [f"Functions: {', '.join(sorted({c['name'] for c in calls}))}"]
    for c in sorted({c["name"] for c in calls}):
        lines.append(f"- {c}: {describe(run.docs.get(c, {}))}")
    lines.append("Log of successful calls, in order (call -> result):")
    results = [s["observation"] for s in run.steps if s["action_name"] is not None and s["error"] is None]
    for i, c in enumerate(calls):
        result = results[i] if i < len(results) else ""
        lines.append(f"{i + 1}. {c['name']}({json.dumps(c['arguments'])}) -> {str(result)[:200]}")
    return "\n".join(lines)


@register("abstractor", "llm")
class LLMAbstractor:
    """An OpenAI-compatible model writes the turns; its JSON is checked against a schema."""

    def __init__(self, cfg: RunConfig, policy: Any = None) -> None:
        from coevolve.explorers.llm import endpoint_policy
        from coevolve.policy.base import SamplingParams

        self.max_turns = cfg.abstract.max_turns
        self.policy = policy if policy is not None else endpoint_policy(cfg, cfg.abstract)
        self.sampling = SamplingParams(
            temperature=cfg.abstract.temperature, max_new_tokens=cfg.abstract.max_new_tokens, seed=cfg.seed
        )

    def abstract(self, runs: list[Run]) -> list[tuple[list[str], list[list[Call]]] | str]:
        out: list[Any] = [None] * len(runs)
        asked: list[int] = []
        conversations = []
        for i, run in enumerate(runs):
            calls = run.successful_calls()
            if not calls:
                out[i] = "useless run: no call succeeded"
                continue
            asked.append(i)
            system = LLM_SYSTEM.replace("{max_turns}", str(self.max_turns))
            conversations.append(
                [{"role": "system", "content": system}, {"role": "user", "content": log_prompt(run, calls)}]
            )
        if not asked:
            return out
        meta = [{"task_id": runs[i].seed.task_id, "sample_idx": runs[i].run_idx, "turn": 0, "step": 0} for i in asked]
        try:
            gens = self.policy.chat(conversations, [[] for _ in asked], self.sampling, meta)
            texts = [g.text for g in gens]
        except Exception as exc:  # the endpoint failed: these runs are rejected, the round goes on
            texts = [exc] * len(asked)
        for i, text in zip(asked, texts):
            if isinstance(text, Exception):
                out[i] = f"llm abstractor: endpoint error: {type(text).__name__}: {str(text)[:200]}"
                continue
            try:
                out[i] = check_spec(_json_object(text), runs[i].docs, self.max_turns)
            except (ValueError, RecursionError) as exc:
                out[i] = f"llm abstractor: malformed output: {exc}; output began {json.dumps(text[:120])}"
        return out


# ----------------------------------------------------------------------------- the stage
def load_runs(store: Store, cfg: RunConfig, run_id: str, round: int) -> list[Run]:
    """This round's exploration runs, grouped per (signal_id, run_idx), with their start tasks
    (pool tasks; in round 0 the synthesis states)."""
    rows = store.read("explorations", filter=(ds.field("run_id") == run_id) & (ds.field("round") == round)).to_pylist()
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["signal_id"], r["run_idx"]), []).append(r)
    pool = {r["task_id"]: Task.from_row(r) for r in store.pool_tasks().to_pylist()}
    env = resolve("environment", cfg.env.name)()
    if round == 0:  # round 0 explored training-scenario states, not pool tasks
        pool.update({t.task_id: t for t in synthesis_states(cfg, env)})
    docs_cache: dict[str, dict[str, dict[str, Any]]] = {}
    runs = []
    for (signal_id, run_idx), steps in sorted(groups.items()):
        steps.sort(key=lambda r: r["step"])
        seed = pool.get(steps[0]["context_task_id"])
        if seed is None:  # the pool moved on without it: nothing to start from
            continue
        seed = start_task(seed)
        if seed.task_id not in docs_cache:
            docs_cache[seed.task_id] = {d["name"]: d for d in env.function_docs(seed)}
        runs.append(Run(signal_id, steps[0]["signal_type"], run_idx, seed, steps, docs_cache[seed.task_id]))
    return runs


def candidate_row(run: Run, run_id: str, round: int, result: Task | str) -> dict[str, Any]:
    """A ``candidates`` row: pending with a spec, or rejected with the reason."""
    row = {
        "run_id": run_id,
        "candidate_id": f"{run_id}-r{round}-{run.signal_id}-{run.run_idx}",
        "signal_id": run.signal_id,
        "signal_type": run.signal_type,
        "context_task_id": run.seed.task_id,
        "source_run": run.run_idx,
    }
    if isinstance(result, Task):
        row.update(spec=result.to_json(), n_turns=len(result.turns), content_hash=result.content_hash)
    else:
        row.update(spec=json.dumps({"error": result}), n_turns=0, verdict="rejected", reason=result)
    return row


def abstract(store: Store, cfg: RunConfig, run_id: str, round: int) -> int:
    """Turn this round's explorations into ``candidates`` rows; return the row count."""
    runs = load_runs(store, cfg, run_id, round)
    abstractor = resolve("abstractor", cfg.abstract.abstractor)(cfg)
    rows = []
    for run, result in zip(runs, abstractor.abstract(runs)):
        if isinstance(result, tuple):
            turns, reference = result
            result = make_task(run, turns, reference, run_id, round)
        rows.append(candidate_row(run, run_id, round, result))
    return store.write("candidates", round, f"{run_id}-candidates", rows)


# registers the template abstractor, and keeps it importable from here
from coevolve.abstractors.template import TemplateAbstractor  # noqa: E402,F401
