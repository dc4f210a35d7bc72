"""The ``llm`` explorer: any OpenAI-compatible chat endpoint drives the exploration.

The model sees the tool schemas, the signal's context (why this start state, which tools,
the failed attempt) and every observation so far — never the context task's instruction or
reference calls (see ``coevolve.explore``), and answers each step with one Hermes
``<tool_call>`` block. All runs of all contexts are sent to the endpoint together, one
step at a time, so a server that batches (vLLM) serves them at once.

A reply without a parseable call is a failed step with the parse error as its reason (the
model is told how to write a call and tries again at the next step); an endpoint failure
is a failed step too. Nothing the model writes is executed except through the
environment's whitelisted dispatch.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from coevolve.config import RunConfig
from coevolve.types import ToolCall
from coevolve.explorers.base import Session
from coevolve.registry import register

# coevolve.policy is imported where it is used: it loads torch, which the rule and random
# explorers never need.

SYSTEM = (
    "You explore a software environment through its functions, to find behaviour worth "
    "practising. Make exactly one function call per reply, in a <tool_call> block, and read "
    "each result before the next call: reuse the names, ids and values you observed, and when "
    "a call fails, fix its arguments or try another function."
)

WHY = {
    "forgetting": "The agent used to solve a task from this start state and now fails it.",
    "boundary": "The agent solves a task from this start state only some of the time.",
    "rare": "The agent rarely uses the action pattern {pattern}; practise it.",
    "uncertainty": "The agent hesitates over its calls from this start state and its outcomes vary; practise them.",
    "reward_hacking": "The agent earns partial reward from this start state without completing the task; complete it.",
    "fallback": "Cover the environment: make each of the functions below succeed at least once.",
    "static": "Cover the environment: make each of the functions below succeed at least once.",
}


def endpoint_policy(cfg: RunConfig, section: Any) -> Any:
    """An ``openai`` policy for the endpoint of ``section`` (``cfg.explore`` or ``cfg.abstract``)."""
    from coevolve.policy import load_policy

    pcfg = dataclasses.replace(
        cfg.policy,
        backend="openai",
        base_url=section.base_url,
        model=section.model or cfg.policy.model,
        api_key_env=section.api_key_env,
        timeout_s=section.timeout_s,
        max_new_tokens=section.max_new_tokens,
    )
    return load_policy(pcfg, pcfg.model)


def _brief_step(i: int, step: dict[str, Any]) -> str:
    outcome = step.get("error") or step.get("parse_error") or (step.get("observation") or "")
    return f"{i}. {step.get('action_name')}({step.get('action_args') or '{}'}) -> {str(outcome)[:160]}"


def context_prompt(s: Session) -> str:
    """The first user message of a run: why, where, which tools, the evidence, the budget."""
    c = s.context
    lines = []
    if c.signal_type in WHY:
        lines.append(WHY[c.signal_type].format(pattern=" then ".join(c.focus)))
    if c.focus:
        order = "in this order, one after another" if c.sequence else "above all"
        lines.append(f"Explore these functions {order}: {', '.join(c.focus)}.")
    if c.evidence:
        lines.append("A failed attempt:\n" + "\n".join(_brief_step(i + 1, e) for i, e in enumerate(c.evidence[:8])))
    if c.avoid:
        lines.append(f"Never call: {', '.join(sorted(c.avoid))}.")
    lines.append(f"You have {s.budget} calls. Start now.")
    return "\n".join(lines)


@register("explorer", "llm")
class LLMExplorer:
    signal_guided = True

    def __init__(self, cfg: RunConfig, policy: Any = None) -> None:
        self.cfg = cfg
        from coevolve.policy.base import SamplingParams

        self.policy = policy if policy is not None else endpoint_policy(cfg, cfg.explore)
        self.sampling = SamplingParams(
            temperature=cfg.explore.temperature, top_p=1.0, max_new_tokens=cfg.explore.max_new_tokens, seed=cfg.seed
        )

    def _messages(self, s: Session) -> list[dict[str, Any]]:
        from coevolve.policy.parsing import FORMAT_HINT

        msgs = s.memory.setdefault(
            "messages", [{"role": "system", "content": SYSTEM}, {"role": "user", "content": context_prompt(s)}]
        )
        if s.history and s.memory.get("answered", 0) < len(s.history):
            last = s.history[-1]
            if last.name is None:
                msgs.append({"role": "user", "content": f"{last.error} {FORMAT_HINT}"})
            else:
                msgs.append({"role": "tool", "content": last.observation})
            s.memory["answered"] = len(s.history)
        return msgs

    def propose(self, sessions: list[Session]) -> list[ToolCall | str]:
        from coevolve.policy.parsing import parse_tool_calls

        conversations = [self._messages(s) for s in sessions]
        tools = [[t for t in s.episode.tools(0) if t.get("name") not in s.context.avoid] for s in sessions]
        meta = [
            {"task_id": s.context.task.task_id, "sample_idx": s.run_idx, "turn": 0, "step": len(s.history)}
            for s in sessions
        ]
        try:
            gens = self.policy.chat(conversations, tools, self.sampling, meta)
        except Exception as exc:  # the endpoint failed: every run loses this step, the round goes on
            return [f"explorer LLM error: {type(exc).__name__}: {str(exc)[:200]}"] * len(sessions)
        out: list[ToolCall | str] = []
        for s, conv, gen in zip(sessions, conversations, gens):
            conv.append({"role": "assistant", "content": gen.text})
            parsed = parse_tool_calls(gen.text)
            if parsed.error:
                out.append(f"no valid tool call: {parsed.error}")
            elif not parsed.calls:
                out.append("no tool call in the reply: " + json.dumps(gen.text[:160]))
            elif parsed.calls[0].name in s.context.avoid:  # the safety policy holds for LLMs too
                out.append(f"blocked call: {parsed.calls[0].name} is not allowed in exploration")
            else:
                out.append(parsed.calls[0])
        return out
