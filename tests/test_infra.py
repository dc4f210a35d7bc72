"""The deployable stack in infra/ (issue 15): the compose file validates, compose's own resolution
of it is closed by default (issue 29: loopback ports, no default secret, Prefect's auth string, the
worker not MinIO's root), and a Prefect server on a real PostgreSQL (Debian's package, on loopback)
with the compose file's settings runs one tiny round through the nightly deployment. The same
checks without docker-compose: tests/test_security_stack.py.

Needs PostgreSQL's server binaries (`apt-get install postgresql`; `make setup` does it) and
docker-compose (Debian's `docker-compose`) for the validation; without them the tests are
skipped, unless COEVOLVE_REQUIRE_SERVICES=1 (.ci/run) makes them fail.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from prefect_helpers import FAST, running_prefect_server

from coevolve.bench.security.stack import compose_config, compose_problems, interpolate, throwaway_env
from coevolve.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COMPOSE = ROOT / "infra" / "docker-compose.yml"

pytestmark = pytest.mark.slow


def _need(what: str, found: bool) -> None:
    if found:
        return
    if os.environ.get("COEVOLVE_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{what} is not installed")
    pytest.skip(f"{what} is not installed")


def _compose_cmd() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation, with the stack's required secrets set to throwaway values."""
    return interpolate(value, {**throwaway_env(), **env})


def test_compose_file_validates_and_names_every_service():
    spec = yaml.safe_load(COMPOSE.read_text())
    assert {"postgres", "prefect-server", "minio", "minio-init", "worker-cpu"} <= set(spec["services"])
    assert spec["services"]["worker-cpu"]["build"]["dockerfile"] == "infra/worker-cpu.Dockerfile"
    for name in ("worker-cpu.Dockerfile", "worker-gpu.Dockerfile", "ray/raycluster.yaml", "ray/rayjob-verl.yaml"):
        assert (ROOT / "infra" / name).is_file(), name
    for name in ("ray/raycluster.yaml", "ray/rayjob-verl.yaml"):
        doc = yaml.safe_load((ROOT / "infra" / name).read_text())
        assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] in ("RayCluster", "RayJob")
    cmd = _compose_cmd()
    _need("docker-compose (or docker compose)", cmd is not None)
    env = {**os.environ, **throwaway_env()}
    done = subprocess.run(
        [*cmd, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    broken = COMPOSE.read_text().replace("    image: postgres:15\n", "    image: postgres:15\n    bogus_key: 1\n")
    with tempfile.NamedTemporaryFile("w", suffix=".yml", dir=COMPOSE.parent) as f:
        f.write(broken)
        f.flush()
        bad = subprocess.run([*cmd, "-f", f.name, "config", "-q"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode != 0  # the validation can fail


def test_compose_resolved_by_compose_is_closed_by_default(tmp_path):
    """Issue 29, read from what compose itself makes of the file: no port beyond loopback, Prefect's
    auth string set on the server and sent by the worker, the worker's S3 user not MinIO's root;
    and without the secrets compose refuses the file (no default secret)."""
    _need("docker-compose (or docker compose)", _compose_cmd() is not None)
    done = compose_config(throwaway_env(), tmp_path)
    assert done.returncode == 0, done.stderr
    resolved = yaml.safe_load(done.stdout)
    assert compose_problems(resolved) == []
    server = resolved["services"]["prefect-server"]["environment"]
    worker = resolved["services"]["worker-cpu"]["environment"]
    assert (
        server["PREFECT_SERVER_API_AUTH_STRING"] == worker["PREFECT_API_AUTH_STRING"] == "admin:prefect-test-password"
    )
    assert (
        worker["AWS_ACCESS_KEY_ID"]
        == "worker-test-user"
        != resolved["services"]["minio"]["environment"]["MINIO_ROOT_USER"]
    )
    for name, service in resolved["services"].items():
        for port in service.get("ports") or []:
            assert (port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]) == "127.0.0.1", name
    opened = compose_config({**throwaway_env(), "COEVOLVE_BIND": "0.0.0.0"}, tmp_path)
    assert any("every interface" in p or "0.0.0.0" in p for p in compose_problems(yaml.safe_load(opened.stdout)))
    for missing in throwaway_env():
        bare = compose_config({k: v for k, v in throwaway_env().items() if k != missing}, tmp_path)
        assert bare.returncode != 0 and missing in bare.stderr, missing


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return (
        Path(found[-1]).parent if found else (Path(shutil.which("pg_ctl")).parent if shutil.which("pg_ctl") else None)
    )


@pytest.fixture
def postgres():
    """A PostgreSQL server on loopback with the compose file's user, password and database;
    yields (port, password). Run as the `postgres` user when the tests run as root."""
    pg = _pg_bin()
    _need("PostgreSQL (apt-get install postgresql)", pg is not None)
    service = yaml.safe_load(COMPOSE.read_text())["services"]["postgres"]["environment"]
    user, db = service["POSTGRES_USER"], service["POSTGRES_DB"]
    password = _interpolate(service["POSTGRES_PASSWORD"], {})
    base = Path(tempfile.mkdtemp(prefix="coevolve-pg-"))  # not under pytest's 0700 tmp: the server user reads it
    base.chmod(0o755)
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(base, "postgres")
    data, pwfile = base / "data", base / "pw"
    pwfile.write_text(password + "\n")
    if as_user:
        shutil.chown(pwfile, "postgres")
    port = free_port()

    def run(*argv: str) -> None:
        done = subprocess.run([*as_user, *argv], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    run(str(pg / "initdb"), "-D", str(data), "-U", user, f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8")
    run(
        str(pg / "pg_ctl"),
        "-D",
        str(data),
        "-l",
        str(base / "log"),
        "-w",
        "-t",
        "60",
        "start",
        "-o",
        f"-p {port} -c listen_addresses=127.0.0.1 -k {base}",
    )
    try:
        env = {**os.environ, "PGPASSWORD": password}
        done = subprocess.run(
            [str(pg / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user, db],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        yield port, password
    finally:
        subprocess.run([*as_user, str(pg / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _psql(port: int, password: str, query: str) -> str:
    pg = _pg_bin()
    done = subprocess.run(
        [str(pg / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "prefect", "-d", "prefect", "-At", "-c", query],
        capture_output=True,
        text=True,
        env={**os.environ, "PGPASSWORD": password},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_prefect_server_on_postgres_runs_a_tiny_round_through_the_deployment(postgres, tmp_path):

    port, password = postgres
    server_env = yaml.safe_load(COMPOSE.read_text())["services"]["prefect-server"]["environment"]
    url = _interpolate(server_env["PREFECT_API_DATABASE_CONNECTION_URL"], {"PREFECT_DB_PASSWORD": password})
    assert url.startswith("postgresql+asyncpg://") and "@postgres:5432/" in url
    api_port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "PREFECT_API_DATABASE_CONNECTION_URL": url.replace("@postgres:5432/", f"@127.0.0.1:{port}/"),
        "PREFECT_API_URL": f"http://127.0.0.1:{api_port}/api",
    }
    command = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(api_port), "--no-ui"]
    with running_prefect_server(command, api_port, env, tmp_path / "server.log", timeout_s=120):

        def prefect(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
            done = subprocess.run(
                [str(BIN / "prefect"), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
            )
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            return done

        prefect("work-pool", "create", "coevolve-process", "--type", "process", "--overwrite")
        prefect("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
        store = tmp_path / "store"
        params = {
            "config": "configs/tiny.yaml",
            "rounds_per_run": 1,
            "store": str(store),
            "run_name": "on-postgres",
            "overrides": {**FAST, "train.checkpoint_dir": str(tmp_path / "ckpt")},
        }
        prefect("deployment", "run", "coevolve-evolve/nightly", "--params", json.dumps(params))
        prefect("worker", "start", "--pool", "coevolve-process", "--run-once")
    # the server kept its state in PostgreSQL: the deployment's run and its round subflow completed
    states = _psql(port, password, "select name || '=' || state_type from flow_run order by name")
    assert "on-postgres round 1=COMPLETED" in states.splitlines(), states
    parent = _psql(
        port, password, "select count(*) from flow_run where deployment_id is not null and state_type = 'COMPLETED'"
    )
    assert parent == "1", states
    assert (store / "runs" / "on-postgres" / "round=1" / "evaluate.json").exists()
