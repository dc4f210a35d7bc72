"""The compose stack and the Ray manifests are closed by default (issue 29), checked without
docker-compose: the compose file is parsed and interpolated as compose does, given a test env.
(tests/test_infra.py checks what docker-compose itself resolves, where it is installed.)"""

from __future__ import annotations

import pytest

from coevolve.bench.security import run_probes
from coevolve.bench.security.stack import (
    COMPOSE,
    RAY_FILES,
    ComposeError,
    compose_problems,
    interpolate,
    published_ports,
    ray_problems,
    resolve_compose,
    throwaway_env,
)


def test_interpolation_follows_compose():
    env = {"A": "a", "EMPTY": ""}
    assert interpolate("${A} $A ${B:-d} ${EMPTY:-d} ${EMPTY-d} $$A", env) == "a a d d  $A"
    with pytest.raises(ComposeError, match="B.*set B"):
        interpolate("${B:?set B}", env)
    with pytest.raises(ComposeError, match="EMPTY"):
        interpolate("${EMPTY:?no}", env)


def test_the_stack_is_closed_by_default():
    raw = COMPOSE.read_text()
    spec = resolve_compose(raw, throwaway_env())
    assert compose_problems(spec, raw) == []
    ports = published_ports(spec)
    assert {(name, host) for name, host, _ in ports} == {("prefect-server", "127.0.0.1"), ("minio", "127.0.0.1")}
    assert "postgres" not in {name for name, _, _ in ports} and "worker-cpu" not in {name for name, _, _ in ports}
    server = spec["services"]["prefect-server"]["environment"]
    worker = spec["services"]["worker-cpu"]["environment"]
    assert (
        server["PREFECT_SERVER_API_AUTH_STRING"]
        and worker["PREFECT_API_AUTH_STRING"] == server["PREFECT_SERVER_API_AUTH_STRING"]
    )
    assert worker["AWS_ACCESS_KEY_ID"] != spec["services"]["minio"]["environment"]["MINIO_ROOT_USER"]


@pytest.mark.parametrize("secret", sorted(throwaway_env()))
def test_compose_refuses_to_start_without_each_secret(secret):
    env = {k: v for k, v in throwaway_env().items() if k != secret}
    with pytest.raises(ComposeError, match=secret):
        resolve_compose(COMPOSE.read_text(), env)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("${COEVOLVE_BIND:-127.0.0.1}:4200:4200", "4200:4200"), "every interface"),
        (
            (
                "${MINIO_ROOT_PASSWORD:?set MINIO_ROOT_PASSWORD in infra/.env (8+ characters)}",
                "${MINIO_ROOT_PASSWORD:-x}",
            ),
            "default",
        ),
        (("      PREFECT_SERVER_API_AUTH_STRING:", "      UNUSED_SETTING:"), "AUTH_STRING"),
        (("AWS_ACCESS_KEY_ID: ${COEVOLVE_S3_ACCESS_KEY:?", "AWS_ACCESS_KEY_ID: ${MINIO_ROOT_USER:?"), "root user"),
        (
            (
                "        mc mb --ignore-existing",
                "        mc mb --ignore-existing local/x || true\n        mc mb --ignore-existing",
            ),
            "'||'",
        ),
        (('entrypoint: ["/bin/sh", "-euc"]', 'entrypoint: ["/bin/sh", "-c"]'), "sh -e"),
    ],
)
def test_each_opening_is_found(change, problem):
    """The checks can fail: each way the stack was open (issue 29's list) is reported."""
    old, new = change
    raw = COMPOSE.read_text()
    assert old in raw
    raw = raw.replace(old, new)
    found = compose_problems(resolve_compose(raw, throwaway_env()), raw)
    assert any(problem in p for p in found), found


def test_ray_dashboards_listen_on_loopback(tmp_path):
    for path in RAY_FILES:
        assert ray_problems(path) == []
    opened = tmp_path / "open.yaml"
    opened.write_text(RAY_FILES[0].read_text().replace('dashboard-host: "127.0.0.1"', 'dashboard-host: "0.0.0.0"'))
    assert ray_problems(opened) == ["open.yaml: dashboard-host 0.0.0.0"]


def test_stack_probes_all_hold():
    results = run_probes(fast=True, areas=["stack"])
    assert results and all(r.tried and r.failed == 0 for r in results), [
        (r.probe.name, r.error, [a for a in r.attempts if not a.held]) for r in results
    ]
