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

Each attempt has a *total* deadline of ``cfg.timeout_s``, from connecting to the reply's last
byte: httpx's timeouts bound each read, so a server that trickles a byte at a time could hold a
request forever; here every socket operation is given only what is left of the deadline
(``_DeadlineBackend``). A reply is read as a stream and refused once it passes
``max_reply_bytes`` (a ``Content-Length`` over it is refused before the body is read), so a
hostile or broken endpoint cannot fill memory. The API key travels only to ``cfg.base_url``:
it is added to each request the client sends there, and redirects are never followed. The
environment's proxy settings are honoured as httpx's default transport would.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from collections.abc import Hashable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import httpcore
import httpx

from coevolve.config import PolicyConfig
from coevolve.policy.base import Generation, Message, Request, SamplingParams, StreamingPolicy, row_seed
from coevolve.policy.prompts import TokenCounter, fit_budget, to_wire

_RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
_FINISH = {"stop": "stop", "tool_calls": "stop", "length": "length"}
MAX_REPLY_BYTES = 8 << 20  # a chat completion is kilobytes; 8 MiB leaves room for any sane reply
_DEADLINE = threading.local()  # .at / .total of the attempt running on this thread (httpx is sync)


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


def _left(timeout: float | None, late: type[Exception], slack: float = 0.0) -> float | None:
    """``timeout`` cut to what is left of this thread's deadline; ``late`` raised once it passed
    (or is within ``slack`` seconds: a socket timed out on the deadline's remainder)."""
    at = getattr(_DEADLINE, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= slack:
        raise late(f"the request's total deadline of {_DEADLINE.total:g} s passed (policy.timeout_s)")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the running attempt's deadline."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))
        except httpcore.ReadTimeout:
            _left(None, httpcore.ReadTimeout, slack=0.05)  # the deadline, not the read timeout: say so
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))
        except httpcore.WriteTimeout:
            _left(None, httpcore.WriteTimeout, slack=0.05)
            raise

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _DeadlineStream(
            self._inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout))
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sync sockets, each operation bounded by the running attempt's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(
            host, port, _left(timeout, httpcore.ConnectTimeout), local_address, socket_options
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(
            self._inner.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options)
        )

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _env_proxy(base_url: str) -> str | None:
    """The proxy the environment names for ``base_url`` (``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY``,
    minus ``NO_PROXY``), as httpx would use it had it been given no transport of ours."""
    import urllib.request
    from urllib.parse import urlsplit

    url = urlsplit(base_url)
    if not url.hostname or urllib.request.proxy_bypass(url.hostname):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(url.scheme) or proxies.get("all") or None


def _deadline_transport(base_url: str, limits: httpx.Limits) -> httpx.HTTPTransport:
    """httpx's transport (through the environment's proxy, if any) whose sockets are
    ``_DeadlineBackend``'s. httpx takes no network backend as an argument, so the one of its
    httpcore pool is swapped; an httpcore without one is an error here, not a silent per-read
    timeout."""
    transport = httpx.HTTPTransport(limits=limits, proxy=_env_proxy(base_url))
    pool = transport._pool
    if not hasattr(pool, "_network_backend"):
        raise RuntimeError(
            f"httpcore {httpcore.__version__} has no pluggable network backend: the OpenAI client's total "
            "deadline cannot be enforced; install httpcore 1.x (the version httpx 0.27/0.28 require)"
        )
    pool._network_backend = _DeadlineBackend()
    return transport


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
        max_reply_bytes: int = MAX_REPLY_BYTES,
        transport: httpx.BaseTransport | None = None,
    ):
        """``max_retries`` more attempts after a transport error, 408/409/425/429 or 5xx, each
        with its own ``cfg.timeout_s`` deadline; ``max_reply_bytes``: longer replies are refused;
        ``transport``: tests pass ``httpx.MockTransport`` (no deadline applies to it)."""
        if not cfg.base_url:
            raise ValueError("policy.base_url is required for backend 'openai' (e.g. http://127.0.0.1:8000/v1)")
        self.cfg = cfg
        self.model_id = checkpoint or cfg.model
        self.version = self.model_id
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        if not 0 < cfg.timeout_s < math.inf:  # NaN fails too
            raise ValueError(f"policy.timeout_s must be a positive number of seconds, not {cfg.timeout_s}")
        if max_reply_bytes < 1:
            raise ValueError(f"max_reply_bytes must be at least 1, not {max_reply_bytes}")
        self.max_reply_bytes = max_reply_bytes
        key = os.environ.get(cfg.api_key_env, "")
        # sent with each request to base_url only (never a client default a redirect could carry)
        self._headers = {"Accept-Encoding": "identity", **({"Authorization": f"Bearer {key}"} if key else {})}
        limits = httpx.Limits(max_connections=max(1, cfg.concurrency))
        self._client = httpx.Client(
            base_url=cfg.base_url.rstrip("/"),
            timeout=cfg.timeout_s,
            limits=limits,
            transport=transport or _deadline_transport(cfg.base_url, limits),
            follow_redirects=False,
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
                status, content = self._attempt(body)
            except httpx.TransportError as exc:  # connect errors, timeouts, dropped connections
                last = f"{type(exc).__name__}: {exc}"
                continue
            text = content[:300].decode("utf-8", "replace")
            if status == 200:
                try:
                    reply = json.loads(content)
                    reply["choices"][0]
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    raise EndpointError(
                        f"{self._url} sent a reply that is not a chat completion ({exc!r}): {text[:200]}"
                    ) from exc
                return reply
            if status in _RETRY_STATUS:
                last = f"HTTP {status}: {text[:200]}"
                continue
            if status == 400 and "context" in text.lower():
                return None
            raise EndpointError(f"{self._url} refused the request: HTTP {status} {text}")
        tries = self.max_retries + 1
        raise EndpointError(f"{self._url} failed after {tries} attempt{'s' if tries > 1 else ''}; last: {last}")

    def _attempt(self, body: dict[str, Any]) -> tuple[int, bytes]:
        """One POST within ``cfg.timeout_s`` in all: its status and at most ``max_reply_bytes``
        of reply (a longer reply is an ``EndpointError``, never retried)."""
        cap = self.max_reply_bytes
        _DEADLINE.at, _DEADLINE.total = time.monotonic() + self.cfg.timeout_s, self.cfg.timeout_s
        try:
            with self._client.stream("POST", "/chat/completions", json=body, headers=self._headers) as r:
                declared = r.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > cap:
                    raise EndpointError(self._too_long(f"announced a reply of {declared} bytes"))
                chunks, size = [], 0
                for chunk in r.iter_bytes():
                    size += len(chunk)
                    if size > cap:
                        raise EndpointError(self._too_long(f"sent more than {cap} bytes"))
                    chunks.append(chunk)
                return r.status_code, b"".join(chunks)
        finally:
            _DEADLINE.at = None

    def _too_long(self, what: str) -> str:
        return (
            f"{self._url} {what}; replies are capped at {self.max_reply_bytes} bytes "
            "(OpenAIPolicy(max_reply_bytes=...)): is policy.base_url a chat-completions endpoint?"
        )


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
