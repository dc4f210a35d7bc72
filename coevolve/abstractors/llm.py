"""The ``llm`` abstractor: an OpenAI-compatible model writes the turns; its JSON is checked.

The model gets the run's successful calls (with their results) and the functions' own
descriptions, and answers ``{"turns": [{"instruction", "calls"}]}``; ``check_spec`` rejects
every other shape and every function the run's docs do not know. The start state is the
run's, never the model's.
"""

from __future__ import annotations

import json
from typing import Any

from coevolve.abstractors.base import Call, Run, describe
from coevolve.config import RunConfig
from coevolve.registry import register

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
