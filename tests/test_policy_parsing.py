"""Tests of Hermes tool-call parsing: valid calls, every malformed shape, and a 10,000-output fuzz."""

from __future__ import annotations

import json
import random

from coevolve.envs.base import ToolCall
from coevolve.policy.parsing import ParseResult, parse_tool_calls


def test_single_and_multiple_calls_with_content():
    text = (
        'Let me look.\n<tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n</tool_call>\n'
        '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'
    )
    r = parse_tool_calls(text)
    assert r.error is None
    assert r.calls == [ToolCall("cd", {"folder": "document"}), ToolCall("ls", {})]
    assert r.content == "Let me look."


def test_plain_answer_has_no_calls():
    r = parse_tool_calls("The file was moved.")
    assert r == ParseResult(calls=[], content="The file was moved.", error=None)


def test_lenient_forms_accepted():
    r = parse_tool_calls('<tool_call>```json\n{"name": "ls", "arguments": "{\\"a\\": true}"}\n```</tool_call>')
    assert r.error is None and r.calls == [ToolCall("ls", {"a": True})]
    assert parse_tool_calls('<tool_call>{"name": "ls"}</tool_call>').calls == [ToolCall("ls", {})]


def test_malformed_calls_are_errors_with_messages():
    cases = {
        '<tool_call>{"name": "ls", "arguments": {}</tool_call>': "not valid JSON",
        "<tool_call>[1, 2]</tool_call>": "must be a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': "needs a 'name'",
        '<tool_call>{"name": "rm -rf /", "arguments": {}}</tool_call>': "needs a 'name'",
        '<tool_call>{"name": "ls", "arguments": [1]}</tool_call>': "'arguments' must be a JSON object",
        '<tool_call>{"name": "ls", "arguments": {}, "x": 1}</tool_call>': "unexpected keys",
        '<tool_call>{"name": "ls", "arguments": {}}': "not closed",
        '{"name": "ls"}</tool_call>': "without an opening",
        "<tool_call>  </tool_call>": "is empty",
        '<tool_call>{"name": "ls", "arguments": {}}</tool_call><tool_call>oops</tool_call>': "tool call 2",
    }
    for text, expected in cases.items():
        r = parse_tool_calls(text)
        assert r.error and expected in r.error, (text, r.error)
        assert r.calls == [], "a malformed message executes no call"
        assert "<tool_call>" in r.error, "the error shows the agent the correct format"


def _mutate(rng: random.Random, text: str) -> str:
    ops = rng.randrange(1, 6)
    for _ in range(ops):
        kind = rng.randrange(6)
        i = rng.randrange(len(text) + 1)
        if kind == 0:
            text = text[:i] + rng.choice('{}[]":,<>/\\ntool_call') + text[i:]
        elif kind == 1 and text:
            text = text[:i] + text[i + 1 :]
        elif kind == 2:
            text = text[:i]
        elif kind == 3:
            text = (
                text[:i]
                + rng.choice(["<tool_call>", "</tool_call>", "\x00", "\ud800", "9" * 5000, "[" * 3000])
                + text[i:]
            )
        elif kind == 4:
            text = text + text[:i]
        else:
            text = "".join(chr(rng.randrange(0, 0x3000)) for _ in range(rng.randrange(0, 40))) + text
    return text


def test_fuzz_never_raises_and_always_classifies():
    rng = random.Random(1234)
    seeds = [
        '<tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n</tool_call>',
        '<tool_call>{"name": "mv", "arguments": {"source": "a", "destination": "b"}}</tool_call> done',
        "Sure, the answer is 42.",
        '<tool_call>{"name": "x", "arguments": {"n": [1, {"k": null}]}}</tool_call>' * 2,
    ]
    valid = errors = 0
    for _ in range(10_000):
        text = _mutate(rng, rng.choice(seeds))
        r = parse_tool_calls(text)
        assert isinstance(r, ParseResult)
        if r.error is None:
            assert all(isinstance(c, ToolCall) and isinstance(c.arguments, dict) for c in r.calls)
            json.dumps([c.arguments for c in r.calls])  # arguments are plain JSON values
            valid += 1
        else:
            assert isinstance(r.error, str) and r.error and r.calls == []
            errors += 1
    assert valid > 500 and errors > 500
    assert parse_tool_calls(None).error is None  # non-strings are read as text, not crashed on
