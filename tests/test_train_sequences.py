"""Training sequences: the assistant mask covers exactly what the model wrote."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from coevolve.policy.models import resolve_model
from coevolve.policy.prompts import render_prompt
from coevolve.train.scoring import pack
from coevolve.train.sequences import encode_chat, episode_sequences, wire_renderer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "cd",
            "description": "Change directory.",
            "parameters": {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]},
        },
    }
]
CALL = '<tool_call>{"name": "cd", "arguments": {"folder": "docs"}}</tool_call>'
CHAT = [
    {"role": "system", "content": "You call functions."},
    {"role": "user", "content": "go to docs"},
    {"role": "assistant", "content": CALL},
    {"role": "tool", "name": "cd", "content": '{"current_working_directory": "docs"}'},
    {"role": "assistant", "content": "Done."},
    {"role": "user", "content": "thanks"},
    {"role": "assistant", "content": "Bye."},
]


def _tok():
    return AutoTokenizer.from_pretrained(resolve_model("tiny"))


def test_mask_covers_assistant_messages_and_their_end_token_only():
    tok = _tok()
    ids, mask = encode_chat(tok, CHAT, wire_renderer(tok, TOOLS, "compact"))
    assert len(ids) == len(mask)
    runs, current = [], []
    for t, m in zip(ids, mask):
        if m:
            current.append(t)
        elif current:
            runs.append(current)
            current = []
    texts = [tok.decode(r) for r in runs + ([current] if current else [])]
    assert texts == [CALL + "<|im_end|>", "Done.<|im_end|>", "Bye.<|im_end|>"]
    context = tok.decode([t for t, m in zip(ids, mask) if not m])
    assert "go to docs" in context and "current_working_directory" in context and "thanks" in context
    assert "cd(folder: string)" in context  # the compact tool block, as the policy renders it


def test_each_generation_prompt_is_a_prefix_of_the_sequence():
    # what the policy was prompted with before its second message = the sequence up to it
    tok = _tok()
    ids, mask = encode_chat(tok, CHAT, wire_renderer(tok, TOOLS, "compact"))
    prompt = render_prompt(CHAT[:4], TOOLS, tok, tool_format="compact", max_context_tokens=4096, max_new_tokens=16)
    assert ids[: len(prompt.ids)] == prompt.ids
    assert mask[len(prompt.ids) - 1] == 0 and mask[len(prompt.ids)] == 1


def test_truncation_keeps_the_end():
    tok = _tok()
    ids, mask = encode_chat(tok, CHAT, wire_renderer(tok, TOOLS, "compact"), max_tokens=20)
    full, _ = encode_chat(tok, CHAT, wire_renderer(tok, TOOLS, "compact"))
    assert ids == full[-20:] and len(mask) == 20


def _row(prompt, completion, n_tokens=None):
    return {
        "episode_id": "e",
        "prompt_ids": prompt,
        "completion_ids": completion,
        "completion_logprobs": [-0.5] * len(completion),
        "n_tokens": len(completion) if n_tokens is None else n_tokens,
    }


def test_episode_sequences_chain_extending_prompts_and_split_elsewhere():
    rows = [
        _row([1, 2, 3], [4, 5]),
        {"episode_id": "e", "completion_ids": None, "n_tokens": 0},
        _row([1, 2, 3, 4, 5, 9], [6]),  # extends the sequence so far: chained, 9 is context
        _row([7, 8], [6, 2]),
    ]  # the budget dropped history: a new sequence
    first, second = episode_sequences(rows, max_tokens=100)
    assert first.ids == [1, 2, 3, 4, 5, 9, 6] and first.mask == [0, 0, 0, 1, 1, 0, 1] and first.messages == 2
    assert first.logprobs == [0, 0, 0, -0.5, -0.5, 0, -0.5]
    assert second.ids == [7, 8, 6, 2] and second.mask == [0, 0, 1, 1]
    # past max_tokens a message starts its own sequence, its prompt cut from the left
    cut = episode_sequences(rows[:3], max_tokens=6)
    assert [s.ids for s in cut] == [[1, 2, 3, 4, 5], [2, 3, 4, 5, 9, 6]]
    with pytest.raises(ValueError, match="no sampled token ids"):
        episode_sequences([{"episode_id": "e", "completion_ids": None, "n_tokens": 3}], max_tokens=100)


def test_pack_points_each_sampled_token_at_its_predicting_position():
    seqs = episode_sequences([_row([1, 2, 3], [4, 5])], 100) + episode_sequences([_row([1], [7])], 100)
    batch = pack(seqs, pad_id=0, advantages=[1.0, -1.0])
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5], [1, 7, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1] * 5, [1, 1, 0, 0, 0]]
    assert batch["rows"].tolist() == [0, 0, 1] and batch["cols"].tolist() == [2, 3, 0]
    assert batch["targets"].tolist() == [4, 5, 7] and batch["adv"].tolist() == [1.0, 1.0, -1.0]
    assert pack(seqs[:1], pad_id=0)["attention_mask"] is None  # no padding: the causal fast path
