"""Tests of the OpenAI-compatible backend: against ``coevolve serve``'s app on a real loopback
HTTP server (the tiny model), and its retry / error rules against a mock transport."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch

from coevolve.config import PolicyConfig
from coevolve.processes import free_port
from coevolve.policy.base import Request, SamplingParams
from coevolve.policy.local import LocalPolicy
from coevolve.policy.openai import EndpointError, OpenAIPolicy
from coevolve.rollout import run_episodes
from test_rollout import CounterEnv, make_tasks  # tests/ is on sys.path (pytest rootdir-relative import)


@pytest.fixture(scope="module")
def server():
    """``coevolve.serve`` over the tiny model, served by uvicorn on a free loopback port."""
    import uvicorn

    from coevolve.serve import create_app

    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/test_rollout.py::one_thread
    local = LocalPolicy(PolicyConfig(model="tiny", max_context_tokens=1024))
    port = free_port()
    srv = uvicorn.Server(
        uvicorn.Config(create_app(local, model_name="tiny"), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", local
    srv.should_exit = True
    thread.join(timeout=10)
    torch.set_num_threads(saved)


def test_endpoint_speaks_the_openai_api(server):
    url, _ = server
    assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "tiny"
    r = httpx.post(
        f"{url}/chat/completions",
        json={"model": "tiny", "max_tokens": 4, "seed": 1, "messages": [{"role": "user", "content": "hi"}]},
    )
    body = r.json()
    assert r.status_code == 200 and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] <= 4 and body["choices"][0]["finish_reason"] in ("stop", "length")
    bad = httpx.post(f"{url}/chat/completions", json={"messages": "nope"})
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]


def test_episode_rows_match_the_local_backend(server):
    url, local = server
    cfg = PolicyConfig(backend="openai", base_url=url, model="tiny", max_context_tokens=1024, concurrency=4)
    remote = OpenAIPolicy(cfg)
    kw = dict(
        n_samples=2,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=10),
        step_limit=2,
        phase="eval",
        run_id="o",
        round_no=0,
        seed=11,
    )
    via_http = run_episodes(remote, CounterEnv(), make_tasks(2), **kw)
    direct = run_episodes(local, CounterEnv(), make_tasks(2), **kw)
    assert len(via_http) == len(direct) == 4
    for a, b in zip(via_http, direct):
        assert [list(r) for r in a.steps] == [list(r) for r in b.steps]
        # an endpoint returns text, not token ids: only the local backend fills the token columns
        local_only = {"finish_reason", "prompt_ids", "completion_ids", "completion_logprobs"}
        assert [{k: type(v) for k, v in r.items() if k not in local_only} for r in a.steps] == [
            {k: type(v) for k, v in r.items() if k not in local_only} for r in b.steps
        ]
        assert all(r["completion_ids"] is None for r in a.steps)
        # Same prompts, same seeds: the same generations through HTTP as in-process.
        assert [m["content"] for m in a.messages] == [m["content"] for m in b.messages]
    remote.close()


def _policy(handler, **kw):
    cfg = PolicyConfig(backend="openai", base_url="http://endpoint/v1", model="m", concurrency=2)
    return OpenAIPolicy(cfg, transport=httpx.MockTransport(handler), backoff_s=0.0, **kw)


def _ok(text="hi", **message):
    return httpx.Response(
        200,
        json={
            "choices": [{"message": {"content": text, **message}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        },
    )


def test_retries_then_succeeds_and_native_tool_calls_become_hermes():
    calls = []

    def handler(request):
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(503, text="busy")
        return _ok("", tool_calls=[{"type": "function", "function": {"name": "ls", "arguments": '{"a": true}'}}])

    (gen,) = _policy(handler).chat([[{"role": "user", "content": "x"}]], [[]], SamplingParams(seed=1))
    assert len(calls) == 3 and gen.completion_tokens == 1
    assert gen.text == '<tool_call>\n{"name": "ls", "arguments": {"a": true}}\n</tool_call>'
    sent = __import__("json").loads(calls[-1].content)
    assert sent["model"] == "m" and sent["messages"][0]["role"] == "system" and isinstance(sent["seed"], int)


def test_errors_context_limit_and_exhausted_retries():
    ctx = _policy(lambda r: httpx.Response(400, json={"error": {"code": "context_length_exceeded"}}))
    (gen,) = ctx.chat([[{"role": "user", "content": "x"}]], [[]], SamplingParams())
    assert gen.finish_reason == "context_limit" and gen.text == ""
    with pytest.raises(EndpointError, match="HTTP 401"):
        _policy(lambda r: httpx.Response(401, text="bad key")).chat(
            [[{"role": "user", "content": "x"}]], [[]], SamplingParams()
        )

    def down(request):
        raise httpx.ConnectError("refused")

    with pytest.raises(EndpointError, match="after 3 attempts.*ConnectError"):
        _policy(down, max_retries=2).chat([[{"role": "user", "content": "x"}]], [[]], SamplingParams())


def test_the_stream_hands_back_each_reply_as_it_arrives():
    """The rollout engine's view of an endpoint: a slow request does not hold back the others."""
    release = threading.Event()

    def handler(request):
        text = __import__("json").loads(request.content)["messages"][-1]["content"]
        if text == "slow":
            assert release.wait(10)
        return _ok(f"re: {text}")

    policy = _policy(handler)
    stream = policy.stream(SamplingParams(seed=0))
    stream.submit(
        [
            Request("a", [{"role": "user", "content": "slow"}], []),
            Request("b", [{"role": "user", "content": "fast"}], []),
        ]
    )
    assert len(stream) == 2
    first = stream.collect()
    assert [(key, gen.text) for key, gen in first] == [("b", "re: fast")] and len(stream) == 1
    release.set()
    assert [(key, gen.text) for key, gen in stream.collect()] == [("a", "re: slow")]
    assert len(stream) == 0 and stream.collect() == []
    stream.close()


def test_server_answers_short_requests_while_a_long_one_generates(server, monkeypatch):
    """Continuous batching in ``coevolve serve``: a request that arrives while another is
    generating is answered as soon as its own answer ends (row joins: test_policy_local)."""
    url, local = server
    from coevolve.policy.decoder import Decoder
    from coevolve.serve import Batcher

    greedy = SamplingParams(temperature=0.0, max_new_tokens=600)
    generating, submitted = threading.Event(), threading.Event()
    futures: dict[str, object] = {}
    long_done_when_short_ended: list[bool] = []  # recorded on the batcher's thread
    step = Decoder.step

    def watched_step(self):
        finished = step(self)
        if self.sampling.max_new_tokens == greedy.max_new_tokens and not generating.is_set():
            generating.set()  # the long request has generated a token: it is generating
            submitted.wait(60)  # hold it there until the short request is queued
        for key, _, _ in finished:
            if key is futures.get("short"):
                long_done_when_short_ended.append(futures["long"].done())
        return finished

    monkeypatch.setattr(Decoder, "step", watched_step)
    batcher = Batcher(local, max_batch=4)
    try:
        futures["long"] = long = batcher.submit([5, 6, 7, 8] * 8, greedy, 0)
        assert generating.wait(60), "the long request never started generating"
        futures["short"] = short = batcher.submit([9, 10, 11] * 8, SamplingParams(temperature=0.0, max_new_tokens=3), 1)
        submitted.set()
        ids, _ = short.result(timeout=60)
        assert long_done_when_short_ended == [False], "the short request waited for the long one"
        assert len(ids) <= 3 and long.result(timeout=60) == tuple(local.generate([[5, 6, 7, 8] * 8], greedy, [0])[0])
    finally:
        submitted.set()
        batcher.close()


class _Trickle:
    """A raw-server handler that trickles its reply to the end (the server's own ``stop`` is
    ignored: only the client hanging up ends it early) and records, per connection, whether
    the client hung up before the reply was complete."""

    def __init__(self, handler):
        self.handler, self.hung_up = handler, []
        self._ended = threading.Semaphore(0)

    def __call__(self, conn, head, stop):
        try:
            self.handler(conn, head, threading.Event(), seconds=600)  # the whole reply: 30-50 s
            self.hung_up.append(False)
        except OSError:  # a send to a client that closed the connection
            self.hung_up.append(True)
        finally:
            self._ended.release()

    def outcomes(self, connections: int) -> list[bool]:
        for _ in range(connections):
            assert self._ended.acquire(timeout=120), f"{self.hung_up}: a trickle never ended"
        return self.hung_up


# --------------------------------------------------------------------------- hostile endpoints (issue 29)
def test_a_trickling_server_cannot_stretch_the_deadline():
    """timeout_s bounds the whole attempt: against a byte every 0.2 s (no read ever waits a
    second) the client gives up with the deadline's error and hangs up while the reply is
    still trickling, whether the body or the headers trickle."""
    from coevolve.bench.security.serve import _ask, _client, raw_server, trickle_body, trickle_head

    for handler in (trickle_body, trickle_head):
        trickle = _Trickle(handler)
        with raw_server(trickle) as url:
            out, _ = _ask(_client(url, timeout_s=1.0))
        assert "total deadline of 1 s passed" in out, (handler.__name__, out)
        # the client gave up on its own, while the server was still trickling the reply
        assert trickle.outcomes(1) == [True], handler.__name__
    trickle = _Trickle(trickle_body)
    with raw_server(trickle) as url:  # each retry has its own deadline, no more
        out, _ = _ask(_client(url, timeout_s=0.5, retries=2))
    assert "after 3 attempts" in out, out
    assert trickle.outcomes(3) == [True, True, True]  # every attempt hung up mid-trickle


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_a_huge_reply_is_refused_with_memory_bounded(declared):
    import functools
    import tracemalloc

    from coevolve.bench.security import serve as probes

    cap = 1 << 20
    probes.SENT[0] = 0
    with probes.raw_server(functools.partial(probes.huge_reply, declared=declared)) as url:
        tracemalloc.start()
        try:
            out, _ = probes._ask(probes._client(url, timeout_s=30.0, max_reply_bytes=cap))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert "EndpointError" in out and "capped at 1048576 bytes" in out, out
    assert peak < 4 * cap and probes.SENT[0] < probes.HUGE_REPLY // 10, (peak, probes.SENT[0])


def test_the_key_goes_to_base_url_only(monkeypatch):
    """Sent to the configured endpoint; a redirect elsewhere is not followed, so never leaks it."""
    from coevolve.bench.security.serve import _key_stays_home

    (attempt,) = list(_key_stays_home())
    assert attempt.held, attempt.detail
    seen = []
    monkeypatch.setenv("TEST_ENDPOINT_API_KEY", "k-123")

    def handler(request):
        seen.append(request)
        return _ok()

    cfg = PolicyConfig(backend="openai", base_url="http://endpoint/v1", model="m", api_key_env="TEST_ENDPOINT_API_KEY")
    OpenAIPolicy(cfg, transport=httpx.MockTransport(handler)).chat(
        [[{"role": "user", "content": "x"}]], [[]], SamplingParams()
    )
    assert seen[0].headers["authorization"] == "Bearer k-123" and seen[0].url.host == "endpoint"


def test_a_reply_that_is_not_a_completion_is_a_clear_error():
    for reply in (httpx.Response(200, text="<html>login</html>"), httpx.Response(200, json={"data": []})):
        with pytest.raises(EndpointError, match="not a chat completion"):
            _policy(lambda r, reply=reply: reply).chat([[{"role": "user", "content": "x"}]], [[]], SamplingParams())


def test_the_environments_proxy_is_still_used_and_still_bounded(monkeypatch):
    """Our transport replaces httpx's default one, which read HTTP_PROXY: the proxy is still
    honoured (NO_PROXY too), and the deadline holds through it."""
    from coevolve.bench.security.serve import _ask, _client, completion, raw_server, trickle_body

    for name in (
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "no_proxy",
        "NO_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)
    lines = []

    def proxy(conn, head, stop):
        lines.append(head.split("\r\n")[0])
        conn.sendall(completion("via proxy"))

    with raw_server(proxy) as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url.removesuffix("/v1"))
        out, _ = _ask(_client("http://endpoint.example/v1"))
        assert out == "ok: via proxy" and lines == ["POST http://endpoint.example/v1/chat/completions HTTP/1.1"]
        monkeypatch.setenv("NO_PROXY", "endpoint.example")
        out, _ = _ask(_client("http://endpoint.example/v1", timeout_s=2.0))
        assert "EndpointError" in out and len(lines) == 1, out  # bypassed: the name does not resolve
    monkeypatch.delenv("NO_PROXY")
    trickle = _Trickle(trickle_body)
    with raw_server(trickle) as proxy_url:
        monkeypatch.setenv("HTTP_PROXY", proxy_url.removesuffix("/v1"))
        out, _ = _ask(_client("http://endpoint.example/v1", timeout_s=1.0))
    assert "total deadline of 1 s passed" in out, out
    assert trickle.outcomes(1) == [True]  # given up while the proxy was still trickling


def test_a_deadline_that_is_not_a_positive_number_is_refused():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        cfg = PolicyConfig(backend="openai", base_url="http://endpoint/v1", model="m", timeout_s=bad)
        with pytest.raises(ValueError, match="policy.timeout_s must be a positive number"):
            OpenAIPolicy(cfg)
