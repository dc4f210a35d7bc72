"""``coevolve bench floor``: the least time a run's model work can take on this machine, from
the work its store logged, next to the time each stage took.

    coevolve bench floor --store /work/runs/r1
    rows = work_floor(store, "smollm2")     # one dict per round and stage (FLOPs, no timing)

A local backend's model work is matrix products: over the model's weights, and attention's
over each token's context. The store says how many tokens each stage put through them:

- generation (training rollouts, validation's pass 2, evaluation): the prompt tokens a prefix
  cache computes (``coevolve.bench.prompts.prompt_costs``), the tokens sampled
  (``completion_ids``) and the keys the tokens fed attend to (``attended_keys``);
- the GRPO update: ``train_steps.n_computed_tokens`` (a shared prompt counted once) and
  ``n_attended_keys`` (0 in a store written before that column: the update's attention is
  then not counted).

A token fed costs at least 2 FLOPs per projection weight forward (``limits.linear_params``),
and each sampled token its output head (``limits.head_params``); a message's last sampled
token is not fed back. An update token with LoRA costs 4 per projection weight (forward, and
its activations' gradient backward; 6 when all weights train). Each attended key costs 4 FLOPs
per unit of the query width (``limits.attention_width``) forward, 12 in an update (forward and
backward, nothing recomputed). Norms, the heads of prompt tokens, softmax and everything else
are left out, so the figure is a lower bound: divided by the rate a large matrix product
reaches on this machine in the run's precision (``limits.matmul_flops``), it is a time no
implementation of the same work can beat here. The SFT warm start is not counted (its tokens
are not logged): compare the floor with the stage times without ``t_train_sft``.
"""

from __future__ import annotations

from typing import Any

from coevolve.bench.prompts import KINDS, prompt_costs

# Each stage whose model work the store logs: (stage, rollouts phase or None for the update,
# the ``rounds`` columns that time that work).
STAGES = (
    ("train rollouts", "train", ("t_train_rollouts",)),
    ("train update", None, ("t_train_update",)),
    ("validate pass 2", "validate", ("t_validate_pass2",)),
    ("evaluate", "eval", ("t_evaluate_prefill", "t_evaluate_decode")),
)


def work_floor(store: Any, model: Any, *, lora: bool = True) -> list[dict[str, Any]]:
    """Per round (1 on) and stage of ``STAGES``: ``round``, ``stage``, ``prefill_tokens`` (prompt
    tokens computed), ``decode_tokens`` (sampled), ``update_tokens`` (computed by the update),
    ``attended_keys``, ``flops`` (their lower bound, see the module docstring) and
    ``attention_flops`` (attention's part of it), for ``model`` (a name or a config). Rounds
    without model work (round 0) are left out."""
    from coevolve.bench.limits import attention_width, head_params, linear_params

    linear, head, width = linear_params(model), head_params(model), attention_width(model)
    generated = {(r["round"], r["phase"]): r for r in prompt_costs(store)}
    updates: dict[int, list[int]] = {}  # round -> [tokens computed, keys attended]
    for r in store.read("train_steps", columns=["round", "n_computed_tokens", "n_attended_keys"]).to_pylist():
        totals = updates.setdefault(r["round"], [0, 0])
        totals[0] += r["n_computed_tokens"] or 0
        totals[1] += r["n_attended_keys"] or 0
    rounds = sorted({r for r, _ in generated} | set(updates))
    out = []
    for round_no in rounds:
        for stage, phase, _ in STAGES:
            prefill = decode = update = keys = 0
            if phase is None:
                update, keys = updates.get(round_no, (0, 0))
                attention = 12 * width * keys
                flops = (4 if lora else 6) * linear * update + attention
            else:
                messages = 0
                if (round_no, phase) in generated:
                    cost = generated[(round_no, phase)]
                    prefill = sum(cost[f"{kind} tokens"] for kind in KINDS)
                    decode, keys, messages = cost["completion_tokens"], cost["attended_keys"], cost["prompts"]
                attention = 4 * width * keys
                flops = 2 * linear * (prefill + max(decode - messages, 0)) + 2 * head * decode + attention
            out.append(
                {
                    "round": round_no,
                    "stage": stage,
                    "prefill_tokens": prefill,
                    "decode_tokens": decode,
                    "update_tokens": update,
                    "attended_keys": keys,
                    "flops": flops,
                    "attention_flops": attention,
                }
            )
    return out


def stage_seconds(store: Any) -> dict[tuple[int, str], float]:
    """The measured seconds of each (round, stage) of ``STAGES``, from the ``rounds`` table (the
    sum of the stage's columns; missing where a column is null)."""
    out: dict[tuple[int, str], float] = {}
    for r in store.read("rounds").to_pylist():
        for stage, _, columns in STAGES:
            values = [r.get(c) for c in columns]
            if all(v is not None for v in values):
                out[(r["round"], stage)] = float(sum(values))
    return out
