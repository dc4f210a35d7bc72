"""The ``openai`` policy backend: any OpenAI-compatible chat endpoint (vLLM, hosted APIs,
``coevolve serve`` on loopback in tests).

Conversations are sent as wire messages (``coevolve.policy.prompts.to_wire``): the tool block
is rendered into the system message and tool results travel as ``<tool_response>`` user
messages, so the endpoint needs no tool parser and the model sees the same prompt as with
the local backend. Replies with native ``tool_calls`` are turned back into Hermes text, so
the rollout engine parses every backend's output the same way.

Requests run in parallel up to ``cfg.concurrency`` (``stream`` hands each reply back as it
arrives, so the rollout engine never waits for a batch's slowest request); connection errors, timeouts, 429 and 5xx
are retried with exponential backoff; a context-length rejection becomes a generation with
``finish_reason="context_limit"`` instead of an exception.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Hashable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import httpx

from coevolve.config import PolicyConfig
from coevolve.policy.base import Generation, Message, Request, SamplingParams, StreamingPolicy, row_seed
from coevolve.policy.prompts import TokenCounter, fit_budget, to_wire

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
_FINISH = {"stop": "stop", "tool_calls": "stop", "length": "length"}


class EndpointError(RuntimeError):
    """The endpoint refused a request, or kept failing after every retry."""


def _hermes(tool_calls: list[dict[str, Any]]) -> str:
    """Native OpenAI tool calls -> Hermes ``<tool_call>`` blocks (arguments arrive as JSON text)."""
    blocks = []
    for tc in tool_calls:
        fn = tc.get("function") or {}
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass  # left as a string: the parser reports it as a malformed call
        blocks.append("<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args}) + "\n</tool_call>")
    return "\n".join(blocks)


class OpenAIPolicy(StreamingPolicy):
    """Policy over an OpenAI-compatible ``/v1/chat/completions`` endpoint."""

    name = "openai"

    def __init__(
        self,
        cfg: PolicyConfig,
        checkpoint: str | None = None,
        *,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ):
        if not cfg.base_url:
            raise ValueError("policy.base_url is required for backend 'openai' (e.g. http://127.0.0.1:8000/v1)")
        self.cfg = cfg
        self.model_id = checkpoint or cfg.model
        self.version = self.model_id
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        key = os.environ.get(cfg.api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            base_url=cfg.base_url.rstrip("/"),
            headers=headers,
            timeout=cfg.timeout_s,
            limits=httpx.Limits(max_connections=max(1, cfg.concurrency)),
            transport=transport,
        )
        self._counter = TokenCounter.estimate()
        self._url = cfg.base_url.rstrip("/") + "/chat/completions"

    def close(self) -> None:
        self._client.close()

    def stream(self, sampling: SamplingParams) -> "EndpointStream":
        """A ``GenerationStream`` of concurrent requests, each collected as soon as it returns
        (``chat``, from ``StreamingPolicy``, sends ``cfg.concurrency`` requests at a time)."""
        return EndpointStream(self, sampling)

    def _one(
        self, messages: list[Message], tools: list[dict[str, Any]], seed: int, sampling: SamplingParams
    ) -> Generation:
        budget = max(16, self.cfg.max_context_tokens - sampling.max_new_tokens)
        msgs, _ = fit_budget(messages, tools, tool_format=self.cfg.tool_format, budget=budget, counter=self._counter)
        body = {
            "model": self.model_id,
            "messages": to_wire(msgs, tools, self.cfg.tool_format),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": seed,
        }
        resp = self._post(body)
        if resp is None:
            return Generation(text="", prompt_tokens=0, completion_tokens=0, finish_reason="context_limit")
        choice = resp["choices"][0]
        message = choice.get("message") or {}
        text = message.get("content") or ""
        if message.get("tool_calls"):
            text = (text + "\n" if text else "") + _hermes(message["tool_calls"])
        usage = resp.get("usage") or {}
        return Generation(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=_FINISH.get(choice.get("finish_reason") or "stop", "stop"),
        )

    def _post(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST with retries; None when the endpoint rejects the prompt as too long."""
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1) * (1 + random.random() / 2))
            try:
                r = self._client.post("/chat/completions", json=body)
            except httpx.TransportError as exc:  # connect errors, timeouts, dropped connections
                last = f"{type(exc).__name__}: {exc}"
                continue
            if r.status_code == 200:
                return r.json()
            if r.status_code in _RETRY_STATUS:
                last = f"HTTP {r.status_code}: {r.text[:200]}"
                continue
            if r.status_code == 400 and "context" in r.text.lower():
                return None
            raise EndpointError(f"{self._url} refused the request: HTTP {r.status_code} {r.text[:300]}")
        raise EndpointError(f"{self._url} failed after {self.max_retries + 1} attempts; last: {last}")


class EndpointStream:
    """``GenerationStream`` of an ``OpenAIPolicy``: up to ``cfg.concurrency`` requests in flight."""

    def __init__(self, policy: OpenAIPolicy, sampling: SamplingParams):
        self.policy, self.sampling = policy, sampling
        self._pool = ThreadPoolExecutor(max_workers=max(1, policy.cfg.concurrency))
        self._futures: dict[Future, Hashable] = {}

    def submit(self, requests: list[Request]) -> None:
        for i, req in enumerate(requests):
            seed = row_seed(self.sampling.seed, req.meta, i)
            fut = self._pool.submit(self.policy._one, req.messages, req.tools, seed, self.sampling)
            self._futures[fut] = req.key

    def collect(self) -> list[tuple[Hashable, Generation]]:
        """Replies that have arrived (at least one); an endpoint failure is raised here."""
        if not self._futures:
            return []
        done, _ = wait(self._futures, return_when=FIRST_COMPLETED)
        return [(self._futures.pop(fut), fut.result()) for fut in done]

    def __len__(self) -> int:
        return len(self._futures)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._futures.clear()
