"""``coevolve serve``: the policy layer from the command line (``coevolve bench rollout``, the
rollout engine's throughput, is in ``coevolve/cli/bench.py``).

coevolve serve --model tiny --port 8000                 # OpenAI-compatible API on loopback
COEVOLVE_SERVE_API_KEY=... coevolve serve --host 0.0.0.0  # another interface: only with a key
"""

from __future__ import annotations

import typer

from coevolve.cli.app import app
from coevolve.cli.common import console, fail


def _is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or 'localhost'; 0.0.0.0, a LAN address or any other name is not."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _set_threads(threads: int) -> None:
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


@app.command()
def serve(
    model: str = typer.Option("tiny", help="'tiny', 'smollm2' or a local Hugging Face directory."),
    host: str = typer.Option(
        "127.0.0.1",
        help="Interface to listen on. Loopback by default; any other address needs --api-key "
        "(or --no-key-on-purpose, to serve a trusted network without one).",
    ),
    port: int = typer.Option(8000, help="TCP port."),
    api_key: str = typer.Option(
        "",
        envvar="COEVOLVE_SERVE_API_KEY",
        show_default=False,
        help="Require 'Authorization: Bearer <key>' on every path but /health (as vLLM's --api-key). "
        "Prefer the environment variable: a command line is visible to other users.",
    ),
    no_key_on_purpose: bool = typer.Option(
        False, "--no-key-on-purpose", help="Allow a non-loopback --host without --api-key."
    ),
    max_batch: int = typer.Option(8, min=1, help="Requests generated together."),
    max_context_tokens: int = typer.Option(4096, min=16, help="Longest prompt + completion accepted."),
    max_tokens: int = typer.Option(
        0, min=0, help="Largest max_tokens a request may ask for (0 = the model's context); more is HTTP 400."
    ),
    max_body_bytes: int = typer.Option(
        1 << 20, min=1, help="Largest request body; a larger one is HTTP 413, refused before it is read."
    ),
    threads: int = typer.Option(0, help="torch intra-op threads (0 = torch's default)."),
) -> None:
    """Serve a local model with the OpenAI chat-completions API (``/v1/chat/completions``)."""
    if not _is_loopback(host) and not api_key and not no_key_on_purpose:
        fail(
            f"--host {host} serves beyond this machine: give a key (--api-key or COEVOLVE_SERVE_API_KEY), "
            "or pass --no-key-on-purpose to serve a trusted network without one"
        )
    import uvicorn

    from coevolve.config import PolicyConfig
    from coevolve.policy.local import LocalPolicy
    from coevolve.serve import create_app

    _set_threads(threads)
    try:
        policy = LocalPolicy(PolicyConfig(model=model, max_context_tokens=max_context_tokens))
    except FileNotFoundError as exc:
        fail(str(exc))
    guarded = "with an API key" if api_key else "without an API key"
    console.print(f"serving {policy.model_path} as {model!r} on http://{host}:{port}/v1 ({guarded})")
    app_ = create_app(
        policy,
        model_name=model,
        max_batch=max_batch,
        api_key=api_key or None,
        max_body_bytes=max_body_bytes,
        max_tokens_limit=max_tokens or None,
    )
    uvicorn.run(app_, host=host, port=port, log_level="warning")
