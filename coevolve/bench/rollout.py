"""``coevolve bench rollout``: generated tokens/s of the rollout engine, batched vs one episode at
a time, side by side, and a same-seed replay check.

    coevolve bench rollout                                  # SmolLM2, 8 episodes, batch 8 (about 3 minutes)
    coevolve bench rollout --model tiny --episodes 32       # the test model (seconds)
    bench(PolicyConfig(model="tiny"), episodes=8, samples=4, echo=print)   # the same, from Python

Each mode runs ``run_episodes`` on the same tasks and seed from a cold prefix cache, after a
warm-up outside the timings (the half-precision copy of the weights, kernel selection); the
batched run is then repeated to check that the same seed gives the same rollouts.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from coevolve.config import PolicyConfig


def bench(
    cfg: PolicyConfig,
    *,
    env_name: str = "bfcl-v3",
    category: str = "multi_turn_base",
    episodes: int = 8,
    samples: int = 4,
    batch_size: int = 8,
    max_new_tokens: int = 96,
    step_limit: int = 3,
    threads: int = 0,
    seed: int = 0,
    echo: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """Time ``episodes`` episodes (``episodes // samples`` tasks of ``category`` x ``samples``)
    batched by ``batch_size`` and one at a time; print the figures through ``echo``. Returns
    ``{"modes": [{"mode", "episodes", "tokens", "seconds", "tokens_per_s"}, ...], "same_seed_same_rollouts": bool}``.
    ``threads`` > 0 sets torch's intra-op threads; ``cfg`` must be valid (``cfg.validate()``)."""
    import torch

    from coevolve.policy import load_policy
    from coevolve.policy.base import SamplingParams
    from coevolve.policy.local import DecodeStats
    from coevolve.registry import resolve
    from coevolve.rollout import run_episodes

    if threads > 0:
        torch.set_num_threads(threads)
    env = resolve("environment", env_name)()
    tasks = env.load_tasks([category], limit=episodes // samples)
    policy = load_policy(cfg)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)

    def measure(bs: int) -> tuple[list, float, DecodeStats]:
        policy.prefix_cache.clear()  # every mode starts cold
        stats = policy.stats = DecodeStats()
        t = time.perf_counter()
        results = run_episodes(
            policy,
            env,
            tasks,
            n_samples=samples,
            sampling=sampling,
            step_limit=step_limit,
            phase="eval",
            run_id="bench",
            round=0,
            batch_size=bs,
            seed=seed,
        )
        return results, time.perf_counter() - t, stats

    dtype_name = str(policy.dtype).removeprefix("torch.")
    echo(
        f"{len(tasks)} {category} tasks x {samples} samples, model {cfg.model} ({policy.model_path}, "
        f"{dtype_name}), {torch.get_num_threads()} threads, max_new_tokens {max_new_tokens}, "
        f"step_limit {step_limit}"
    )
    # Warm up outside the timings: the half-precision copy of the weights, kernel selection.
    policy.generate([list(range(1, 33))] * 2, SamplingParams(temperature=1.0, max_new_tokens=4), [0, 1])
    rows = []
    for label, bs in ((f"batched ({batch_size})", batch_size), ("one at a time", 1)):
        results, secs, stats = measure(bs)
        tokens = sum(r.n_generated_tokens for r in results)
        rows.append((label, len(results), tokens, secs, tokens / secs, results, stats))
    base = rows[1][4]
    echo(
        f"{'mode':<15}{'eps':>4}{'tokens':>8}{'seconds':>9}{'tok/s':>8}{'speedup':>8}"
        f"{'prefill':>9}{'decode':>8}{'batch':>7}"
    )
    for label, n, tokens, secs, rate, _, st in rows:
        echo(
            f"{label:<15}{n:>4}{tokens:>8}{secs:>9.1f}{rate:>8.1f}{rate / base:>7.2f}x"
            f"{st.prefill_s:>8.1f}s{st.decode_s:>7.1f}s{st.row_steps / max(1, st.steps):>7.2f}"
        )
    st = rows[0][6]
    echo(
        f"tokens: generated; prefill/decode: seconds computing prompts / sampling tokens (the rest "
        f"is rendering, parsing, the environment); batch: mean rows per decoding step. "
        f"Batched: {st.prefill_tokens} prompt tokens computed, the rest found in the prefix cache; "
        f"{st.steps} decoding steps."
    )
    again, _, _ = measure(batch_size)
    same = [[m["content"] for m in r.messages] for r in again] == [
        [m["content"] for m in r.messages] for r in rows[0][5]
    ]
    from coevolve.schemas import to_table

    table = to_table("rollouts", [row for r in again for row in r.steps])  # validates every row
    assistant = sum(1 for r in again for m in r.messages if m["role"] == "assistant")
    echo(
        f"same seed, same rollouts (batched run repeated): {'yes' if same else 'NO'}; "
        f"{table.num_rows} rollout rows for {assistant} model messages"
    )
    return {
        "modes": [
            {"mode": label, "episodes": n, "tokens": tokens, "seconds": secs, "tokens_per_s": rate}
            for label, n, tokens, secs, rate, _, _ in rows
        ],
        "same_seed_same_rollouts": same,
    }
