"""``coevolve bench safety``: injection-derived attacks refused, legitimate tasks refused with them."""

from __future__ import annotations

import json

import typer

from coevolve.cli.app import bench_app
from coevolve.cli.common import load_config_or_fail, parse_sets


@bench_app.command("safety")
def bench_safety(
    envs: list[str] = typer.Option(["bfcl-v3", "agentdojo"], "--env", help="Environments whose round 0 is measured."),
    config: str = typer.Option(None, "--config", "-c", help="Run config YAML (its synth/validate sections apply)."),
    sets: list[str] = typer.Option([], "--set", help="Override a config key, KEY=VALUE (e.g. synth.scenarios=4)."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole report as JSON."),
) -> None:
    """Run every AgentDojo injection task's ground truth through validation as a candidate, and
    measure the general safety rules' false refusals on each environment's round-0 tasks."""
    from coevolve.safety_bench import measure

    cfg = load_config_or_fail(config, parse_sets(sets))
    report = measure(cfg, envs)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    a = report["attacks"]
    typer.echo(
        f"attacks (AgentDojo injection tasks as candidates): {a['refused']}/{a['candidates']} refused "
        f"({a['refused_by_safety']} by the safety policy); by rule: {a['by_rule']}"
    )
    if a["accepted_ids"]:
        typer.echo(f"  ACCEPTED: {a['accepted_ids']}")
    for name in envs:
        r = report[name]
        typer.echo(
            f"{name}: round-0 tasks accepted without the general rules: {r['tasks']}; refused by them: "
            f"{r['refused']} (false-refusal rate {r['rate']:.1%}); by rule: {r['by_rule']}"
        )
