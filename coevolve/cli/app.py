"""The ``coevolve`` command-line application; subcommands live in sibling modules."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="coevolve",
    help="Co-evolve an LLM tool-calling agent and its training data.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(help="Benchmarks that print their figures side by side.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
