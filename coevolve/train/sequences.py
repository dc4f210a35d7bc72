"""Episodes -> training tensors: token ids plus the mask of the tokens the model wrote.

GRPO trains on exactly what was sampled (``episode_sequences``): each model message's
rollout row holds its prompt ids as fed, its sampled ids and their behaviour log-probs
(``coevolve.rollout``); an episode's messages are chained into one sequence while each
prompt extends the sequence so far (the local policy renders a conversation with the ids it
generated, so it does), and a new sequence starts where it does not (the prompt budget
dropped old messages, or the sequence would pass ``max_tokens``). Nothing is re-tokenized
and no token is added: a message cut by the budget ends where it was cut, and the end token
the template adds after it is context of the next prompt, not a trained token.

    seqs = episode_sequences(result.steps, max_tokens=1536)       # [TokenSequence, ...]

SFT warm-start chats (reference calls replayed, never sampled) are rendered instead
(``encode_chat``). An episode's chat is rendered with the same chat template the policy prompts with, piece
by piece: everything up to an assistant message (rendered with the generation prompt, as
at sampling time) is context (mask 0); the assistant message that follows is the model's
output (mask 1) up to and including its end-of-turn token; tool observations, later user
turns and the template's glue are context again. Each piece is tokenized on its own, the
way generation saw it: the prompt was tokenized, then the model appended its tokens.

    ids, mask = encode_chat(tokenizer, messages, wire_renderer(tokenizer, tools, "compact"))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


Render = Callable[[list[dict[str, Any]], bool], str]


def wire_renderer(tokenizer: Any, tools: list[dict[str, Any]], tool_format: str) -> Render:
    """``render(messages, add_generation_prompt) -> text`` exactly as the local policy prompts:
    coevolve's wire messages (system prompt with the tool block, tool results as user
    ``<tool_response>`` blocks; ``coevolve.policy.prompts.to_wire``) through the chat template."""
    from coevolve.policy.prompts import to_wire

    def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        wire = to_wire(messages, tools, tool_format)
        return tokenizer.apply_chat_template(wire, tokenize=False, add_generation_prompt=add_generation_prompt)

    return render


def encode_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    render: Render,
    max_tokens: int | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids of the whole chat and the mask of assistant-written tokens (1) vs context (0).

    ``render(messages[:k], add_generation_prompt)`` must render prefixes consistently (each
    rendering with the generation prompt is a prefix of the rendering with the next assistant
    message), which holds for ChatML/Qwen/SmolLM2 templates; otherwise ValueError.
    Tokens after the assistant's end-of-turn token (a trailing newline) count as context.
    ``max_tokens`` keeps the last ``max_tokens`` tokens (an over-long episode loses its start).
    """
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    mask: list[int] = []
    done = ""  # text rendered so far

    def add(text: str, is_model: bool) -> None:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        flags = [0] * len(piece)
        if is_model:
            end = len(piece)
            if eos in piece:
                end = len(piece) - piece[::-1].index(eos)
            flags = [1] * end + [0] * (len(piece) - end)
        ids.extend(piece)
        mask.extend(flags)

    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = render(messages[:k], True)
        full = render(messages[: k + 1], False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise ValueError(
                "the chat template does not render prefixes consistently at message "
                f"{k}; cannot tell the model's tokens apart"
            )
        add(prompt[len(done) :], False)
        add(full[len(prompt) :], True)
        done = full
    if max_tokens is not None and len(ids) > max_tokens:
        ids, mask = ids[-max_tokens:], mask[-max_tokens:]
    return ids, mask


@dataclass
class TokenSequence:
    """One training sequence of sampled tokens: ``mask[i] = 1`` where ``ids[i]`` was sampled,
    ``logprobs[i]`` its behaviour log-prob there (0 elsewhere); ``messages`` counts the model
    messages it holds."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    messages: int = 0

    def add(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        self.ids += ids
        self.mask += [int(sampled)] * len(ids)
        self.logprobs += list(logprobs) if sampled and logprobs is not None else [0.0] * len(ids)


def episode_sequences(rows: list[dict[str, Any]], max_tokens: int) -> list[TokenSequence]:
    """The training sequences of one episode from its rollout rows (see the module docstring).

    ``rows``: the episode's ``rollouts`` rows in order; those with ``completion_ids`` are its
    model messages. A message whose own prompt and completion pass ``max_tokens`` keeps the
    last ``max_tokens`` tokens of its prompt (its log-probs are then conditioned on less than
    at sampling time; the ratio's clip bounds the effect). ValueError when a model message has
    no ids (a backend that does not return them cannot be trained on its samples).
    """
    out: list[TokenSequence] = []
    cur: TokenSequence | None = None
    for row in rows:
        completion = row.get("completion_ids")
        if completion is None:
            if row.get("n_tokens"):
                raise ValueError(
                    f"episode {row.get('episode_id')!r}: a model message has no sampled token ids "
                    "(policy backends that do not return them cannot be trained on locally)"
                )
            continue
        prompt = list(row.get("prompt_ids") or [])
        completion = list(completion)
        logprobs = list(row.get("completion_logprobs") or [])
        if len(logprobs) != len(completion):
            raise ValueError(
                f"episode {row.get('episode_id')!r}: {len(completion)} sampled ids but "
                f"{len(logprobs)} behaviour log-probs"
            )
        n = len(cur.ids) if cur is not None else 0
        if (
            cur is not None
            and len(prompt) >= n
            and prompt[:n] == cur.ids
            and len(prompt) + len(completion) <= max_tokens
        ):
            cur.add(prompt[n:], False)
        else:
            cur = TokenSequence()
            out.append(cur)
            room = max(0, max_tokens - len(completion))
            cur.add(prompt[-room:] if room else [], False)
            completion, logprobs = completion[:max_tokens], logprobs[:max_tokens]
        cur.add(completion, True, logprobs)
        cur.messages += 1
    return [s for s in out if any(s.mask)]
