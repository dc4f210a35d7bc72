"""Child processes on loopback: a free port to give one, and a stop that always reaps it.

    port = free_port()
    server = subprocess.Popen([..., "--port", str(port)])
    try:
        ...
    finally:
        stop(server)        # SIGTERM, then SIGKILL if it has not exited within timeout_s

The flows' private Prefect API server and the test harness's servers are stopped this way.
``usable_cores()`` is what "every core" means for a thread count: the cores this process may
run on (a container's or ``taskset``'s CPU set), not every core of the machine.
"""

from __future__ import annotations

import os
import socket
import subprocess


def usable_cores() -> int:
    """The number of cores this process may run on (its CPU affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


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
