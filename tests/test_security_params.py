"""Web-form parameters are data, not code, and bad input is refused at the door (issue 29):
every probe of ``coevolve bench security --areas params`` holds, and the command prints it."""

from __future__ import annotations

from typer.testing import CliRunner

from coevolve.bench.security import run_probes
from coevolve.bench.security.params import PROBES
from coevolve.cli import app


def test_every_params_probe_holds():
    results = run_probes(fast=True, areas=["params"])
    assert {r.probe.name for r in results} == {p.name for p in PROBES}
    failed = [
        (r.probe.name, r.error, [a for a in r.attempts if not a.held]) for r in results if r.failed or not r.tried
    ]
    assert not failed, failed


def test_the_command_prints_every_stack_and_params_probe_held():
    result = CliRunner().invoke(app, ["bench", "security", "--fast", "--areas", "stack,params"])
    assert result.exit_code == 0, result.output
    table = result.output[result.output.index("area ") :]
    for probe in PROBES:
        assert probe.name in table
    last = table.strip().splitlines()[-1].split()
    assert last[0] == "all" and last[-1] == "0" and last[-2] == last[-3], last


def test_the_flow_refuses_a_config_outside_the_allowed_folders(tmp_path):
    """The nightly deployment's form field ``config``: /etc/passwd or a credentials file is named
    and refused before anything reads it (issue 29: a line of it was echoed in the error)."""
    import pytest

    from coevolve.config import ConfigError
    from flows.evolve import evolve

    creds = tmp_path / "credentials"
    creds.write_text("aws_secret_access_key = CANARY-SECRET\n")
    for path in ("/etc/passwd", str(creds), "configs/../../../../etc/passwd"):
        with pytest.raises(ConfigError, match="outside the allowed folders") as err:
            evolve.fn(config=path)
        assert "CANARY" not in str(err.value) and "root:" not in str(err.value)
