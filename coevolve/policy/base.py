"""The policy interface: one ``chat`` call generates the next assistant message for many
conversations at once (the rollout engine batches all episodes waiting for the model).

Backends: ``local`` (transformers, batched, KV cache) and ``openai`` (any OpenAI-compatible
chat endpoint: vLLM at scale, hosted APIs, or coevolve's loopback server in tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

Message = dict[str, Any]  # {"role": "system"|"user"|"assistant"|"tool", "content": str, ...}


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None


@dataclass
class Generation:
    text: str  # raw assistant text (may contain <tool_call> blocks)
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"  # stop | length | context_limit


class Policy(Protocol):
    name: str
    version: str  # recorded as rollouts.policy_version (a checkpoint path or model id)

    def chat(
        self,
        conversations: list[list[Message]],
        tools: list[list[dict[str, Any]]],
        sampling: SamplingParams,
        meta: list[dict[str, Any]] | None = None,
    ) -> list[Generation]:
        """Next assistant message for each conversation.

        ``tools[i]`` are the function schemas available to conversation ``i``; ``meta[i]``
        says where it stands (``task_id``, ``sample_idx``, ``turn``, ``step``) for policies
        that need it (ground-truth replay) and for logging; model policies ignore it.
        """
        ...
