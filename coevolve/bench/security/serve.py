"""Security probes: serve — ``coevolve serve`` and the OpenAI-compatible client (issue 29, item 5).

The server probes run ``coevolve.serve.create_app`` over the tiny model under uvicorn on a free
loopback port (the full form also starts the real ``coevolve serve`` command); the client probes
point ``OpenAIPolicy`` at small hostile servers on loopback (``raw_server``) that trickle bytes,
send a 200 MB reply or redirect to a server that collects keys. An attempt is held when the
request is refused the way it should be: 401 / 400 / 413 with a reason, the client's error within
its deadline, a reply refused with memory bounded, a key that never leaves ``base_url``.

The helpers (``served``, ``raw_server`` and the handlers) are shared with tests/test_serve_security.py
and tests/test_policy_openai.py.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from coevolve.bench.security.probe import Attempt, Probe

KEY = "probe-key-3f9c"  # the key the probed server is started with
BIG = 2_000_000  # bytes of a large body
HUGE_REPLY = 200_000_000  # bytes a hostile server offers as a reply


# --------------------------------------------------------------------------- servers on loopback
@functools.lru_cache(maxsize=1)
def tiny_policy() -> Any:
    """The tiny test model (loaded once per process), context 1024 tokens."""
    from coevolve.config import PolicyConfig
    from coevolve.policy.local import LocalPolicy

    return LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024))


@contextlib.contextmanager
def served(**app_kw: Any) -> Iterator[str]:
    """``create_app(tiny_policy(), **app_kw)`` under uvicorn on a free loopback port; yields
    ``http://127.0.0.1:<port>`` (no ``/v1``) and stops the server afterwards."""
    import uvicorn

    from coevolve.processes import free_port
    from coevolve.serve import create_app

    port = free_port()
    app = create_app(tiny_policy(), model_name="tiny", **app_kw)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, name="coevolve-probe-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the probed server did not start on port {port}")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def read_request(conn: socket.socket) -> tuple[str, bytes]:
    """One HTTP/1.1 request from ``conn``: its head (request line and headers) and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data.decode("latin-1"), b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    text = head.decode("latin-1")
    length = next(
        (int(line.split(":", 1)[1]) for line in text.split("\r\n") if line.lower().startswith("content-length:")), 0
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return text, body


@contextlib.contextmanager
def raw_server(handle: Callable[[socket.socket, str, threading.Event], None]) -> Iterator[str]:
    """A loopback HTTP server written on raw sockets, to misbehave in ways no framework allows:
    each connection's request is read, then ``handle(conn, head, stop)`` answers it. Yields its
    ``http://127.0.0.1:<port>/v1`` base URL; ``stop`` is set when the block ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def one(conn: socket.socket) -> None:
        with conn:
            try:
                head, _ = read_request(conn)
                handle(conn, head, stop)
            except OSError:  # the client hung up: what a hostile server's client should do
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, name="coevolve-probe-raw-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def completion(text: str = "ok") -> bytes:
    """A minimal chat-completion reply, as a whole HTTP response."""
    body = json.dumps(
        {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        }
    ).encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def trickle_body(conn: socket.socket, head: str, stop: threading.Event, seconds: float = 6.0) -> None:
    """Headers at once, then one byte of body every 0.2 s for ``seconds``: no single read waits long."""
    reply = completion()
    split = reply.index(b"\r\n\r\n") + 4
    conn.sendall(reply[:split])
    end = time.monotonic() + seconds
    for byte in reply[split:]:
        if stop.is_set() or time.monotonic() > end:
            return
        conn.sendall(bytes([byte]))
        time.sleep(0.2)


def trickle_head(conn: socket.socket, head: str, stop: threading.Event, seconds: float = 6.0) -> None:
    """The status line and headers themselves one byte every 0.2 s."""
    end = time.monotonic() + seconds
    for byte in completion():
        if stop.is_set() or time.monotonic() > end:
            return
        conn.sendall(bytes([byte]))
        time.sleep(0.2)


def huge_reply(conn: socket.socket, head: str, stop: threading.Event, *, declared: bool) -> None:
    """A 200 MB reply, announced in ``Content-Length`` (``declared``) or chunked without one; the
    bytes of body sent before the client hung up are left in ``SENT[0]``."""
    block = b"x" * 65536
    if declared:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % HUGE_REPLY)
    else:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    sent = 0
    try:
        while sent < HUGE_REPLY and not stop.is_set():
            conn.sendall(block if declared else b"%x\r\n%s\r\n" % (len(block), block))
            sent += len(block)
            SENT[0] = sent
        if not declared:
            conn.sendall(b"0\r\n\r\n")
    finally:
        SENT[0] = sent


SENT = [0]  # bytes of body the last ``huge_reply`` sent before its client hung up


def _client(base_url: str, *, timeout_s: float = 1.0, retries: int = 0, **kw: Any) -> Any:
    from coevolve.config import PolicyConfig
    from coevolve.policy.openai import OpenAIPolicy

    cfg = PolicyConfig(backend="openai", base_url=base_url, model="m", timeout_s=timeout_s, concurrency=1)
    return OpenAIPolicy(cfg, max_retries=retries, backoff_s=0.0, **kw)


def _ask(policy: Any) -> tuple[str, float]:
    """One chat call: ('ok: <text>' or the error's one line, seconds it took)."""
    from coevolve.policy.base import SamplingParams

    start = time.monotonic()
    try:
        (gen,) = policy.chat([[{"role": "user", "content": "hi"}]], [[]], SamplingParams(max_new_tokens=4, seed=0))
        out = f"ok: {gen.text}"
    except Exception as exc:
        out = f"{type(exc).__name__}: {exc}"
    finally:
        policy.close()
    return out, time.monotonic() - start


def _post(url: str, body: Any = None, *, raw: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
    import httpx

    if raw is None:
        raw = json.dumps(body).encode()
    return httpx.post(url, content=raw, headers={"Content-Type": "application/json", **(headers or {})}, timeout=60)


def _message(r: Any) -> str:
    try:
        return str(r.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return r.text[:160]


def _held_status(what: str, r: Any, status: int, mentions: str = "") -> Attempt:
    msg = _message(r)
    held = r.status_code == status and mentions.lower() in msg.lower()
    return Attempt(what, held, f"HTTP {r.status_code}: {msg[:140]}")


HI = [{"role": "user", "content": "hi"}]


# --------------------------------------------------------------------------- server probes
def _api_key(work: Path, fast: bool) -> Iterator[Attempt]:
    import httpx

    with served(api_key=KEY) as url:
        chat = f"{url}/v1/chat/completions"
        body = {"messages": HI, "max_tokens": 2}
        yield _held_status("no Authorization header", _post(chat, body), 401, "api key")
        yield _held_status("GET /v1/models without a key", httpx.get(f"{url}/v1/models"), 401)
        yield _held_status("a wrong key", _post(chat, body, headers={"Authorization": "Bearer wrong"}), 401)
        yield _held_status(
            "the key with another scheme", _post(chat, body, headers={"Authorization": f"Basic {KEY}"}), 401
        )
        yield _held_status("the key as a query parameter", _post(f"{chat}?api_key={KEY}", body), 401)
        yield _held_status("the key with a suffix", _post(chat, body, headers={"Authorization": f"Bearer {KEY}x"}), 401)
        code, seconds = _declared_only(url, "/v1/chat/completions", BIG, auth=None)
        yield Attempt(
            "a 2 MB body without a key, headers only", code == 401 and seconds < 5, f"HTTP {code} in {seconds:.2f} s"
        )
        ok = _post(chat, body, headers={"Authorization": f"Bearer {KEY}"})
        yield Attempt("the right key is served", ok.status_code == 200, f"HTTP {ok.status_code}")
        health = httpx.get(f"{url}/health")
        yield Attempt("/health stays open (liveness)", health.status_code == 200, f"HTTP {health.status_code}")
    yield from _cli_bind()
    if not fast:
        yield from _cli_key_from_env()


def _cli_bind() -> Iterator[Attempt]:
    """``coevolve serve --host 0.0.0.0`` without a key is refused before the model loads."""
    from typer.testing import CliRunner

    from coevolve.cli import app

    env = {"COEVOLVE_SERVE_API_KEY": ""}
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--port", "1"], env=env)
    out = " ".join(result.output.split())
    yield Attempt("serve on 0.0.0.0 without a key", result.exit_code != 0 and "--api-key" in out, out[:140])


def _cli_key_from_env() -> Iterator[Attempt]:
    """The real command, its key from COEVOLVE_SERVE_API_KEY."""
    import httpx

    from coevolve.processes import free_port, stop

    port = free_port()
    cmd = [sys.executable, "-m", "coevolve.cli", "serve", "--model", "tiny", "--port", str(port), "--threads", "1"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "COEVOLVE_SERVE_API_KEY": KEY}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode()[-300:] if proc.poll() is not None and proc.stderr else "not up"
                yield Attempt("coevolve serve (key from the env) starts", False, err)
                return
        body = {"messages": HI, "max_tokens": 2}
        chat = f"{url}/v1/chat/completions"
        yield _held_status("coevolve serve: no key", _post(chat, body), 401)
        ok = _post(chat, body, headers={"Authorization": f"Bearer {KEY}"})
        yield Attempt("coevolve serve: the env's key is served", ok.status_code == 200, f"HTTP {ok.status_code}")
    finally:
        stop(proc, timeout_s=20)


MALFORMED: list[tuple[str, Any, str]] = [
    # (what, body, the field the 400's message must name)
    ("n as a string", {"messages": HI, "n": "1"}, "n"),
    ("n = 2", {"messages": HI, "n": 2}, "n"),
    ("n = true", {"messages": HI, "n": True}, "n"),
    ("max_tokens as a string", {"messages": HI, "max_tokens": "5"}, "max_tokens"),
    ("max_tokens = 1.5", {"messages": HI, "max_tokens": 1.5}, "max_tokens"),
    ("seed as a string", {"messages": HI, "seed": "7"}, "seed"),
    ("seed past 64 bits", {"messages": HI, "seed": 2**70}, "seed"),
    ('tools: "zzz"', {"messages": HI, "tools": "zzz"}, "tools"),
    ("tools: [1]", {"messages": HI, "tools": [1]}, "tools"),
    ("a tool without a name", {"messages": HI, "tools": [{"type": "function", "function": {}}]}, "tools"),
    ("messages a string", {"messages": "nope"}, "messages"),
    ("messages empty", {"messages": []}, "messages"),
    ("messages missing", {"max_tokens": 3}, "messages"),
    ("a message as a list", {"messages": [["user", "hi"]]}, "messages"),
    ("a message without a role", {"messages": [{"content": "hi"}]}, "role"),
    ("an unknown role", {"messages": [{"role": "root", "content": "hi"}]}, "role"),
    ("content a number", {"messages": [{"role": "user", "content": 5}]}, "content"),
    ("temperature a string", {"messages": HI, "temperature": "hot"}, "temperature"),
    ("temperature -1", {"messages": HI, "temperature": -1}, "temperature"),
    ("top_p 0", {"messages": HI, "top_p": 0}, "top_p"),
    ("stream: true", {"messages": HI, "stream": True}, "stream"),
    ("the body a JSON list", [1, 2], "body"),
]
RAW_MALFORMED: list[tuple[str, bytes, str]] = [
    ("temperature NaN", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', "temperature"),
    ("the body not JSON", b"{'messages': oops", "json"),
    ("an empty body", b"", "body"),
]


def _malformed(work: Path, fast: bool) -> Iterator[Attempt]:
    import httpx

    with served() as url:
        chat = f"{url}/v1/chat/completions"
        for what, body, field in MALFORMED:
            yield _held_status(what, _post(chat, body), 400, field)
        for what, raw, field in RAW_MALFORMED:
            yield _held_status(what, _post(chat, raw=raw), 400, field)
        health = httpx.get(f"{url}/health")
        ok = _post(chat, {"messages": HI, "max_tokens": 2, "seed": 3})
        yield Attempt("the server still answers", health.status_code == ok.status_code == 200, f"HTTP {ok.status_code}")


def _max_tokens(work: Path, fast: bool) -> Iterator[Attempt]:
    with served(max_tokens_limit=64) as url:
        chat = f"{url}/v1/chat/completions"
        for value in (0, -5, 65, 10**30):
            yield _held_status(
                f"max_tokens {value}", _post(chat, {"messages": HI, "max_tokens": value}), 400, "max_tokens"
            )
        r = _post(chat, {"messages": HI, "max_completion_tokens": 0})
        yield _held_status("max_completion_tokens 0", r, 400, "max_completion_tokens")
        r = _post(chat, {"messages": HI, "max_tokens": 3, "seed": 1})
        used = r.json().get("usage", {}).get("completion_tokens", -1) if r.status_code == 200 else -1
        yield Attempt("max_tokens 3 generates at most 3", r.status_code == 200 and 0 <= used <= 3, f"{used} tokens")


def _declared_only(url: str, path: str, length: int, auth: str | None) -> tuple[int, float]:
    """Send only the headers of a POST that announces ``length`` bytes: the status the server
    answers without the body, and how long it took (0 when it waited for the body)."""
    host, port = url.removeprefix("http://").split(":")
    start = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        lines = [
            f"POST {path} HTTP/1.1",
            f"Host: {host}",
            "Content-Type: application/json",
            f"Content-Length: {length}",
        ]
        if auth:
            lines.append(f"Authorization: Bearer {auth}")
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            status = conn.recv(65536).split(b" ", 2)[1]
            return int(status), time.monotonic() - start
        except (TimeoutError, IndexError, ValueError):
            return 0, time.monotonic() - start


def _body_size(work: Path, fast: bool) -> Iterator[Attempt]:
    import httpx

    with served(max_body_bytes=1 << 20) as url:
        code, seconds = _declared_only(url, "/v1/chat/completions", BIG, auth=None)
        yield Attempt(
            "a 2 MB Content-Length, body not sent", code == 413 and seconds < 5, f"HTTP {code} in {seconds:.2f} s"
        )

        def chunks() -> Iterator[bytes]:
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(BIG // 65536 + 1):
                yield b"a" * 65536
            yield b'"}]}'

        r = httpx.post(f"{url}/v1/chat/completions", content=chunks(), timeout=60)  # chunked: no length
        yield _held_status("a 2 MB chunked body", r, 413, "bytes")
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": HI, "max_tokens": 2})
        yield Attempt("a small body is still served", r.status_code == 200, f"HTTP {r.status_code}")
    with served(max_body_bytes=8 << 20) as url:
        yield _health_during_big_prompt(url)


def _health_during_big_prompt(url: str) -> Attempt:
    """A 2 MB prompt (admitted by a large body limit) tokenized while /health is polled."""
    import httpx

    content = "hello world " * (BIG // 12)
    box: dict[str, Any] = {}

    def big() -> None:
        start = time.monotonic()
        box["r"] = httpx.post(
            f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": content}]}, timeout=120
        )
        box["s"] = time.monotonic() - start

    thread = threading.Thread(target=big, daemon=True)
    thread.start()
    waits = []
    with httpx.Client(timeout=30) as client:
        while thread.is_alive():
            start = time.monotonic()
            client.get(f"{url}/health")
            waits.append(time.monotonic() - start)
            time.sleep(0.05)
    thread.join()
    r = box["r"]
    code = _message(r) if r.status_code != 200 else "200"
    worst = max(waits) if waits else 0.0
    held = worst < 0.5 and len(waits) >= 3 and r.status_code == 400 and "context length" in code
    detail = (
        f"{len(waits)} /health polls, slowest {worst:.3f} s, while the 2 MB request took {box['s']:.2f} s: {code[:80]}"
    )
    return Attempt("/health answers while a 2 MB prompt is tokenized", held, detail)


# --------------------------------------------------------------------------- client probes
def _client_deadline(work: Path, fast: bool) -> Iterator[Attempt]:
    for what, handler in (
        ("a server trickling its body", trickle_body),
        ("a server trickling its headers", trickle_head),
    ):
        with raw_server(handler) as url:
            out, seconds = _ask(_client(url, timeout_s=1.0))
        held = seconds < 1.6 and "deadline of 1 s" in out
        yield Attempt(f"timeout_s=1 vs {what} for 6 s", held, f"{seconds:.2f} s: {out[:120]}")
    if not fast:  # each retry has a deadline of its own, and no more
        with raw_server(trickle_body) as url:
            out, seconds = _ask(_client(url, timeout_s=1.0, retries=1))
        held = seconds < 2.8 and "2 attempts" in out
        yield Attempt("timeout_s=1, 1 retry, vs a trickling server", held, f"{seconds:.2f} s")
    with raw_server(lambda conn, head, stop: conn.sendall(completion("fine"))) as url:
        out, seconds = _ask(_client(url, timeout_s=1.0))
    yield Attempt("a prompt server is still read", out == "ok: fine", out[:80])


def _client_reply_cap(work: Path, fast: bool) -> Iterator[Attempt]:
    cap = 8 << 20
    for declared in (True, False):
        SENT[0] = 0
        with raw_server(functools.partial(huge_reply, declared=declared)) as url:
            tracemalloc.start()
            try:
                out, seconds = _ask(_client(url, timeout_s=30.0, max_reply_bytes=cap))
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        how = "announced in Content-Length" if declared else "chunked, no length"
        held = "capped at" in out and peak < 4 * cap and SENT[0] < HUGE_REPLY
        detail = f"peak {peak / 2**20:.1f} MiB traced, {SENT[0] / 2**20:.0f} MiB sent, {seconds:.2f} s: {out[:90]}"
        yield Attempt(f"a 200 MB reply, {how}", held, detail)
    yield from _key_stays_home()


def _key_stays_home() -> Iterator[Attempt]:
    """The endpoint redirects to another server: the key never reaches it."""
    seen: dict[str, list[str]] = {"base": [], "other": []}

    def other(conn: socket.socket, head: str, stop: threading.Event) -> None:
        seen["other"].append(head)
        conn.sendall(completion("captured"))

    with raw_server(other) as other_url:

        def base(conn: socket.socket, head: str, stop: threading.Event) -> None:
            seen["base"].append(head)
            where = f"{other_url}/chat/completions"
            conn.sendall(f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {where}\r\nContent-Length: 0\r\n\r\n".encode())

        with raw_server(base) as base_url:
            os.environ["COEVOLVE_PROBE_API_KEY"] = KEY
            try:
                from coevolve.config import PolicyConfig
                from coevolve.policy.openai import OpenAIPolicy

                cfg = PolicyConfig(backend="openai", base_url=base_url, model="m", api_key_env="COEVOLVE_PROBE_API_KEY")
                out, _ = _ask(OpenAIPolicy(cfg, max_retries=0))
            finally:
                del os.environ["COEVOLVE_PROBE_API_KEY"]
    leaked = any(KEY in h for h in seen["other"])
    sent_home = any(f"Bearer {KEY}" in h for h in seen["base"])
    detail = f"base got the key: {sent_home}; other server got {len(seen['other'])} requests; {out[:80]}"
    yield Attempt("a redirect to another server", sent_home and not leaked and "HTTP 307" in out, detail)


PROBES: tuple[Probe, ...] = (
    Probe(
        "serve-api-key",
        "serve",
        "call coevolve serve with no key, a wrong key, or bind it beyond loopback without one",
        _api_key,
    ),
    Probe(
        "serve-malformed-fields",
        "serve",
        "send n/max_tokens/seed as strings, tools 'zzz', messages of the wrong shape, NaN",
        _malformed,
    ),
    Probe(
        "serve-max-tokens-bounds",
        "serve",
        "ask coevolve serve for max_tokens 0, -5, past its limit, 10**30",
        _max_tokens,
    ),
    Probe(
        "serve-body-size",
        "serve",
        "send a 2 MB body (announced, chunked) and poll /health while one is tokenized",
        _body_size,
    ),
    Probe("client-deadline", "serve", "trickle bytes to the OpenAI client to stretch timeout_s=1", _client_deadline),
    Probe(
        "client-reply-cap",
        "serve",
        "answer the OpenAI client with 200 MB, or redirect it to steal its key",
        _client_reply_cap,
    ),
)
