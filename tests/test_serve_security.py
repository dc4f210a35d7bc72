"""``coevolve serve`` at the door (issue 29, item 5): the Bearer key, a 400 naming each malformed
field, bounds on max_tokens and on the body (413 before it is read), and /health answering while
a large prompt is tokenized. Servers are the tiny model under uvicorn on loopback."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from coevolve.bench.security.serve import (
    BIG,
    HI,
    KEY,
    MALFORMED,
    RAW_MALFORMED,
    _declared_only,
    _health_during_big_prompt,
    served,
)


@pytest.fixture(scope="module")
def open_server():
    """No key, the default body limit, max_tokens at most 64."""
    with served(max_tokens_limit=64) as url:
        yield url


@pytest.fixture(scope="module")
def keyed_server():
    with served(api_key=KEY) as url:
        yield url


def _chat(url: str, body=None, raw: bytes | None = None, **headers: str) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(
        f"{url}/v1/chat/completions",
        content=content,
        headers={"Content-Type": "application/json", **headers},
        timeout=60,
    )


def test_every_path_but_health_needs_the_bearer_key(keyed_server):
    url, body = keyed_server, {"messages": HI, "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}, {"Authorization": KEY}):
        r = _chat(url, body, **headers)
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"] == "Bearer" and "COEVOLVE_SERVE_API_KEY" in r.json()["error"]["message"]
    assert httpx.get(f"{url}/v1/models").status_code == 401
    assert httpx.get(f"{url}/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404
    assert httpx.get(f"{url}/health").status_code == 200
    ok = _chat(url, body, Authorization=f"Bearer {KEY}")
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2
    # refused before the body is read: the headers of a 2 MB POST are enough for the 401
    assert _declared_only(url, "/v1/chat/completions", BIG, auth=None)[0] == 401


@pytest.mark.parametrize(("what", "body", "field"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_each_malformed_field_is_a_400_that_names_it(open_server, what, body, field):
    r = _chat(open_server, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert field in error["message"] and error["type"] == "invalid_request_error", error


@pytest.mark.parametrize(("what", "raw", "field"), RAW_MALFORMED, ids=[m[0] for m in RAW_MALFORMED])
def test_bodies_that_are_not_a_json_object_are_a_400(open_server, what, raw, field):
    r = _chat(open_server, raw=raw)
    assert r.status_code == 400 and field in r.json()["error"]["message"].lower(), r.text


def test_max_tokens_is_bounded_both_ways(open_server):
    for value in (0, -5, 65, 10**30):
        r = _chat(open_server, {"messages": HI, "max_tokens": value})
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"], (value, r.text)
    r = _chat(open_server, {"messages": HI, "max_tokens": 3, "seed": 2, "temperature": 1, "top_p": 0.9})
    assert r.status_code == 200 and 1 <= r.json()["usage"]["completion_tokens"] <= 3
    # no max_tokens: the server's default, within its limit
    r = _chat(open_server, {"messages": HI, "seed": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 64


def test_a_body_over_the_limit_is_413_before_it_is_read(open_server):
    # only the headers are sent: an answer at all means it came before the body was read
    status, _ = _declared_only(open_server, "/v1/chat/completions", BIG, auth=None)
    assert status == 413

    def chunked():  # no Content-Length: counted as it arrives
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}]}'

    r = httpx.post(f"{open_server}/v1/chat/completions", content=chunked(), timeout=60)
    assert r.status_code == 413 and "1048576" in r.json()["error"]["message"]
    assert httpx.get(f"{open_server}/health").status_code == 200


def test_health_answers_while_a_large_prompt_is_tokenized():
    with served(max_body_bytes=8 << 20) as url:
        attempt = _health_during_big_prompt(url)
    assert attempt.held, attempt.detail


def test_a_public_interface_needs_a_key_or_an_explicit_choice():
    from coevolve.cli import app
    from coevolve.cli.policy import _is_loopback

    for host in ("0.0.0.0", "192.168.1.5", "::", "example.org"):
        result = CliRunner().invoke(app, ["serve", "--host", host, "--port", "1"], env={"COEVOLVE_SERVE_API_KEY": ""})
        assert result.exit_code == 2 and "--no-key-on-purpose" in " ".join(result.output.split()), result.output
    assert all(_is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))


def test_the_command_takes_its_key_from_the_environment():
    from serve_helpers import served_tiny_model

    with served_tiny_model(timeout_s=90, api_key=KEY) as url:
        body = {"messages": HI, "max_tokens": 2}
        assert httpx.post(f"{url}/chat/completions", json=body, timeout=30).status_code == 401
        ok = httpx.post(f"{url}/chat/completions", json=body, timeout=30, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200


def test_a_conversation_the_chat_template_refuses_is_a_400(open_server, monkeypatch):
    from jinja2 import TemplateError

    from coevolve.bench.security.serve import tiny_policy

    def refuse(*args, **kwargs):
        raise TemplateError("Conversation roles must alternate user/assistant/user/assistant/...")

    monkeypatch.setattr(tiny_policy().tokenizer, "apply_chat_template", refuse)
    r = _chat(open_server, {"messages": HI + HI, "max_tokens": 2})
    assert r.status_code == 400 and "roles must alternate" in r.json()["error"]["message"], r.text
    monkeypatch.undo()
    assert _chat(open_server, {"messages": HI, "max_tokens": 2}).status_code == 200


def test_the_serve_probes_hold_in_their_fast_form():
    """What .ci/run runs: ``coevolve bench security --areas serve --fast``, every attempt held."""
    from coevolve.cli import app

    result = CliRunner().invoke(app, ["bench", "security", "--areas", "serve", "--fast"])
    assert result.exit_code == 0, result.output
    total = [line.split() for line in result.output.splitlines() if line.startswith("all ")]
    assert total and total[-1][1] == "6" and total[-1][2] == total[-1][3] and total[-1][4] == "0", result.output
