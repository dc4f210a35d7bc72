"""A small OpenAI-compatible chat server over a local model: ``coevolve serve --model tiny --port 8000``.

It serves ``POST /v1/chat/completions`` (messages, optional tools, max_tokens, temperature,
top_p, seed; one choice), ``GET /v1/models`` and ``GET /health``, so the ``openai`` policy
backend, the LLM explorer and the LLM abstractor can be run and tested on loopback without
vLLM (which cannot be installed on CPU machines) and without ``transformers serve``'s extra
dependencies. Concurrent requests are batched continuously: a worker thread decodes up to
``max_batch`` of them together (``coevolve.policy.decoder.Decoder``); a new request joins at the
next token and each is answered as soon as it ends. Assistant messages the server generated
keep their own token ids when a conversation comes back (``LocalPolicy.encode_chat``).

What it refuses, and how (issue 29):

- **No key, no answer.** With ``api_key`` set (``coevolve serve --api-key`` or
  ``COEVOLVE_SERVE_API_KEY``) every path but ``/health`` needs ``Authorization: Bearer <key>``,
  as vLLM's ``--api-key`` does; anything else is HTTP 401 before the body is read.
- **Bodies are bounded before they are parsed**: a ``Content-Length`` over ``max_body_bytes``
  is HTTP 413 without reading the body; a chunked body is counted as it arrives and cut at the
  limit with the same 413.
- **Every field is validated** by the pydantic models below (strict types: ``"5"`` is not an
  integer): a malformed field is HTTP 400 naming the field and what it should be. ``max_tokens``
  is 1..``max_tokens_limit``, ``n`` is 1, ``temperature`` 0..2 and ``top_p`` in (0, 1], finite.
- **A prompt longer than the model's context** is HTTP 400 with code ``context_length_exceeded``,
  as OpenAI and vLLM do.
- **The event loop never tokenizes**: the chat template, tokenization and decoding run on one
  tokenizer thread (one, so the tokenizer and its answer cache are never used concurrently) and
  generation on the batcher's thread, so ``/health`` answers while a large prompt is processed.
"""

from __future__ import annotations

import asyncio
import queue
import random
import secrets
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from starlette.exceptions import HTTPException

from coevolve.policy.base import SamplingParams
from coevolve.policy.decoder import Decoder
from coevolve.policy.local import LocalPolicy

API_KEY_ENV = "COEVOLVE_SERVE_API_KEY"
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: ~250k tokens of text, far past any context served here
DEFAULT_MAX_TOKENS = 256  # a request that names no max_tokens
OPEN_PATHS = frozenset({"/health"})  # answered without the key (liveness probes carry none)


# --------------------------------------------------------------------------- request models
class FunctionSpec(BaseModel):
    """``tools[i].function``: a name and a JSON schema of its parameters (other keys kept)."""

    model_config = ConfigDict(extra="allow")
    name: StrictStr = Field(min_length=1)
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionSpec


class ChatMessage(BaseModel):
    """One message; unknown keys are dropped before the chat template sees them."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr | None = None
    name: StrictStr | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: StrictStr | None = None


class ChatRequest(BaseModel):
    """The fields of ``POST /v1/chat/completions`` this server reads; others are ignored, as
    vLLM does. Bounds that depend on the server (``max_tokens_limit``) are checked in the route."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    n: StrictInt = Field(1, ge=1, le=1, description="only one choice per request")
    # strict and finite: 1 and 1.0 pass; "1", true, NaN and Infinity do not
    temperature: float = Field(1.0, ge=0.0, le=2.0, strict=True, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, strict=True, allow_inf_nan=False)
    seed: StrictInt | None = Field(None, ge=-(2**63), le=2**64 - 1)  # torch.Generator's range
    stream: StrictBool = False


@dataclass
class _Request:
    ids: list[int]
    sampling: SamplingParams
    seed: int
    future: Future


class Batcher:
    """Generates requests on one worker thread with continuous batching: a request joins the
    running batch of its sampling parameters at the next decoding step, and is answered the
    moment its own generation ends."""

    def __init__(self, policy: LocalPolicy, max_batch: int = 8):
        self.policy, self.max_batch = policy, max_batch
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="coevolve-serve-batcher", daemon=True)
        self._thread.start()

    def submit(self, ids: list[int], sampling: SamplingParams, seed: int) -> Future:
        fut: Future = Future()
        self._queue.put(_Request(ids, sampling, seed, fut))
        return fut

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        decoders: dict[tuple, Decoder] = {}  # one running batch per set of sampling parameters
        waiting: list[_Request] = []  # received, not yet in a batch (the batches are full)
        while True:
            busy = any(decoders.values())
            try:  # block only while there is nothing to decode
                item = self._queue.get(block=not busy and not waiting)
                while True:
                    if item is None:  # closing: nothing in flight is left waiting forever
                        stop = RuntimeError("the server is shutting down")
                        for future in [row.key for d in decoders.values() for row in d.rows] + [
                            r.future for r in waiting
                        ]:
                            future.set_exception(stop)
                        return
                    waiting.append(item)
                    item = self._queue.get_nowait()
            except queue.Empty:
                pass
            joining: dict[tuple, list[_Request]] = {}
            later = []
            for req in waiting:
                s = req.sampling
                key = (s.temperature, s.top_p, s.max_new_tokens)
                if len(decoders.get(key) or ()) + len(joining.get(key, [])) < self.max_batch:
                    joining.setdefault(key, []).append(req)
                else:
                    later.append(req)
            waiting = later
            for key, reqs in joining.items():
                decoder = decoders.setdefault(key, Decoder(self.policy, reqs[0].sampling))
                if not self._run(decoder, lambda: decoder.add([(r.future, r.ids, r.seed) for r in reqs]), reqs):
                    decoders.pop(key)
            for key, decoder in list(decoders.items()):
                if not self._run(decoder, decoder.step, []):
                    decoders.pop(key)

    @staticmethod
    def _run(decoder: Decoder, work: Any, joining: list[_Request]) -> bool:
        """Run ``work`` (a join or a step) and answer the requests it finished. On failure the
        error goes to every request of the batch, and False says to drop the batch (the server
        keeps serving)."""
        try:
            for future, ids, finish in work() or []:
                future.set_result((ids, finish))
            return True
        except Exception as exc:
            for future in {row.key for row in decoder.rows} | {r.future for r in joining}:
                if not future.done():
                    future.set_exception(exc)
            return False


def _error(status: int, message: str, code: str = "invalid_request_error", **headers: str) -> Any:
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    return JSONResponse(
        status_code=status,
        content={"error": {"message": message, "type": kind, "code": code}},
        headers=headers or None,
    )


def _field_errors(exc: RequestValidationError) -> str:
    """Pydantic's errors as one line: ``max_tokens: Input should be a valid integer (got '5')``."""
    parts = []
    for err in exc.errors()[:5]:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where = ".".join(loc) if loc else "body"
        got = err.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r:.40})"
        if err.get("type") == "json_invalid":
            return "the body is not valid JSON: " + str(err.get("ctx", {}).get("error", err.get("msg")))
        parts.append(f"{where}: {err.get('msg')}{shown}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


class Gate:
    """ASGI middleware in front of every route: the API key, then the body's size, both before
    a byte of the body is parsed (FastAPI reads and validates the body before dependencies run,
    so neither check can be a dependency)."""

    def __init__(self, app: Any, *, api_key: str | None, max_body_bytes: int):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.api_key and scope.get("path") not in OPEN_PATHS:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(given.strip().encode(), self.api_key.encode()):
                response = _error(
                    401,
                    "a valid API key is required: send 'Authorization: Bearer <key>' (the key given to "
                    f"coevolve serve --api-key or {API_KEY_ENV})",
                    "invalid_api_key",
                    **{"WWW-Authenticate": "Bearer"},
                )
                await response(scope, receive, send)
                return
        limit = self.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _error(413, f"the body is {declared} bytes; this server accepts at most {limit}", "body_too_large")(
                scope, receive, send
            )
            return
        seen = 0

        async def counted() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # a chunked body, counted as it arrives
                    raise HTTPException(413, f"the body is over {limit} bytes, the most this server accepts")
            return message

        await self.app(scope, counted, send)


def create_app(
    policy: LocalPolicy,
    *,
    model_name: str | None = None,
    max_batch: int = 8,
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_tokens_limit: int | None = None,
) -> Any:
    """The FastAPI application serving ``policy``; ``app.state.batcher`` does the generation.

    ``api_key``: required as a Bearer token on every path but ``/health`` (None: open, for
    loopback). ``max_body_bytes``: larger bodies are HTTP 413. ``max_tokens_limit``: the largest
    ``max_tokens`` a request may ask for (default: the model's context)."""
    if max_body_bytes < 1:
        raise ValueError(f"max_body_bytes must be at least 1, not {max_body_bytes}")
    limit = max_tokens_limit or policy.max_context_tokens
    if limit < 1:
        raise ValueError(f"max_tokens_limit must be at least 1, not {limit}")
    batcher = Batcher(policy, max_batch=max_batch)
    # one thread for all tokenizer work: off the event loop, and never two calls at once
    tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="coevolve-serve-tokenizer")

    @asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        yield
        batcher.close()
        tokenizing.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="coevolve OpenAI-compatible server", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.add_middleware(Gate, api_key=api_key or None, max_body_bytes=max_body_bytes)
    app.state.batcher = batcher
    served = model_name or policy.version
    tok = policy.tokenizer

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Any, exc: RequestValidationError) -> Any:
        return _error(400, _field_errors(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_request: Any, exc: HTTPException) -> Any:
        code = {413: "body_too_large", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "error")
        return _error(exc.status_code, str(exc.detail), code)

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served, "object": "model", "owned_by": "coevolve"}]}

    def encode(req: ChatRequest) -> list[int]:
        """On the tokenizer thread: the chat template and the prompt's token ids."""
        msgs = [{**m.model_dump(exclude_none=True), "content": m.content or ""} for m in req.messages]
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
        return policy.encode_chat(text, [m["content"] for m in msgs if m["role"] == "assistant"])

    async def on_tokenizer(fn: Any, *args: Any) -> Any:
        return await asyncio.wrap_future(tokenizing.submit(fn, *args))

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest) -> Any:
        if req.stream:
            return _error(400, "stream: streaming is not supported by coevolve serve; send stream=false")
        max_tokens = req.max_tokens or req.max_completion_tokens or min(DEFAULT_MAX_TOKENS, limit)
        if max_tokens > limit:
            return _error(400, f"max_tokens: {max_tokens} is more than this server allows ({limit})")
        try:  # a chat template may refuse a conversation (roles out of order, ...): the client's fault
            ids = await on_tokenizer(encode, req)
        except (TemplateError, ValueError, TypeError) as exc:
            return _error(400, f"messages: the chat template refused them: {type(exc).__name__}: {str(exc)[:200]}")
        if len(ids) + max_tokens > policy.max_context_tokens:
            return _error(
                400,
                f"This model's maximum context length is {policy.max_context_tokens} tokens; the "
                f"prompt has {len(ids)} tokens and max_tokens is {max_tokens}.",
                "context_length_exceeded",
            )
        sampling = SamplingParams(temperature=req.temperature, top_p=req.top_p, max_new_tokens=max_tokens)
        seed = req.seed if req.seed is not None else random.getrandbits(31)
        out_ids, finish = await asyncio.wrap_future(batcher.submit(ids, sampling, seed))
        text = await on_tokenizer(policy.answer_text, out_ids)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": served,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(out_ids),
                "total_tokens": len(ids) + len(out_ids),
            },
        }

    return app
