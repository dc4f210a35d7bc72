"""The ``fuzz`` scenario: mutated model outputs through the tool-call parser and the BFCL
environment's dispatcher: 0 uncaught exceptions.

    res = fuzz_outputs(20_000, seed=0)       # res.tried, res.survived, res.notes (the first failures)
"""

from __future__ import annotations

import json
import random
import time
from typing import Callable

from coevolve.bench.reliability.common import ScenarioResult


def fuzz_outputs(n: int, seed: int = 0, log: Callable[[str], None] = lambda s: None) -> ScenarioResult:
    """``n`` mutated model outputs through ``parse_tool_calls`` and a BFCL episode's ``step``."""
    from coevolve.envs.bfcl import BfclEnvironment
    from coevolve.policy.parsing import parse_tool_calls

    res = ScenarioResult("fuzz")
    rng = random.Random(seed)
    env = BfclEnvironment(step_timeout_s=5.0)
    tasks = env.load_tasks(["multi_turn_base"], limit=8)
    names = sorted({d["name"] for t in tasks for d in env.function_docs(t)})
    good = [
        json.dumps({"name": c["name"], "arguments": c["arguments"]})
        for t in tasks
        for turn in t.reference_actions
        for c in turn
    ] or ['{"name": "ls", "arguments": {}}']
    values = [
        None,
        True,
        0,
        -1,
        10**30,
        1e308,
        float("nan"),
        "",
        "a" * 300,
        "../..",
        [],
        {},
        [1, "x"],
        {"a": {"b": []}},
    ]
    pieces = [
        "<tool_call>",
        "</tool_call>",
        "{",
        "}",
        "[",
        "]",
        '"',
        ":",
        ",",
        "\\",
        "```json",
        "\x00",
        "\u202e",
        '"name"',
        '"arguments"',
        "null",
        "NaN",
        "Infinity",
        "1e999",
        "\n",
    ]
    episode, t0 = None, time.perf_counter()
    for i in range(n):
        if i % 200 == 0:
            episode = env.episode(tasks[(i // 200) % len(tasks)])
        kind = rng.random()
        if kind < 0.3:  # a valid call, byte-mutated
            text = list(f"<tool_call>{rng.choice(good)}</tool_call>")
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(len(text) + 1)
                op = rng.random()
                if op < 0.4 and text:
                    del text[min(pos, len(text) - 1)]
                elif op < 0.8:
                    text.insert(pos, rng.choice(pieces))
                else:
                    text.insert(pos, chr(rng.randrange(0x20, 0x2FFF)))
            text = "".join(text)
        elif kind < 0.8:  # a well-formed call with random name and arguments
            args = {
                rng.choice(["folder", "file_name", "a", "b", "content", "x" * rng.randint(1, 40)]): rng.choice(values)
                for _ in range(rng.randint(0, 4))
            }
            name = rng.choice(names) if rng.random() < 0.8 else rng.choice(["__init__", "_load_scenario", "eval", "x"])
            try:
                body = json.dumps({"name": name, "arguments": args})
            except ValueError:
                body = '{"name": "ls"}'
            text = f"<tool_call>{body}</tool_call>" * rng.randint(1, 2)
        else:  # random structure
            text = "".join(rng.choice(pieces + ["cd", "ls", "x", " "]) for _ in range(rng.randint(0, 40)))
        res.tried += 1
        try:
            parsed = parse_tool_calls(text)
            for call in parsed.calls:
                obs = episode.step(call)
                if not isinstance(obs.content, str):
                    raise TypeError(f"observation content is {type(obs.content).__name__}")
            if episode.finish_reason:
                episode = env.episode(tasks[i % len(tasks)])
            res.survived += 1
        except Exception as exc:  # noqa: BLE001 - counting them is the point
            if len(res.notes) < 5:
                res.notes.append(f"{type(exc).__name__}: {str(exc)[:150]} on {text[:80]!r}")
        if (i + 1) % 100_000 == 0:
            log(f"fuzz: {i + 1:,} outputs, {res.tried - res.survived} uncaught, {time.perf_counter() - t0:.0f}s")
    return res
