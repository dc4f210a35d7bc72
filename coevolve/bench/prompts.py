"""``coevolve bench prompts``: where a run's prompt computation goes, from its logged prompts.

    coevolve bench prompts --store /work/runs/r1
    rows = prompt_costs(store)     # one dict per (round, phase)

Every model message's row in ``rollouts`` carries the exact prompt ids it was sampled from
and the ids it sampled. Replaying them through an idealized prefix cache (each prompt computes
its tokens past the longest prefix it shares with an earlier prompt + answer of its episode or
the first prompt of an earlier episode: the system message and tool block) splits the prompt
tokens a local backend computes into three kinds:

- **first**: an episode's first prompt (what a task's shared opening did not already hold);
- **extend**: a prompt that extends the previous prompt and answer (the new tool results and
  the next user turn): the work a conversation needs;
- **after a drop**: a prompt whose budget rule dropped old messages
  (``coevolve.policy.prompts``), so that everything after the system message is computed again.

The engine's own cache is bounded and batched, so its counts differ a little; the split is
what shows whether the drop rule, or the conversation itself, is what the prefill pays for.

Each token fed to the model also attends to every token before it and itself (causal
attention): a token at position p (0-based) reads p + 1 keys. ``attended_keys`` sums that over
the computed prompt tokens and the sampled ones fed back (all but a message's last, which ends
it): the measure of attention's work (``coevolve.bench.floor``), which grows with the
conversation's length where the projections' work grows only with its new tokens.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from coevolve.policy.prefix_cache import common_length
from coevolve.train.scoring import causal_keys

KINDS = ("first", "extend", "after a drop")


def prompt_costs(store: Any) -> list[dict[str, Any]]:
    """Per (round, phase): ``prompts``, ``prompt_tokens`` (all of them, as fed), ``completion_tokens``
    (the ids sampled after them), ``attended_keys`` (see the module docstring) and, for each kind
    of ``KINDS``, ``<kind>`` (prompts) and ``<kind> tokens`` (tokens computed)."""
    table = store.read(
        "rollouts", columns=["round", "phase", "episode_id", "turn", "step", "prompt_ids", "completion_ids"]
    )
    episodes: dict[tuple[int, str], dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in table.to_pylist():
        if r["prompt_ids"]:
            episodes[(r["round"], r["phase"])][r["episode_id"]].append(r)
    out = []
    for (round_no, phase), by_episode in sorted(episodes.items()):
        row: dict[str, Any] = {
            "round": round_no,
            "phase": phase,
            "prompts": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "attended_keys": 0,
        }
        row.update({k: 0 for kind in KINDS for k in (kind, f"{kind} tokens")})
        openings: list[list[int]] = []
        for episode in sorted(by_episode):
            steps = sorted(by_episode[episode], key=lambda r: (r["turn"], r["step"]))
            cached: list[list[int]] = []  # this episode's prompts, each with its answer
            for r in steps:
                ids = r["prompt_ids"]
                shared = max((common_length(ids, c) for c in cached + openings), default=0)
                if not cached:
                    kind = "first"
                else:  # an answer's last id (its stop token) may not be in the next prompt
                    kind = "extend" if shared >= len(cached[-1]) - 1 else "after a drop"
                row[kind] += 1
                row[f"{kind} tokens"] += len(ids) - shared
                row["prompts"] += 1
                row["prompt_tokens"] += len(ids)
                answer = list(r["completion_ids"] or [])
                row["completion_tokens"] += len(answer)
                row["attended_keys"] += causal_keys(shared, len(ids) + max(len(answer) - 1, 0))
                cached.append(ids + answer)
            openings.append(steps[0]["prompt_ids"])
        out.append(row)
    return out
