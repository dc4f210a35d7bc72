"""10,000 random JSON values as LLM abstractor output: each is accepted or rejected with a
reason, none crashes the stage (issue 14)."""

from __future__ import annotations

import json
import random

from coevolve.abstract import LLMAbstractor, Run
from coevolve.config import load_config
from coevolve.policy.base import Generation
from coevolve.tasks import Task

DOCS = {"cd": {"name": "cd", "description": "Change directory."}, "ls": {"name": "ls", "description": "List."}}
SCALARS = [None, True, False, 0, -1, 3.5, "", "cd", "ls", "x", "instruction", "calls", "turns", "name", "arguments"]


def _value(rng: random.Random, depth: int) -> object:
    """A random JSON value, biased towards the spec's keys and shapes so checks run deep."""
    kind = rng.random()
    if depth <= 0 or kind < 0.3:
        return rng.choice(SCALARS)
    if kind < 0.55:
        return [_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    keys = ["turns", "instruction", "calls", "name", "arguments", "x"]
    return {rng.choice(keys): _value(rng, depth - 1) for _ in range(rng.randint(0, 3))}


def _spec_like(rng: random.Random) -> object:
    """A near-valid spec with one random part replaced by a random value."""
    call = {"name": rng.choice(["cd", "ls", "rm"]), "arguments": {"folder": "a"}}
    turn = {"instruction": "Do it.", "calls": [call]}
    spec = {"turns": [turn]}
    slot = rng.randrange(6)
    junk = _value(rng, 3)
    if slot == 0:
        spec["turns"] = junk
    elif slot == 1:
        spec["turns"] = [junk]
    elif slot == 2:
        turn["calls"] = junk
    elif slot == 3:
        turn["calls"] = [junk]
    elif slot == 4:
        call["name"] = junk
    else:
        call["arguments"] = junk
    return spec


class Replies:
    def __init__(self, texts):
        self.texts = texts

    def chat(self, conversations, tools, sampling, meta=None):
        assert len(conversations) == len(self.texts)
        return [Generation(text=t, prompt_tokens=1, completion_tokens=1) for t in self.texts]


def test_ten_thousand_random_json_answers_never_crash_the_abstractor():
    rng = random.Random(14)
    values = [_spec_like(rng) if i % 2 else _value(rng, 5) for i in range(10_000)]
    texts = [json.dumps(v) for v in values]
    texts[:4] = [
        '["cd"]',
        '[["cd"]]',
        '{"turns": [{"instruction": "a", "calls": ["cd"]}]}',
        '{"turns": [{"instruction": "a", "calls": [["cd"]]}]}',
    ]  # the shapes that crashed
    seed = Task(task_id="t", env="bfcl-v3", turns=["x"], initial_state={}, reference_actions=[])
    steps = [{"step": 0, "action_name": "cd", "action_args": '{"folder": "a"}', "observation": "{}", "error": None}]
    run = Run("s", "rare", 0, seed, steps, DOCS)
    cfg = load_config(overrides={"abstract.abstractor": "llm", "abstract.base_url": "http://127.0.0.1:1/v1"})
    out = LLMAbstractor(cfg, policy=Replies(texts)).abstract([run] * len(texts))
    assert len(out) == len(texts)
    accepted = [o for o in out if isinstance(o, tuple)]
    rejected = [o for o in out if isinstance(o, str)]
    assert len(accepted) + len(rejected) == len(texts)
    assert all(r.startswith("llm abstractor: malformed output: ") and len(r) > 40 for r in rejected)
    assert all(c["name"] in DOCS and isinstance(c["arguments"], dict) for _, ref in accepted for t in ref for c in t)
    assert accepted and len(rejected) > 5000  # both outcomes are exercised
    assert all(isinstance(o, str) for o in out[:4])
