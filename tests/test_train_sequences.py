"""Training sequences: the assistant mask covers exactly what the model wrote."""

from __future__ import annotations

from transformers import AutoTokenizer

from coevolve.policy.models import resolve_model
from coevolve.policy.prompts import render_prompt
from coevolve.train.sequences import collate, encode_chat, wire_renderer

TOOLS = [{"type": "function", "function": {"name": "cd", "description": "Change directory.",
          "parameters": {"type": "object", "properties": {"folder": {"type": "string"}}, "required": ["folder"]}}}]
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


def test_truncation_keeps_the_end_and_collate_pads_right():
    tok = _tok()
    ids, mask = encode_chat(tok, CHAT, wire_renderer(tok, TOOLS, "compact"), max_tokens=20)
    full, _ = encode_chat(tok, CHAT, wire_renderer(tok, TOOLS, "compact"))
    assert ids == full[-20:] and len(mask) == 20
    batch = collate([(ids, mask), (ids[:5], mask[:5])], pad_id=0)
    assert batch["input_ids"].shape == (2, 20)
    assert batch["attention_mask"][1].tolist() == [1] * 5 + [0] * 15
    assert batch["loss_mask"][1, 5:].sum() == 0
