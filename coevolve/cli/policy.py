"""``coevolve serve``: the policy layer from the command line (``coevolve bench rollout``, the
rollout engine's throughput, is in ``coevolve/cli/bench.py``).

coevolve serve --model tiny --port 8000                 # OpenAI-compatible API on loopback
"""

from __future__ import annotations

import typer

from coevolve.cli.app import app
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
