"""Security probes: params — what a Prefect form or ``--set`` can hand a run is data, never code,
and bad input is refused at the door (issue 29).

Each probe feeds the real entry points what an attacker or a clumsy user would: the flow's
planning (``check_config_path`` + ``coevolve.lineage.plan_lineage``, what the nightly
deployment's form reaches), ``load_config``, the ``coevolve run`` CLI (in-process for errors that
come before anything starts; in a child process with a deadline where a failed defence would
start a run), the CLI's preflight against an S3 endpoint that accepts and never answers, and the
checkpoint cache against a moto S3 server whose copy changes. Held means refused with one line
naming the field, nothing imported, nothing sent, nothing of a file quoted.
"""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from coevolve.bench.security.probe import Attempt, Probe

CANARY = "CANARY-7f3a-SECRET"


@contextlib.contextmanager
def _environ(**values: str | None) -> Iterator[None]:
    """Set (or, for None, remove) environment variables for the block, then restore them."""
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _refused(fn: Any, *needles: str) -> tuple[bool, str]:
    """Whether ``fn()`` raised ``ConfigError`` whose one-line message names every needle."""
    from coevolve.config import ConfigError

    try:
        fn()
    except ConfigError as exc:
        msg = str(exc)
        return "\n" not in msg and all(n in msg for n in needles), msg[:160]
    return False, "accepted"


# ----------------------------------------------------------------------------- plug-ins
def _plugins(work: Path, fast: bool) -> Iterator[Attempt]:
    from coevolve.lineage import plan_lineage
    from coevolve.registry import resolve

    store = str(work / "store")
    for key, path in (
        ("explore.explorer", "this:s"),
        ("train.backend", "os:system"),
        ("validate.solver", "os:system"),
        ("env.name", "subprocess:Popen"),
        ("synth.explorer", "this:s"),
        ("abstract.abstractor", "builtins:exec"),
    ):
        before = "this" in sys.modules
        held, msg = _refused(lambda: plan_lineage("configs/tiny.yaml", 0, store, "p", {key: path}), key)
        imported = "this" in sys.modules and not before
        yield Attempt(f"form override {key}={path}", held and not imported, ("imported! " if imported else "") + msg)
    held, msg = _refused(lambda: plan_lineage("", 0, store, "p", {"trust.plugins": ["os:system"]}), "trust")
    yield Attempt("form override trust.plugins=['os:system']", held, msg)
    try:
        resolve("explorer", "this:s")
        yield Attempt("registry.resolve of an untrusted path", False, "imported")
    except KeyError as exc:
        yield Attempt("registry.resolve of an untrusted path", "this" not in sys.modules, str(exc)[:160])
    # the way in on purpose: a config file of an allowed folder that lists the path
    allowed = work / "configs"
    allowed.mkdir()
    (allowed / "trusting.yaml").write_text("trust: {plugins: ['coevolve.explorers.random:RandomExplorer']}\n")
    with _environ(COEVOLVE_CONFIG_DIRS=str(allowed)):
        from coevolve.config import load_config

        try:
            cfg = load_config(
                allowed / "trusting.yaml", {"explore.explorer": "coevolve.explorers.random:RandomExplorer"}
            )
            ok = cfg.explore.explorer.endswith("RandomExplorer")
            yield Attempt("a path the config file trusts still works", ok, "accepted")
        except Exception as exc:  # a defence that refuses everything is no defence either
            yield Attempt("a path the config file trusts still works", False, f"{type(exc).__name__}: {exc}"[:160])


# ----------------------------------------------------------------------------- API keys
class _Capture(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Capture.seen.append(self.headers.get("Authorization") or "")
        body = json.dumps(
            {
                "choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _ask(cfg: Any) -> None:
    """One chat request through the configured ``openai`` policy (the real client)."""
    from coevolve.policy import load_policy
    from coevolve.policy.base import SamplingParams

    policy = load_policy(cfg.policy, cfg.policy.model)
    try:
        policy.chat([[{"role": "user", "content": "hi"}]], [[]], SamplingParams(max_new_tokens=4, temperature=0.0))
    finally:
        close = getattr(policy, "close", None)
        if close:
            close()


def _api_keys(work: Path, fast: bool) -> Iterator[Attempt]:
    from coevolve.config import load_config

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    capture = f"http://127.0.0.1:{server.server_address[1]}/v1"
    openai = {"policy.backend": "openai", "policy.model": "m", "policy.base_url": capture}
    try:
        with _environ(AWS_SECRET_ACCESS_KEY=CANARY, OPENAI_API_KEY=CANARY, VLLM_KEY=CANARY):
            for var in ("AWS_SECRET_ACCESS_KEY", "VLLM_KEY", "PATH"):
                held, msg = _refused(lambda: load_config(None, {**openai, "policy.api_key_env": var}), "api_key_env")
                yield Attempt(f"api_key_env={var} via an override", held, msg)
            held, msg = _refused(
                lambda: load_config(None, {"explore.api_key_env": "AWS_SECRET_ACCESS_KEY"}), "explore.api_key_env"
            )
            yield Attempt("explore.api_key_env=AWS_SECRET_ACCESS_KEY", held, msg)
            # a real *_API_KEY, sent to an endpoint the override chose: the key must stay home
            _Capture.seen.clear()
            _ask(load_config(None, openai))
            leaked = any(CANARY in h for h in _Capture.seen)
            yield Attempt(
                "override moves base_url to a capture server",
                bool(_Capture.seen) and not leaked,
                str(_Capture.seen)[:120],
            )
            # the endpoint the config file names gets its key (the legitimate path still works)
            folder = work / "configs"
            folder.mkdir()
            (folder / "endpoint.yaml").write_text(
                f"policy: {{backend: openai, model: m, base_url: '{capture}', api_key_env: OPENAI_API_KEY}}\n"
            )
            _Capture.seen.clear()
            _ask(load_config(folder / "endpoint.yaml"))
            yield Attempt("the file's own endpoint gets its key", any(CANARY in h for h in _Capture.seen), "sent")
    finally:
        server.shutdown()
        server.server_close()


# ----------------------------------------------------------------------------- config files
def _config_paths(work: Path, fast: bool) -> Iterator[Attempt]:
    from coevolve.config import check_config_path, load_config

    creds = work / "credentials"
    creds.write_text(f"[default]\naws_access_key_id = AKIA{CANARY}\naws_secret_access_key = {CANARY}\n")
    for what, path in (
        ("/etc/passwd", "/etc/passwd"),
        ("a credentials file", str(creds)),
        ("configs/../ climbing out", "configs/../../../../etc/passwd"),
        ("a .yaml outside configs/", str(work / "x.yaml")),
    ):
        held, msg = _refused(lambda: check_config_path(path), "outside the allowed folders")
        yield Attempt(f"flow config={what}", held and CANARY not in msg, msg)
    # files in an allowed folder that are not configs: named, never quoted
    folder = work / "allowed"
    folder.mkdir()
    samples = {
        "ini.yaml": creds.read_text(),
        "mapping.yaml": f"aws_secret_access_key: {CANARY}\n",
        "key-as-line.yaml": f"{CANARY}-as-a-key: 1\n",
        "broken.yaml": f"train: [{CANARY}\n",
        "value.yaml": f"rounds: {CANARY}\n",
        "binary.yaml": "\x00\xff" + CANARY,
    }
    with _environ(COEVOLVE_CONFIG_DIRS=str(folder)):
        for name, text in samples.items():
            (folder / name).write_bytes(text.encode("utf-8", "surrogateescape"))
            ok, msg = _refused(lambda: load_config(check_config_path(folder / name)), name)
            yield Attempt(f"an allowed-folder file that is no config ({name})", ok and CANARY not in msg, msg)


# ----------------------------------------------------------------------------- ranges and YAML
RANGE_ATTEMPTS: tuple[tuple[str, Any], ...] = (
    ("policy.batch_size", 0),
    ("policy.max_new_tokens", -5),
    ("policy.temperature", math.nan),
    ("policy.temperature", -1),
    ("policy.concurrency", -4),
    ("rounds", 10**30),
    ("rounds", 10**6),
    ("eval.max_new_tokens", 0),
    ("train.lr", math.inf),
    ("s3.read_timeout_s", 0),
    ("validate.near_duplicate_threshold", 2.0),
)


def _ranges(work: Path, fast: bool) -> Iterator[Attempt]:
    import dataclasses

    from coevolve.config import RunConfig, load_config

    for key, value in RANGE_ATTEMPTS:
        held, msg = _refused(lambda: load_config(None, {key: value}), key)
        yield Attempt(f"{key}={value!r}", held, msg)
    silent = []
    for section in dataclasses.fields(RunConfig):
        cls = section.type if isinstance(section.type, type) else None
        for f in dataclasses.fields(cls) if cls and dataclasses.is_dataclass(cls) else [section]:
            if "range" in f.metadata and "Range:" not in f.metadata["help"]:
                silent.append(f.name)
    yield Attempt("every ranged field says its range in its help", not silent, ", ".join(silent) or "all do")


def _yaml_errors(work: Path, fast: bool) -> Iterator[Attempt]:
    for value in ("[1",) if fast else ("[1", "{a: 1", "'x", "a: b: c"):
        code, out, secs = _cli_child(["run", "--store", str(work / "s"), "--set", f"train.steps={value}"], 60)
        text = " ".join(out.split())  # the error console wraps a long line at its width: one message
        held = code not in (None, 0) and text.startswith("error:") and text.count("error:") == 1
        held = held and "train.steps" in text and "Traceback" not in out
        yield Attempt(f"--set train.steps={value}", held, text[:160])


def _cli_child(args: list[str], timeout_s: float) -> tuple[int | None, str, float]:
    """``coevolve <args>`` in a child process; returns (exit code or None on timeout, output, seconds)."""
    start = time.perf_counter()
    env = {**os.environ, "PREFECT_API_URL": ""}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "flows", *args], capture_output=True, text=True, timeout=timeout_s, env=env
        )
        return done.returncode, done.stdout + done.stderr, time.perf_counter() - start
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        return None, out, time.perf_counter() - start


def _store_is_a_file(work: Path, fast: bool) -> Iterator[Attempt]:
    afile = work / "store-file"
    afile.write_text("not a directory\n")
    cases = (("the store path is a file", afile), ("the store path is under a file", afile / "sub"))
    for what, store in cases[:1] if fast else cases:
        code, out, secs = _cli_child(["run", "--config", "configs/tiny.yaml", "--store", str(store)], 60)
        text = " ".join(out.split())
        held = code not in (None, 0) and "store" in text and "Prefect" not in text and "Traceback" not in text
        yield Attempt(f"{what} (refused in {secs:.1f}s)", held and secs < 30, text[:160])


def _hanging_s3(work: Path, fast: bool) -> Iterator[Attempt]:
    """Preflight against an endpoint that accepts connections and never answers, with short
    configured timeouts: it must fail within attempts x (connect + read) plus slack."""
    from coevolve.cli.common import preflight

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held_conns: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held_conns.append(srv.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    endpoint = f"http://127.0.0.1:{srv.getsockname()[1]}"
    budget = 2 * (1.0 + 1.0)
    outcome: dict[str, Any] = {}

    def run() -> None:
        import typer

        try:
            preflight(
                None,
                {
                    "store": "s3://coevolve-probe/x",
                    "s3.endpoint_url": endpoint,
                    "s3.connect_timeout_s": 1.0,
                    "s3.read_timeout_s": 1.0,
                    "s3.max_attempts": 2,
                },
            )
            outcome["result"] = "passed preflight"
        except typer.Exit as exc:
            outcome["result"] = f"refused (exit {exc.exit_code})"
        except BaseException as exc:  # noqa: BLE001 (reported as the outcome)
            outcome["result"] = f"{type(exc).__name__}: {exc}"

    start = time.perf_counter()
    said = io.StringIO()  # preflight's one-line error, kept as the attempt's detail
    with _environ(AWS_ACCESS_KEY_ID="probe", AWS_SECRET_ACCESS_KEY="probe", AWS_REGION="us-east-1"):
        with contextlib.redirect_stderr(said):
            t = threading.Thread(target=run, daemon=True)
            t.start()
            t.join(budget + 15)
    secs = time.perf_counter() - start
    srv.close()
    for c in held_conns:
        c.close()
    result = outcome.get("result", "still waiting")
    yield Attempt(
        f"preflight, endpoint never answers (s3 timeouts 1 s, 2 attempts; {secs:.1f}s)",
        result.startswith("refused") and secs <= budget + 10,
        f"{result}: {' '.join(said.getvalue().split())}"[:160],
    )


def _stale_checkpoint(work: Path, fast: bool) -> Iterator[Attempt]:
    import boto3

    from coevolve.bench.reliability.s3_faults import MotoS3
    from coevolve.checkpoints import materialize, publish
    from coevolve.config import load_config
    from coevolve.store import Store

    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")}
    moto = MotoS3()
    try:
        bucket = moto.bucket("coevolve-probe")
        with _environ(COEVOLVE_CACHE=str(work / "cache")):
            cfg = load_config(None, {"store": f"s3://{bucket}/p", "run_name": "r", "s3.endpoint_url": moto.url})
            store = Store(cfg.store, endpoint_url=moto.url)
            trained = work / "trained"
            trained.mkdir()
            (trained / "config.json").write_text("{}")
            (trained / "weights.bin").write_bytes(b"round one")
            ref = publish(store, cfg, "r", 1, str(trained))
        with _environ(COEVOLVE_CACHE=str(work / "machine-2")):
            first = Path(materialize(store, cfg, ref))
            boto3.client("s3", endpoint_url=moto.url).put_object(
                Bucket=bucket, Key=f"p/{ref}/weights.bin", Body=b"round one, retrained"
            )
            again = Path(materialize(store, cfg, ref))
            got = (again / "weights.bin").read_bytes()
        yield Attempt(
            "the store's checkpoint changed after it was cached",
            (first / "weights.bin").exists() and got == b"round one, retrained",
            f"the cache served {got!r}",
        )
    finally:
        moto.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


PROBES: tuple[Probe, ...] = (
    Probe("form-plugin-import", "params", "a Prefect form names a module:attr plug-in (this:s, os:system)", _plugins),
    Probe("form-api-key-exfiltration", "params", "api_key_env + base_url send a secret to a capture server", _api_keys),
    Probe(
        "form-config-path", "params", "config = any file on the worker; its lines echoed in the error", _config_paths
    ),
    Probe(
        "numeric-ranges", "params", "batch_size=0, max_new_tokens=-5, temperature NaN/-1, rounds=10**30 ...", _ranges
    ),
    Probe("set-yaml-error", "params", "--set train.steps=[1 prints a YAML traceback", _yaml_errors),
    Probe(
        "store-path-a-file",
        "params",
        "a store path that is a file starts Prefect, fails minutes later",
        _store_is_a_file,
    ),
    Probe("s3-endpoint-hangs", "params", "an S3 endpoint that accepts and never answers hangs preflight", _hanging_s3),
    Probe(
        "stale-checkpoint-cache",
        "params",
        "a cached checkpoint is never revalidated against the store",
        _stale_checkpoint,
    ),
)
