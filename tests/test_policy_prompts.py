"""Tests of chat formatting: tool renderings, wire messages, the token budget rule, training masks."""

from __future__ import annotations

import pytest

from coevolve.policy.models import resolve_model
from coevolve.policy.prompts import (
    SYSTEM_PROMPT,
    TokenCounter,
    compact_signature,
    fit_budget,
    render_prompt,
    render_tools,
    to_wire,
    tokenize_for_training,
)

MV = {
    "name": "mv",
    "description": "This tool belongs to the Gorilla file system. Tool description: Move a file. Second sentence.",
    "parameters": {
        "type": "dict",
        "properties": {
            "source": {"type": "string"},
            "destination": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["source", "destination"],
    },
}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model("tiny"))


def test_compact_and_json_renderings():
    assert compact_signature(MV) == "mv(source: string, destination: string, tags: array[string]=?) - Move a file"
    assert compact_signature({"type": "function", "function": MV}) == compact_signature(MV)
    compact, js = render_tools([MV], "compact"), render_tools([MV], "json")
    assert "mv(source: string" in compact and "<tool_call>" in compact
    assert '<tools>\n{"type": "function", "function": {"name": "mv"' in js and len(js) > len(compact)
    assert render_tools([], "compact") == ""


def test_wire_messages_merge_tool_results():
    conv = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "<tool_call>..</tool_call>"},
        {"role": "tool", "content": "a"},
        {"role": "tool", "content": "b"},
    ]
    wire = to_wire(conv, [MV], "compact")
    assert [w["role"] for w in wire] == ["system", "user", "assistant", "user"]
    assert wire[0]["content"].startswith(SYSTEM_PROMPT) and "mv(" in wire[0]["content"]
    assert wire[3]["content"] == "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"
    custom = to_wire([{"role": "system", "content": "Be brief."}] + conv, [], "json")
    assert custom[0] == {"role": "system", "content": "Be brief."}


def _history(turns: int, obs: str = "ok") -> list[dict]:
    msgs = [{"role": "system", "content": "S"}]
    for t in range(turns):
        msgs += [
            {"role": "user", "content": f"request {t} " * 5},
            {"role": "assistant", "content": f'<tool_call>{{"name": "ls", "arguments": {{"t": {t}}}}}</tool_call>'},
            {"role": "tool", "content": obs},
            {"role": "assistant", "content": f"done {t}"},
        ]
    return msgs


def test_budget_truncates_observations_then_drops_oldest_turns():
    counter = TokenCounter.estimate()
    msgs = _history(6, obs="x" * 3000)
    # drop_block=1: no more goes than needed (the default block, two thirds of the room, would
    # also drop the current turn's call and its result here, keeping only its newest step)
    fitted, fits = fit_budget(msgs, [MV], tool_format="compact", budget=450, counter=counter, drop_block=1)
    assert fits
    assert fitted[0] == msgs[0], "the system message is kept"
    user = [m for m in fitted if m["role"] == "user"]
    assert user[-1]["content"].endswith(msgs[-4]["content"]), "the current turn's request is kept"
    assert "earlier messages omitted]" in user[0]["content"]
    tool = [m for m in fitted if m["role"] == "tool"]
    assert tool and all("[... truncated" in m["content"] and len(m["content"]) < 400 for m in tool)
    short, fits = fit_budget(_history(2), [MV], tool_format="compact", budget=4000, counter=counter)
    assert fits and short == _history(2), "nothing changes when it fits"


def test_budget_drops_current_turn_steps_last():
    msgs = [{"role": "user", "content": "one request"}]
    for i in range(30):
        msgs += [{"role": "assistant", "content": f"call {i} " * 10}, {"role": "tool", "content": f"result {i} " * 10}]
    fitted, fits = fit_budget(msgs, [], tool_format="compact", budget=300, counter=TokenCounter.estimate())
    assert fits and fitted[0]["content"].endswith("one request")
    assert fitted[-1] == msgs[-1] and fitted[-2] == msgs[-2], "the newest step stays"
    assert fitted[1]["role"] == "assistant", "steps are dropped whole (assistant + its tool results)"


def test_render_prompt_never_exceeds_the_budget(tokenizer):
    for msgs in (_history(8, obs="y" * 5000), [{"role": "user", "content": "z " * 20000}]):
        p = render_prompt(msgs, [MV], tokenizer, tool_format="compact", max_context_tokens=512, max_new_tokens=64)
        assert len(p.ids) <= 512 - 64
    huge = render_prompt(
        [{"role": "user", "content": "z " * 20000}],
        [MV],
        tokenizer,
        tool_format="compact",
        max_context_tokens=512,
        max_new_tokens=64,
    )
    assert huge.context_limit
    ok = render_prompt(_history(1), [MV], tokenizer, tool_format="compact", max_context_tokens=2048, max_new_tokens=64)
    assert not ok.context_limit and ok.text.endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(ok.ids) == ok.text


def test_training_mask_covers_assistant_text(tokenizer):
    msgs = _history(2)
    ids, mask = tokenize_for_training(msgs, [MV], tokenizer, tool_format="compact")
    assert len(ids) == len(mask)
    learned = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert "done 0" in learned and '"name": "ls"' in learned and "request" not in learned
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(to_wire(msgs, [MV], "compact"), tokenize=False)


def test_past_the_budget_messages_go_in_blocks_so_prompts_keep_extending(tokenizer):
    """Once a turn outgrows the budget, the next messages drop the same old steps (the overflow is
    rounded up to whole blocks): prompt k+1 extends prompt k, which the prompt cache then reuses,
    except at the few messages where the overflow crosses into the next block."""
    msgs = [{"role": "user", "content": "one request"}]
    extends = {}
    for block in (1, None):  # 1: only what is needed goes, one more step at every message
        prev, hits, misses = None, 0, 0
        conv = list(msgs)
        for i in range(60):
            conv += [
                {"role": "assistant", "content": f"call {i} " * 2},
                {"role": "tool", "content": f"result {i} " * 2},
            ]
            fitted, fits = fit_budget(
                conv,
                [MV],
                tool_format="compact",
                budget=800,
                counter=TokenCounter.for_tokenizer(tokenizer),
                drop_block=block,
            )
            assert fits and fitted[0]["content"].endswith("one request")
            text = tokenizer.apply_chat_template(to_wire(fitted, [MV], "compact"), tokenize=False)
            if prev is not None and "omitted]" in text:
                hits, misses = (hits + 1, misses) if text.startswith(prev) else (hits, misses + 1)
            prev = text
        extends[block] = (hits, misses)
    assert extends[1][0] == 0 and extends[1][1] > 20, extends  # every message pushed out one more
    hits, misses = extends[None]
    assert hits >= 2 * misses and misses >= 2, extends  # blocks of 200 tokens, steps of ~37: a new cut every ~5


def test_a_long_turn_of_calls_keeps_the_system_message(tokenizer):
    """A turn of many short calls and errors (what a weak policy does until the step limit) fits
    by dropping its oldest steps: the prompt is never cut from the left, so it always opens with
    the system message, and each prompt extends the one before it except where a block of old
    steps goes (the estimate counts the wire's tool-response wrappers)."""
    conv = [{"role": "user", "content": "Please move the report into the temp folder."}]
    prev, extended, dropped = None, 0, 0
    for i in range(40):
        call = f'<tool_call>{{"name": "mv", "arguments": {{"source": "r{i}.txt"}}}}</tool_call>'
        conv += [
            {"role": "assistant", "content": call},
            {"role": "tool", "content": "Error during execution: mv() missing 1 required positional argument"},
        ]
        p = render_prompt(conv, [MV], tokenizer, tool_format="compact", max_context_tokens=1024, max_new_tokens=64)
        assert not p.context_limit, i
        assert len(p.ids) <= 1024 - 64 and p.text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT)
        if prev is not None:
            extended, dropped = (extended + 1, dropped) if p.ids[: len(prev)] == prev else (extended, dropped + 1)
        prev = p.ids
    assert dropped >= 2 and extended >= 2 * dropped, (extended, dropped)


def test_the_default_drop_block_recomputes_about_half_what_a_quarter_of_the_budget_did(tokenizer, monkeypatch):
    """Where a block of old steps goes, the next prompt is computed again after the system
    message; the default block (two thirds of the room) makes that rarer and shorter. Counted
    as a prompt cache would: each prompt's tokens past its common prefix with the one before."""
    from coevolve.policy import prompts

    def computed(drop_block) -> int:
        monkeypatch.setattr(prompts, "_drop_block", drop_block)
        conv = [{"role": "user", "content": "Please move the report into the temp folder."}]
        prev: list[int] = []
        total = newest_kept = 0
        for i in range(60):
            call = (
                f'<tool_call>{{"name": "mv", "arguments": {{"source": "r{i}.txt", "destination": "tmp"}}}}</tool_call>'
            )
            conv += [{"role": "assistant", "content": call}, {"role": "tool", "content": "moved " + "x" * (i % 7 * 20)}]
            p = render_prompt(conv, [MV], tokenizer, tool_format="compact", max_context_tokens=1024, max_new_tokens=64)
            assert not p.context_limit and p.text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT)
            newest_kept += call in p.text
            same = next((k for k, (a, b) in enumerate(zip(p.ids, prev)) if a != b), min(len(p.ids), len(prev)))
            total += len(p.ids) - same
            prev = p.ids
        assert newest_kept == 60, "the newest step is never dropped"
        return total

    default = computed(prompts._drop_block)
    quarter = computed(lambda budget, fixed: budget // 4)
    assert default < 0.6 * quarter, (default, quarter)


def test_bench_prompts_splits_a_runs_prompt_tokens_into_first_extend_and_after_a_drop(tmp_path):
    from coevolve.bench.prompts import prompt_costs
    from coevolve.store import Store

    system, ask = [1, 2, 3, 4, 5, 6], [7, 8]

    def row(episode, step, prompt, answer):
        return {
            "phase": "eval",
            "episode_id": episode,
            "turn": 0,
            "step": step,
            "prompt_ids": prompt,
            "completion_ids": answer,
        }

    rows = [
        row("a", 0, system + ask, [20, 21, 99]),
        row("a", 1, system + ask + [20, 21, 99, 30, 31], [22, 99]),  # extends: 2 new tokens
        row("a", 2, system + [50, 30, 31, 22, 99, 32], [23, 99]),  # old messages dropped: all after the system
        row("b", 0, system + [9], [24, 99]),  # another episode's opening shares the system message
        {"phase": "eval", "episode_id": "b", "turn": 0, "step": 1, "action_name": "ls"},  # a call's second row
    ]
    store = Store(str(tmp_path / "s"))
    store.write("rollouts", 1, "run-eval", rows)
    [cost] = prompt_costs(store)
    assert (cost["round"], cost["phase"], cost["prompts"]) == (1, "eval", 4)
    assert (cost["first"], cost["first tokens"]) == (2, 8 + 1)
    assert (cost["extend"], cost["extend tokens"]) == (1, 2)
    assert (cost["after a drop"], cost["after a drop tokens"]) == (1, 6)
    assert cost["prompt_tokens"] == 8 + 13 + 12 + 7
    assert cost["completion_tokens"] == 3 + 2 + 2 + 2, "a call's second row holds no answer of its own"
