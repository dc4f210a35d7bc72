"""``coevolve serve`` and ``coevolve bench rollout``: the policy layer from the command line.

coevolve serve --model tiny --port 8000                 # OpenAI-compatible API on loopback
coevolve bench rollout                                  # SmolLM2, 8 episodes, batch 8 (about 3 minutes)
coevolve bench rollout --model tiny --episodes 32       # the test model (seconds)
    # generated tokens/s of the rollout engine, batched vs one episode at a time, side by side
"""

from __future__ import annotations

import time

import typer

from coevolve.cli.app import app, bench_app
from coevolve.cli.common import console, fail


def _set_threads(threads: int) -> None:
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


@app.command()
def serve(
    model: str = typer.Option("tiny", help="'tiny', 'smollm2' or a local Hugging Face directory."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (loopback by default)."),
    port: int = typer.Option(8000, help="TCP port."),
    max_batch: int = typer.Option(8, help="Requests generated together."),
    max_context_tokens: int = typer.Option(4096, help="Longest prompt + completion accepted."),
    threads: int = typer.Option(0, help="torch intra-op threads (0 = torch's default)."),
) -> None:
    """Serve a local model with the OpenAI chat-completions API (``/v1/chat/completions``)."""
    import uvicorn

    from coevolve.config import PolicyConfig
    from coevolve.policy.local import LocalPolicy
    from coevolve.serve import create_app

    _set_threads(threads)
    try:
        policy = LocalPolicy(PolicyConfig(model=model, max_context_tokens=max_context_tokens))
    except FileNotFoundError as exc:
        fail(str(exc))
    console.print(f"serving {policy.model_path} as {model!r} on http://{host}:{port}/v1")
    uvicorn.run(create_app(policy, model_name=model, max_batch=max_batch), host=host, port=port, log_level="warning")


@bench_app.command("rollout")
def bench_rollout(
    model: str = typer.Option("smollm2", help="'smollm2', 'tiny' or a local Hugging Face directory."),
    env_name: str = typer.Option("bfcl-v3", "--env", help="Environment plug-in."),
    category: str = typer.Option("multi_turn_base", help="Task category of the environment."),
    episodes: int = typer.Option(
        8, help="Episodes per mode (tasks x samples); 8 = the rollouts of one default GRPO step."
    ),
    samples: int = typer.Option(4, help="Samples per task (the group size)."),
    batch_size: int = typer.Option(8, help="Episodes generated together in the batched mode."),
    max_new_tokens: int = typer.Option(96, help="Generation budget per assistant message."),
    step_limit: int = typer.Option(3, help="Model messages per turn."),
    max_context_tokens: int = typer.Option(2048, help="Prompt + completion budget."),
    tool_format: str = typer.Option("compact", help="'compact' or 'json'."),
    dtype: str = typer.Option("auto", help="policy.dtype: 'auto', 'float32', 'bfloat16' or 'float16'."),
    threads: int = typer.Option(
        0,
        help="torch intra-op threads (0 = torch's default: one per core). 1 suits the tiny model, whose "
        "steps are too small to split across cores.",
    ),
    seed: int = typer.Option(0, help="Seed of the rollouts."),
) -> None:
    """Rollout engine throughput: batched vs one episode at a time, plus a same-seed replay check."""
    from coevolve.config import PolicyConfig
    from coevolve.policy import load_policy
    from coevolve.policy.base import SamplingParams
    from coevolve.policy.local import DecodeStats
    from coevolve.registry import resolve
    from coevolve.rollout import run_episodes

    if episodes % samples:
        fail(f"--episodes ({episodes}) must be a multiple of --samples ({samples})")
    _set_threads(threads)
    env = resolve("environment", env_name)()
    tasks = env.load_tasks([category], limit=episodes // samples)
    cfg = PolicyConfig(model=model, max_context_tokens=max_context_tokens, tool_format=tool_format, dtype=dtype)
    try:
        cfg.validate()
    except ValueError as exc:
        fail(str(exc))
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

    import torch

    dtype_name = str(policy.dtype).removeprefix("torch.")
    console.print(
        f"{len(tasks)} {category} tasks x {samples} samples, model {model} ({policy.model_path}, "
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
    console.print(
        f"{'mode':<15}{'eps':>4}{'tokens':>8}{'seconds':>9}{'tok/s':>8}{'speedup':>8}"
        f"{'prefill':>9}{'decode':>8}{'batch':>7}"
    )
    for label, n, tokens, secs, rate, _, st in rows:
        console.print(
            f"{label:<15}{n:>4}{tokens:>8}{secs:>9.1f}{rate:>8.1f}{rate / base:>7.2f}x"
            f"{st.prefill_s:>8.1f}s{st.decode_s:>7.1f}s{st.row_steps / max(1, st.steps):>7.2f}"
        )
    st = rows[0][6]
    console.print(
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
    console.print(
        f"same seed, same rollouts (batched run repeated): {'yes' if same else 'NO'}; "
        f"{table.num_rows} rollout rows for {assistant} model messages"
    )
