"""Child processes on loopback: a free port to give one, and a stop that always reaps it.

    port = free_port()
    server = subprocess.Popen([..., "--port", str(port)])
    try:
        ...
    finally:
        stop(server)        # SIGTERM, then SIGKILL if it has not exited within timeout_s

The flows' private Prefect API server and the test harness's servers are stopped this way.
"""

from __future__ import annotations

import socket
import subprocess


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> int:
    """Terminate ``proc``, kill it if it outlives ``timeout_s``, and reap it; its exit status."""
    proc.terminate()
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()
