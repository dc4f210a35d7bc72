"""The policy interface: one ``chat`` call generates the next assistant message for many
conversations at once; a ``GenerationStream`` lets conversations join and leave while others
are still generating (what the rollout engine uses: an episode whose message is done acts in
its environment and asks again without waiting for the rest of the batch).

Backends: ``local`` (transformers, token-level continuous batching, KV cache) and ``openai``
(any OpenAI-compatible chat endpoint: vLLM at scale, hosted APIs, or coevolve's loopback
server in tests; requests run concurrently), both ``StreamingPolicy``: their ``chat`` goes
through their stream. A policy with only ``chat`` gets a stream through ``ChatStream``, which
generates everything submitted in one ``chat`` call.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Hashable
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
    """One assistant message. Backends that sample token by token also return what the trainer
    optimizes (``coevolve.train.sequences.episode_sequences``): the exact prompt ids, the
    sampled ids (the stop token included when the model sampled one; a message cut by the
    budget ends where it was cut) and each sampled token's behaviour log-probability, in
    float32, under the temperature-scaled distribution ``log_softmax(logits / temperature)``
    (``temperature`` 0 records ``log_softmax(logits)``). top-p truncation is not renormalized
    into it, so a trainer scoring ``logits / temperature`` gets ratio 1 at step 0."""

    text: str  # raw assistant text (may contain <tool_call> blocks)
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"  # stop | length | context_limit
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None


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


@dataclass
class Request:
    """One conversation waiting for its next assistant message."""

    key: Hashable  # returned with the generation
    messages: list[Message]
    tools: list[dict[str, Any]]
    meta: dict[str, Any] | None = None  # as in ``Policy.chat``; seeds the row's sampling


class GenerationStream(Protocol):
    """Requests submitted at any time; generations collected as they finish."""

    def submit(self, requests: list[Request]) -> None: ...

    def collect(self) -> list[tuple[Hashable, Generation]]:
        """Block until at least one submitted request is done; return every done one."""
        ...

    def __len__(self) -> int:
        """Requests submitted and not yet collected."""
        ...

    def close(self) -> None: ...


class ChatStream:
    """A ``GenerationStream`` over ``Policy.chat``: everything pending is generated in one call."""

    def __init__(self, policy: Policy, sampling: SamplingParams):
        self.policy, self.sampling = policy, sampling
        self._pending: list[Request] = []

    def submit(self, requests: list[Request]) -> None:
        self._pending += requests

    def collect(self) -> list[tuple[Hashable, Generation]]:
        reqs, self._pending = self._pending, []
        if not reqs:
            return []
        gens = self.policy.chat(
            [r.messages for r in reqs], [r.tools for r in reqs], self.sampling, [r.meta for r in reqs]
        )
        if len(gens) != len(reqs):
            raise RuntimeError(
                f"{type(self.policy).__name__}.chat returned {len(gens)} generations for {len(reqs)} conversations"
            )
        return [(r.key, g) for r, g in zip(reqs, gens)]

    def __len__(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        self._pending = []


class StreamingPolicy:
    """Base of the policies whose ``chat`` is their ``stream`` (``local``, ``openai``): a subclass
    implements ``stream`` and gets ``chat`` (every conversation submitted, all collected in order)."""

    name: str
    version: str

    def stream(self, sampling: SamplingParams) -> GenerationStream:
        raise NotImplementedError

    def chat(
        self,
        conversations: list[list[Message]],
        tools: list[list[dict[str, Any]]],
        sampling: SamplingParams,
        meta: list[dict[str, Any]] | None = None,
    ) -> list[Generation]:
        """Next assistant message for each conversation (see ``Policy.chat``), through ``stream``."""
        return chat_through(self.stream(sampling), conversations, tools, meta)


def chat_through(
    stream: GenerationStream,
    conversations: list[list[Message]],
    tools: list[list[dict[str, Any]]],
    meta: list[dict[str, Any]] | None = None,
) -> list[Generation]:
    """``Policy.chat`` on top of a stream: submit every conversation, collect all, in order."""
    try:
        stream.submit(
            [Request(i, conv, tl, meta[i] if meta else None) for i, (conv, tl) in enumerate(zip(conversations, tools))]
        )
        out: dict[Hashable, Generation] = {}
        while stream:
            out.update(stream.collect())
        return [out[i] for i in range(len(conversations))]
    finally:
        stream.close()


def open_stream(policy: Policy, sampling: SamplingParams) -> GenerationStream:
    """The policy's own stream (``policy.stream(sampling)``) where it has one, else a ``ChatStream``."""
    stream = getattr(policy, "stream", None)
    return stream(sampling) if callable(stream) else ChatStream(policy, sampling)


def row_seed(seed: int | None, meta: dict[str, Any] | None, index: int) -> int:
    """Seed of one conversation's generation: a hash of the call's seed and where the
    conversation stands (``meta``: task, sample, turn, step; else its index in the call).

    31 bits, what OpenAI-compatible endpoints accept, so every backend draws the same seeds;
    a random seed when ``seed`` is None.
    """
    if seed is None:
        return random.getrandbits(31)
    where = json.dumps(meta, sort_keys=True, default=str) if meta else str(index)
    return int.from_bytes(hashlib.sha256(f"{seed}|{where}".encode()).digest()[:4], "little") >> 1
