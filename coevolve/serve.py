"""A small OpenAI-compatible chat server over a local model: ``coevolve serve --model tiny --port 8000``.

It serves ``POST /v1/chat/completions`` (messages, optional tools, max_tokens, temperature,
top_p, seed; one choice), ``GET /v1/models`` and ``GET /health``, so the ``openai`` policy
backend, the LLM explorer and the LLM abstractor can be run and tested on loopback without
vLLM (which cannot be installed on CPU machines) and without ``transformers serve``'s extra
dependencies. Concurrent requests are batched continuously: a worker thread decodes up to
``max_batch`` of them together (``coevolve.policy.decoder.Decoder``); a new request joins at the
next token and each is answered as soon as it ends. Assistant messages the server generated
keep their own token ids when a conversation comes back (``LocalPolicy.encode_chat``).

A prompt longer than the model's context is rejected with HTTP 400 and code
``context_length_exceeded``, as OpenAI and vLLM do.
"""

from __future__ import annotations

import asyncio
import queue
import random
import threading
import time
import uuid
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from coevolve.policy.base import SamplingParams
from coevolve.policy.decoder import Decoder
from coevolve.policy.local import LocalPolicy


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


def _error(status: int, message: str, code: str = "invalid_request_error") -> Any:
    return JSONResponse(
        status_code=status, content={"error": {"message": message, "type": "invalid_request_error", "code": code}}
    )


def create_app(policy: LocalPolicy, *, model_name: str | None = None, max_batch: int = 8) -> Any:
    """The FastAPI application serving ``policy``; ``app.state.batcher`` does the generation."""
    batcher = Batcher(policy, max_batch=max_batch)

    @asynccontextmanager
    async def lifespan(_app: Any) -> Any:
        yield
        batcher.close()

    app = FastAPI(title="coevolve OpenAI-compatible server", lifespan=lifespan)
    app.state.batcher = batcher
    served = model_name or policy.version
    tok = policy.tokenizer

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": served, "object": "model", "owned_by": "coevolve"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        messages = body.get("messages") if isinstance(body, dict) else None
        if (
            not isinstance(messages, list)
            or not messages
            or not all(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content", ""), (str, type(None)))
                for m in messages
            )
        ):
            return _error(400, "'messages' must be a non-empty list of {role, content} objects")
        if int(body.get("n", 1)) != 1:
            return _error(400, "only n=1 is supported")
        tools = body.get("tools") or None
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 256)
        sampling = SamplingParams(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            max_new_tokens=max_tokens,
        )
        msgs = [{**m, "content": m.get("content") or ""} for m in messages]
        text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
        ids = policy.encode_chat(text, [m["content"] for m in msgs if m["role"] == "assistant"])
        if len(ids) + max_tokens > policy.max_context_tokens:
            return _error(
                400,
                f"This model's maximum context length is {policy.max_context_tokens} tokens; the "
                f"prompt has {len(ids)} tokens and max_tokens is {max_tokens}.",
                "context_length_exceeded",
            )
        seed = body.get("seed")
        seed = int(seed) if seed is not None else random.getrandbits(31)
        out_ids, finish = await asyncio.wrap_future(batcher.submit(ids, sampling, seed))
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": served,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": policy.answer_text(out_ids)},
                    "finish_reason": finish,
                }
            ],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(out_ids),
                "total_tokens": len(ids) + len(out_ids),
            },
        }

    return app
