"""Security probes: stack — the compose stack and the Ray manifests are closed by default (issue 29).

The stack is judged from its files, the way compose itself reads them: ``resolve_compose``
expands ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?message}``,
``${VAR?message}`` and ``$$`` as compose does, given an environment, and ``compose_problems``
lists what would let someone in:

- a port published beyond loopback (no host address, or one that is not 127.0.0.1 / ::1);
- a secret with a default (``${MINIO_ROOT_PASSWORD:-...}``) or written into the file;
- a Prefect server without ``PREFECT_SERVER_API_AUTH_STRING``, or a client of it without
  ``PREFECT_API_AUTH_STRING``;
- a service holding MinIO's root credentials as its S3 credentials;
- an init step whose failures a ``||`` chain or a missing ``sh -e`` could hide.

``ray_problems`` does the same for ``infra/ray/*.yaml`` (the dashboard and its job API on
0.0.0.0). When docker-compose (or ``docker compose``) is installed, the slow form also asks it
for the resolved file (``docker-compose config``) and judges that too.

    problems = compose_problems(resolve_compose(COMPOSE.read_text(), throwaway_env()), raw=COMPOSE.read_text())
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from coevolve.bench.security.probe import Attempt, Probe

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "infra" / "docker-compose.yml"
RAY_FILES = (ROOT / "infra" / "ray" / "raycluster.yaml", ROOT / "infra" / "ray" / "rayjob-verl.yaml")
LOOPBACK = ("127.0.0.1", "::1", "[::1]", "localhost")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|AUTH_STRING|ACCESS_KEY|ROOT_USER|TOKEN|_KEY\b")
_VAR = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}|\$(\w+)")


class ComposeError(ValueError):
    """Compose would refuse the file (a required variable is unset)."""


def throwaway_env() -> dict[str, str]:
    """Every secret the stack requires, set to throwaway values (distinct worker and root users)."""
    return {
        "PREFECT_DB_PASSWORD": "db-test-password",
        "PREFECT_AUTH_STRING": "admin:prefect-test-password",
        "MINIO_ROOT_USER": "root-test-user",
        "MINIO_ROOT_PASSWORD": "root-test-password",
        "COEVOLVE_S3_ACCESS_KEY": "worker-test-user",
        "COEVOLVE_S3_SECRET_KEY": "worker-test-password",
    }


def interpolate(text: str, env: dict[str, str]) -> str:
    """``text`` with compose's variable syntax expanded from ``env``; ``ComposeError`` for a
    required variable (``:?`` / ``?``) that is unset (or empty, for ``:?``)."""

    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        value = env.get(name)
        if op in (":-", ":?") and not value or op in ("-", "?") and value is None:
            if op.endswith("?"):
                raise ComposeError(f"required variable {name} is missing a value: {arg or 'set it'}")
            return arg
        return value or ""

    return _VAR.sub(one, text)


def resolve_compose(text: str, env: dict[str, str]) -> dict[str, Any]:
    """The compose file ``text`` as compose resolves it with ``env`` (values interpolated,
    YAML anchors and merge keys applied)."""
    spec = yaml.safe_load(text)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return interpolate(node, env) if isinstance(node, str) else node

    return walk(spec)


def _published(port: Any) -> tuple[str, str] | None:
    """``(host address, description)`` of a published port (short or long syntax, as written
    or as ``docker-compose config`` prints it); '' = every interface; None = not published."""
    if isinstance(port, dict):
        if not port.get("published"):
            return None
        return str(port.get("host_ip") or ""), f"{port.get('published')}->{port.get('target')}"
    text = str(port).split("/")[0]
    if text.startswith("["):  # [::1]:9000:9000
        host, _, rest = text[1:].partition("]:")
        return host, rest
    parts = text.split(":")
    if len(parts) == 1:
        return "", f"{parts[0]} (a random host port)"
    if len(parts) == 2:
        return "", text
    return ":".join(parts[:-2]), ":".join(parts[-2:])


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def published_ports(spec: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(service, host address, port)`` of every published port."""
    out = []
    for name, service in (spec.get("services") or {}).items():
        for port in service.get("ports") or []:
            found = _published(port)
            if found is not None:
                out.append((name, *found))
    return out


def compose_problems(spec: dict[str, Any], raw: str = "") -> list[str]:
    """What in the resolved compose file ``spec`` (and its text ``raw``, for defaults and
    literal secrets) would let someone in; empty when the stack is closed."""
    problems = []
    services = spec.get("services") or {}
    for name, host, port in published_ports(spec):
        if host not in LOOPBACK:
            problems.append(f"{name}: port {port} published on {host or 'every interface'}")
    if raw:
        for m in re.finditer(r"\$\{(\w+):?-([^}]*)\}", raw):
            if SECRET_NAME.search(m.group(1)):
                problems.append(f"secret {m.group(1)} has a default")
        for name, service in (yaml.safe_load(raw).get("services") or {}).items():
            for key, value in _env(service).items():
                if SECRET_NAME.search(key) and not re.search(r"\$\{\w+:?\?", value):
                    problems.append(f"{name}: {key} is written in the file, not a required variable")
    servers = [
        s for s in services.values() if "prefect" in str(s.get("command", "")) and "server" in str(s.get("command", ""))
    ]
    if not servers or not all(_env(s).get("PREFECT_SERVER_API_AUTH_STRING") for s in servers):
        problems.append("prefect-server: no PREFECT_SERVER_API_AUTH_STRING (the API answers anyone)")
    auth = {_env(s).get("PREFECT_SERVER_API_AUTH_STRING") for s in servers}
    root_user = next((_env(s)["MINIO_ROOT_USER"] for s in services.values() if "MINIO_ROOT_USER" in _env(s)), None)
    root_pw = next(
        (_env(s)["MINIO_ROOT_PASSWORD"] for s in services.values() if "MINIO_ROOT_PASSWORD" in _env(s)), None
    )
    for name, service in services.items():
        env = _env(service)
        if "PREFECT_API_URL" in env and env.get("PREFECT_API_AUTH_STRING") not in auth:
            problems.append(f"{name}: a Prefect client without the server's PREFECT_API_AUTH_STRING")
        s3_key, s3_secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        if s3_key is not None and (s3_key == root_user or s3_secret == root_pw):
            problems.append(f"{name}: its S3 credentials are MinIO's root user")
        command = service.get("command")
        script = "\n".join(command) if isinstance(command, list) else str(command or "")
        if "mc " in script:
            entry = " ".join(service.get("entrypoint") or [])
            if "||" in script:
                problems.append(f"{name}: a '||' chain can hide a failed step")
            if not re.search(r"-\w*e", entry) and "set -e" not in script:
                problems.append(f"{name}: the script does not stop at a failed step (sh -e)")
    return problems


def ray_problems(path: Path) -> list[str]:
    """A Ray manifest whose head puts its dashboard (and so the job API) on every interface."""
    problems = []
    for doc in yaml.safe_load_all(path.read_text()):
        text = yaml.safe_dump(doc)
        for m in re.finditer(r"dashboard-host:\s*'?\"?([^'\"\s]+)", text):
            if m.group(1) not in LOOPBACK:
                problems.append(f"{path.name}: dashboard-host {m.group(1)}")
        if "dashboard-host" not in text:
            problems.append(f"{path.name}: dashboard-host unset (Ray's default listens beyond loopback)")
    return problems


def compose_command() -> list[str] | None:
    """``docker-compose`` or ``docker compose``, whichever is installed; None if neither."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


def compose_config(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """``docker-compose -f infra/docker-compose.yml config`` with exactly ``env`` (plus PATH),
    run from ``cwd`` so that no stray ``.env`` is read."""
    import os

    cmd = compose_command()
    assert cmd is not None
    full_env = {"PATH": os.environ.get("PATH", ""), "HOME": str(cwd), **env}
    return subprocess.run(
        [*cmd, "--project-directory", str(cwd), "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=120,
    )


# ----------------------------------------------------------------------------- the probes
def _compose(work: Path, fast: bool) -> Iterator[Attempt]:
    raw = COMPOSE.read_text()
    spec = resolve_compose(raw, throwaway_env())
    problems = compose_problems(spec, raw)
    ports = published_ports(spec)
    for name, host, port in ports:
        yield Attempt(f"{name} {port} reached from another machine", host in LOOPBACK, f"bound to {host or 'all'}")
    yield Attempt("the stack has published ports to judge", bool(ports), f"{len(ports)} ports")
    for var in sorted(throwaway_env()):
        env = {k: v for k, v in throwaway_env().items() if k != var}
        try:
            resolve_compose(raw, env)
            yield Attempt(f"start without {var}", False, "compose would start with a default or an empty value")
        except ComposeError as exc:
            yield Attempt(f"start without {var}", True, str(exc)[:120])
    for what, words in (
        ("a secret with a default or written in the file", ("secret", "written in the file")),
        ("Prefect's API without an auth string", ("AUTH_STRING",)),
        ("the worker with MinIO's root credentials", ("root user",)),
        ("an init step whose failure is hidden", ("'||'", "sh -e")),
    ):
        found = [p for p in problems if any(w in p for w in words)]
        yield Attempt(what, not found, "; ".join(found)[:160] or "none found")
    same = dict(throwaway_env(), COEVOLVE_S3_ACCESS_KEY="root-test-user", COEVOLVE_S3_SECRET_KEY="root-test-password")
    found = compose_problems(resolve_compose(raw, same))
    yield Attempt("the check sees a worker given the root user", any("root user" in p for p in found), "; ".join(found))
    if fast:
        return
    if compose_command() is None:
        yield Attempt("docker-compose config (not installed: pure-Python check only)", True, "skipped")
        return
    done = compose_config(throwaway_env(), work)
    resolved = yaml.safe_load(done.stdout) if done.returncode == 0 else {}
    found = compose_problems(resolved) if resolved else [done.stderr.strip()[-160:]]
    yield Attempt("docker-compose config, resolved", done.returncode == 0 and not found, "; ".join(found)[:160])
    bare = compose_config({}, work)
    yield Attempt("docker-compose config without the secrets", bare.returncode != 0, bare.stderr.strip()[-160:])


def _ray(work: Path, fast: bool) -> Iterator[Attempt]:
    for path in RAY_FILES:
        found = ray_problems(path)
        yield Attempt(f"{path.name}: dashboard / job API on every interface", not found, "; ".join(found) or "loopback")


PROBES: tuple[Probe, ...] = (
    Probe(
        name="compose-stack-closed",
        area="stack",
        attack="reach Prefect/MinIO from another machine, start the stack on default secrets, use the worker's root S3 key",
        run=_compose,
    ),
    Probe(
        name="ray-dashboard-loopback",
        area="stack",
        attack="submit a Ray job through a dashboard listening on 0.0.0.0",
        run=_ray,
    ),
)
