"""Shared fixtures: an S3 endpoint on loopback (moto) and Prefect's test harness.

Both are session-scoped: moto's server and the Prefect harness each take seconds to start.
"""

from __future__ import annotations

import os
import socket

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(os.path.expanduser("~"), ".cache", "coevolve", "bfcl"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint():
    """An S3 API on loopback (moto's ThreadedMotoServer) with test credentials in the env."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
    yield f"http://127.0.0.1:{port}"
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_bucket_ids = __import__("itertools").count()


@pytest.fixture
def s3_bucket(s3_endpoint, request):
    """A fresh bucket on the loopback S3 endpoint; yields its name."""
    import boto3

    import re

    name = f"cv-{next(_bucket_ids)}-" + re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def prefect_harness():
    """Prefect's own test harness: a temporary API and database for the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield
