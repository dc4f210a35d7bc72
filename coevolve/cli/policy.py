"""``coevolve serve`` and ``coevolve bench rollout``: the policy layer from the command line.

    coevolve serve --model tiny --port 8000                 # OpenAI-compatible API on loopback
    coevolve bench rollout --model tiny --episodes 32 --batch-size 8
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
    model: str = typer.Option("tiny", help="'tiny', 'smollm2' or a local Hugging Face directory."),
    env_name: str = typer.Option("bfcl-v3", "--env", help="Environment plug-in."),
    category: str = typer.Option("multi_turn_base", help="Task category of the environment."),
    episodes: int = typer.Option(32, help="Episodes per mode (tasks x samples)."),
    samples: int = typer.Option(4, help="Samples per task (the group size)."),
    batch_size: int = typer.Option(8, help="Episodes generated together in the batched mode."),
    max_new_tokens: int = typer.Option(96, help="Generation budget per assistant message (policy default)."),
    step_limit: int = typer.Option(3, help="Model messages per turn."),
    max_context_tokens: int = typer.Option(2048, help="Prompt + completion budget."),
    tool_format: str = typer.Option("compact", help="'compact' or 'json'."),
    threads: int = typer.Option(
        1, help="torch intra-op threads (0 = torch's default). 1 by default: on a shared 2-core machine "
                "two OpenMP threads spinning on each other's barriers make small models several times slower."),
    seed: int = typer.Option(0, help="Seed of the rollouts."),
) -> None:
    """Rollout engine throughput: batched vs one episode at a time, plus a same-seed replay check."""
    from coevolve.config import PolicyConfig
    from coevolve.policy import load_policy
    from coevolve.policy.base import SamplingParams
    from coevolve.registry import resolve
    from coevolve.rollout import run_episodes

    if episodes % samples:
        fail(f"--episodes ({episodes}) must be a multiple of --samples ({samples})")
    _set_threads(threads)
    env = resolve("environment", env_name)()
    tasks = env.load_tasks([category], limit=episodes // samples)
    cfg = PolicyConfig(model=model, max_context_tokens=max_context_tokens, tool_format=tool_format)
    cfg.validate()
    policy = load_policy(cfg)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)

    def measure(bs: int) -> tuple[list, float]:
        policy.prefix_cache.clear()  # every mode starts cold
        t = time.perf_counter()
        results = run_episodes(policy, env, tasks, n_samples=samples, sampling=sampling, step_limit=step_limit,
                               phase="eval", run_id="bench", round=0, batch_size=bs, seed=seed)
        return results, time.perf_counter() - t

    import torch

    console.print(f"{len(tasks)} {category} tasks x {samples} samples, model {model} ({policy.model_path}), "
                  f"{torch.get_num_threads()} threads, max_new_tokens {max_new_tokens}, step_limit {step_limit}")
    rows = []
    for label, bs in ((f"batched ({batch_size})", batch_size), ("one at a time", 1)):
        results, secs = measure(bs)
        tokens = sum(r.n_generated_tokens for r in results)
        steps = sum(len(r.steps) for r in results)
        rows.append((label, len(results), steps, tokens, secs, tokens / secs, results))
    base = rows[1][5]
    console.print(f"{'mode':<16}{'episodes':>9}{'rows':>7}{'gen tokens':>12}{'seconds':>9}{'tok/s':>9}{'speedup':>9}")
    for label, n, steps, tokens, secs, rate, _ in rows:
        console.print(f"{label:<16}{n:>9}{steps:>7}{tokens:>12}{secs:>9.1f}{rate:>9.1f}{rate / base:>8.2f}x")
    again, _ = measure(batch_size)
    same = [[m["content"] for m in r.messages] for r in again] == [[m["content"] for m in r.messages] for r in rows[0][6]]
    from coevolve.schemas import to_table

    table = to_table("rollouts", [row for r in again for row in r.steps])  # validates every row
    assistant = sum(1 for r in again for m in r.messages if m["role"] == "assistant")
    console.print(f"same seed, same rollouts (batched run repeated): {'yes' if same else 'NO'}; "
                  f"{table.num_rows} rollout rows for {assistant} model messages")
