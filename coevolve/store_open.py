"""One way to open a store with a run config's S3 settings, used everywhere a ``Store`` is
built for a configured location.

    store = store_at(cfg.store, cfg.s3)          # endpoint, region, retries and timeouts of cfg.s3
    store = open_run_store(cfg)                  # the same for the run's store, checked reachable
    sub = store_at("s3://bucket/abl/conditions/static-s0", cfg.s3)

``cfg.s3`` (``config.S3Config``) gives the endpoint and region (empty: from the environment,
``AWS_ENDPOINT_URL`` / ``AWS_REGION``) and the S3 clients' retry mode, attempts and timeouts
(``store.S3Client``). Without settings (``store_at(uri)``, a bare ``--store`` flag) a store gets
``S3Config``'s defaults, which are ``S3Client``'s: the same as ``Store(uri)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coevolve.store import S3Client, Store

if TYPE_CHECKING:
    from coevolve.config import RunConfig


def store_at(uri: str, s3: Any = None) -> Store:
    """The store at ``uri`` (a local directory or ``s3://bucket/prefix``) opened with ``s3``:
    a ``config.S3Config`` (or any object with its fields); None = its defaults."""
    if s3 is None:
        return Store(uri)
    return Store(uri, endpoint_url=s3.endpoint_url, region=s3.region, client=S3Client.of(s3))


def open_run_store(cfg: "RunConfig") -> Store:
    """The run's store (``cfg.store``) with the run's S3 settings; raises ``StoreError`` if it
    cannot be reached."""
    store = store_at(cfg.store, cfg.s3)
    store.check_reachable()
    return store
