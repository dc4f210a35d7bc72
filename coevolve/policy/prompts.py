"""Chat formatting for tool-calling agents: tool schemas, system prompt, history, token budget.

A conversation is kept as plain chat messages (``system`` / ``user`` / ``assistant`` /
``tool``). Before it reaches a model it becomes *wire messages* that every chat template
understands: the system message carries the tool block, assistant messages carry their raw
text (with ``<tool_call>`` blocks), and consecutive ``tool`` messages become one ``user``
message of ``<tool_response>`` blocks, exactly as Qwen2.5's template renders them.

Tool formats (``tool_format``):

- ``json``: the Hermes / Qwen block, one JSON schema per line inside ``<tools></tools>``
  (what Qwen-scale models were trained on; 3-7k tokens per BFCL entry);
- ``compact``: one line per function, ``name(arg: type, opt: type=?) - summary``
  (~300-850 tokens per BFCL class; the CPU default).

Token budget rule (``fit_budget``), applied in this order until the prompt fits
``max_context_tokens - max_new_tokens``:

1. every tool observation is cut to its first ``max_observation_tokens`` tokens
   (default: a quarter of the prompt budget) with a ``[... truncated N tokens]`` note;
2. the oldest messages of earlier turns are dropped, whole turns first (a turn starts at a
   ``user`` message), and a ``[N earlier messages omitted]`` note is put in their place;
3. the oldest steps (assistant message + its tool responses) of the current turn are dropped.

   Steps 2 and 3 free room in blocks of ``drop_block`` tokens (default: two thirds of the
   room the system message leaves, ``DROP_SHARE``): the overflow is rounded up to a whole
   block before messages go. So once a conversation passes the budget, the next messages
   drop the same old ones and each prompt still extends the one before it, and the policy's
   prompt cache computes only the new tokens, instead of recomputing every prompt after the
   system message once every new message pushes out one more old message. Where a block goes,
   the next prompt recomputes what is kept after the system message: a third of the room per
   two thirds of new messages (a quarter of the budget made it ~1.3x the new messages);
4. if the system message and the current user message alone still do not fit, the
   caller cuts the prompt from the left and reports ``finish_reason="context_limit"``.

The sizes are counted as the messages render (a tool result inside its ``<tool_response>``
wrapper, room for the omitted-messages note); ``render_prompt`` checks the rendered ids and,
where tokens merged across message boundaries still make them too long, fits again to a budget
smaller by the excess, so that a conversation is never cut from the left while dropping old
messages can make it fit (a cut prompt loses its system message, and every later prompt of
the episode would be computed whole).

The system message and the current turn's user message are never dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from coevolve.policy.base import Message

SYSTEM_PROMPT = (
    "You are a helpful assistant that completes the user's requests by calling the available "
    "functions. Call functions one step at a time and read their results before going on. "
    "When the request is complete, or no function fits, answer in plain text without a call."
)

_CALL_HINT = (
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)

# Per-message framing tokens of ChatML (<|im_start|>role\n ... <|im_end|>\n), for estimates.
_MESSAGE_OVERHEAD = 5
# Room kept for the "[N earlier messages omitted]" note when messages are dropped.
_NOTE_TOKENS = 16


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """The function schema of an OpenAI-style tool ({"type": "function", "function": {...}}) or a bare one."""
    return tool.get("function", tool) if isinstance(tool, dict) else {}


def _type_name(spec: dict[str, Any]) -> str:
    t = spec.get("type", "any")
    if isinstance(t, list):
        t = "|".join(str(x) for x in t)
    if t == "array" and isinstance(spec.get("items"), dict) and "type" in spec["items"]:
        return f"array[{_type_name(spec['items'])}]"
    if spec.get("enum") and len(spec["enum"]) <= 6:
        return f"{t}{{{'|'.join(str(v) for v in spec['enum'])}}}"
    return str(t)


def _summary(description: str, limit: int = 120) -> str:
    # BFCL descriptions open with "This tool belongs to the X API ..."; the useful part follows.
    text = description.split("Tool description:", 1)[-1].strip()
    first = text.split(". ", 1)[0].strip().rstrip(".")
    return first if len(first) <= limit else first[: limit - 3] + "..."


def compact_signature(tool: dict[str, Any]) -> str:
    """``name(arg: type, opt: type=?) - summary`` for one function schema."""
    fn = _function(tool)
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    args = [
        f"{k}: {_type_name(v if isinstance(v, dict) else {})}{'' if k in required else '=?'}" for k, v in props.items()
    ]
    line = f"{fn.get('name', '?')}({', '.join(args)})"
    summary = _summary(str(fn.get("description", "")))
    return f"{line} - {summary}" if summary else line


def render_tools(tools: list[dict[str, Any]], tool_format: str) -> str:
    """The tool block appended to the system prompt ("" when there are no tools)."""
    if not tools:
        return ""
    return _TOOL_RENDERERS[tool_format](tools)


def _render_json(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps({"type": "function", "function": _function(t)}) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{lines}\n</tools>\n\n"
        + _CALL_HINT
    )


def _render_compact(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(compact_signature(t) for t in tools)
    return (
        "# Tools\n\nYou may call one or more of these functions (arguments marked =? are optional):\n"
        f"{lines}\n\n" + _CALL_HINT
    )


_TOOL_RENDERERS: dict[str, Callable[[list[dict[str, Any]]], str]] = {"json": _render_json, "compact": _render_compact}


def system_message(messages: list[Message], tools: list[dict[str, Any]], tool_format: str) -> Message:
    """The wire system message: the conversation's system prompt (or the default) + the tool block."""
    base = messages[0]["content"] if messages and messages[0]["role"] == "system" else SYSTEM_PROMPT
    block = render_tools(tools, tool_format)
    return {"role": "system", "content": f"{base}\n\n{block}" if block else base}


def to_wire(messages: list[Message], tools: list[dict[str, Any]], tool_format: str) -> list[Message]:
    """Conversation -> wire messages (system with tools; tool results as one user message per run)."""
    wire = [system_message(messages, tools, tool_format)]
    for msg in messages:
        role = msg["role"]
        if role == "system":
            continue
        content = msg.get("content") or ""
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if wire[-1].get("_tool"):
                wire[-1]["content"] += "\n" + block
            else:
                wire.append({"role": "user", "content": block, "_tool": True})
        else:
            wire.append({"role": role, "content": content})
    for w in wire:
        w.pop("_tool", None)
    return wire


# --------------------------------------------------------------------------- token budget
# How often render_prompt fits a conversation again when its rendering came out over the estimate.
_REFITS = 3
# Share of the room after the system message freed at once when a conversation outgrows its
# budget (``fit_budget``'s default ``drop_block``): each drop makes the next prompt recompute what
# is kept, (1 - share) of the room, once per share of the room of new messages.
DROP_SHARE = 2 / 3


@dataclass
class TokenCounter:
    """How a backend counts and cuts text: exact with a tokenizer, estimated without one."""

    count: Callable[[str], int]
    cut: Callable[[str, int], str]  # keep the first n tokens of a text

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> "TokenCounter":
        def count(text: str) -> int:
            return len(tokenizer.encode(text, add_special_tokens=False))

        def cut(text: str, n: int) -> str:
            return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)[:n])

        return cls(count, cut)

    @classmethod
    def estimate(cls, chars_per_token: float = 3.0) -> "TokenCounter":
        """Character-based estimate (3 chars/token errs on the long side for English and JSON)."""
        return cls(lambda t: int(len(t) / chars_per_token) + 1, lambda t, n: t[: int(n * chars_per_token)])


def _truncate_observation(msg: Message, limit: int, counter: TokenCounter) -> Message:
    content = msg.get("content") or ""
    # Cheap pre-check: no tokenizer gives more tokens than characters + 1.
    if len(content) <= limit:
        return msg
    n = counter.count(content)
    if n <= limit:
        return msg
    return {**msg, "content": counter.cut(content, limit) + f"\n[... truncated {n - limit} tokens]"}


def _wire_size(msg: Message, counter: TokenCounter) -> int:
    """Tokens ``msg`` takes in the rendered prompt: its content with ChatML framing, a tool
    result inside the ``<tool_response>`` wrapper ``to_wire`` puts around it (a run of results
    shares one framed message, so this errs on the long side)."""
    content = msg.get("content") or ""
    if msg["role"] == "tool":
        content = f"<tool_response>\n{content}\n</tool_response>"
    return counter.count(content) + _MESSAGE_OVERHEAD


def _fixed_size(system: list[Message], tools: list[dict[str, Any]], tool_format: str, counter: TokenCounter) -> int:
    """Tokens of the part of a prompt that is never dropped: the system message (tool block
    included) with its framing and the generation prompt."""
    return counter.count(system_message(system, tools, tool_format)["content"]) + _MESSAGE_OVERHEAD + 3


def _drop_block(budget: int, fixed: int) -> int:
    return max(1, int((budget - fixed) * DROP_SHARE))


def _turn_starts(messages: list[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "user"]


def fit_budget(
    messages: list[Message],
    tools: list[dict[str, Any]],
    *,
    tool_format: str,
    budget: int,
    counter: TokenCounter,
    max_observation_tokens: int | None = None,
    drop_block: int | None = None,
) -> tuple[list[Message], bool]:
    """Apply the truncation rule (module docstring, steps 1-3) to a conversation.

    Returns ``(messages, fits)``: the shortened conversation (same roles, never the system
    message or the current user message removed) and whether its estimate fits ``budget``
    prompt tokens. The estimate sums per-message tokens plus ChatML framing. Messages are
    dropped until the estimate fits ``budget`` less the overflow's round-up to a multiple of
    ``drop_block`` tokens (default ``DROP_SHARE`` of the room after the system message; 1 drops
    no more than needed).
    """
    obs_limit = max_observation_tokens or max(32, budget // 4)
    msgs = [_truncate_observation(m, obs_limit, counter) if m["role"] == "tool" else m for m in messages]
    system = [m for m in msgs[:1] if m["role"] == "system"]
    body = msgs[len(system) :]
    fixed = _fixed_size(system, tools, tool_format, counter)
    sizes = [_wire_size(m, counter) for m in body]
    total = fixed + sum(sizes)
    if total <= budget:
        return msgs, True
    block = max(1, drop_block or _drop_block(budget, fixed))
    # the overflow, rounded up to whole blocks, and room for the note that says what went
    target = total - -(-(total - budget) // block) * block - _NOTE_TOKENS

    starts = _turn_starts(body)
    current = starts[-1] if starts else 0
    # Step 2: drop earlier turns' messages, oldest first, whole turns before partial ones.
    drop = 0
    while drop < current and total > target:
        total -= sizes[drop]
        drop += 1
    if 0 < drop < current:
        # Do not leave a turn's tail (assistant/tool messages without their user message).
        nxt = next(s for s in starts if s >= drop)
        total -= sum(sizes[drop:nxt])
        drop = nxt
    kept = body[drop:]
    sizes = sizes[drop:]
    # Step 3: drop the current turn's oldest steps (an assistant message and the tool messages after it).
    cur = current - drop
    while total > target and cur + 1 < len(kept):
        end = cur + 2
        while end < len(kept) and kept[end]["role"] == "tool":
            end += 1
        if end == len(kept) and total <= budget - _NOTE_TOKENS:
            break  # the newest step stays where only the round-up to a whole block would drop it
        total -= sum(sizes[cur + 1 : end])
        kept = kept[: cur + 1] + kept[end:]
        sizes = sizes[: cur + 1] + sizes[end:]
        drop += end - (cur + 1)
    if drop:
        note = f"[{drop} earlier messages omitted]"
        if kept and kept[0]["role"] == "user":
            kept[0] = {**kept[0], "content": f"{note}\n\n{kept[0].get('content') or ''}"}
        else:
            kept.insert(0, {"role": "user", "content": note})
    return system + kept, total <= budget


@dataclass
class Prompt:
    ids: list[int]  # token ids of the rendered prompt (generation prompt included)
    text: str
    context_limit: bool  # the budget rule could not make it fit; ids were cut from the left


def render_prompt(
    messages: list[Message],
    tools: list[dict[str, Any]],
    tokenizer: Any,
    *,
    tool_format: str,
    max_context_tokens: int,
    max_new_tokens: int,
    max_observation_tokens: int | None = None,
    assistant_ids: Mapping[str, list[int]] | None = None,
) -> Prompt:
    """Render a conversation for a local model with its chat template, within the token budget.

    ``assistant_ids`` maps assistant texts to the token ids the model generated for them:
    those ids are used as they are instead of re-tokenizing the text, which may split it
    differently (the model's own tokens are what it saw, and what its KV cache holds).
    """
    budget = max(16, max_context_tokens - max_new_tokens)
    counter = TokenCounter.for_tokenizer(tokenizer)
    system = [m for m in messages[:1] if m["role"] == "system"]
    block = _drop_block(budget, _fixed_size(system, tools, tool_format, counter))  # the same blocks when refitting
    target = budget
    for _ in range(_REFITS):
        msgs, _ = fit_budget(
            messages,
            tools,
            tool_format=tool_format,
            budget=target,
            counter=counter,
            max_observation_tokens=max_observation_tokens or max(32, budget // 4),
            drop_block=block,
        )
        wire = to_wire(msgs, tools, tool_format)
        text = tokenizer.apply_chat_template(wire, tokenize=False, add_generation_prompt=True)
        answers = [m.get("content") or "" for m in msgs if m["role"] == "assistant"] if assistant_ids else []
        ids = encode_with_answers(text, tokenizer, [(a, assistant_ids[a]) for a in answers if a in assistant_ids])
        if len(ids) <= budget:
            break
        # the estimate fell short (tokens merge differently across message boundaries): fit again
        # to a budget smaller by the excess, in the same blocks, rather than cut the prompt's head
        target -= len(ids) - budget
    context_limit = len(ids) > budget
    if context_limit:
        ids = ids[-budget:]
    return Prompt(ids=ids, text=text, context_limit=context_limit)


def encode_with_answers(text: str, tokenizer: Any, answers: list[tuple[str, list[int]]]) -> list[int]:
    """Token ids of ``text`` where each known answer, found in order, keeps its own ids."""
    ids: list[int] = []
    at = 0
    for answer, answer_ids in answers:
        where = text.find(answer, at)
        if where < 0:  # the template changed it (e.g. stripped it): tokenize as text
            continue
        ids += tokenizer.encode(text[at:where], add_special_tokens=False) + list(answer_ids)
        at = where + len(answer)
    return ids + tokenizer.encode(text[at:], add_special_tokens=False)


def tokenize_for_training(
    messages: list[Message],
    tools: list[dict[str, Any]],
    tokenizer: Any,
    *,
    tool_format: str,
) -> tuple[list[int], list[int]]:
    """Token ids of a whole episode and a mask that is 1 on tokens the assistant generated.

    Each assistant message is rendered as the model saw it (prompt of the history before it,
    then its own text and end-of-turn marker), so the mask covers exactly what a policy
    gradient should train. Not budget-truncated: the trainer cuts long sequences itself.
    """
    ids: list[int] = []
    mask: list[int] = []
    done = ""
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        before = tokenizer.apply_chat_template(
            to_wire(messages[:k], tools, tool_format), tokenize=False, add_generation_prompt=True
        )
        after = tokenizer.apply_chat_template(to_wire(messages[: k + 1], tools, tool_format), tokenize=False)
        if not before.startswith(done) or not after.startswith(before):
            raise ValueError("the chat template does not render the conversation incrementally")
        for piece, label in ((before[len(done) :], 0), (after[len(before) :], 1)):
            piece_ids = tokenizer.encode(piece, add_special_tokens=False)
            ids += piece_ids
            mask += [label] * len(piece_ids)
        done = after
    return ids, mask
