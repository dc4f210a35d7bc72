"""Round checkpoints live with the store's lineage, keyed by run and round.

A round's trained policy (a Hugging Face directory) is kept

- with the store (default, ``train.checkpoint_dir`` empty): ``<store>/checkpoints/<run>/round=<r>/``,
  a local directory or objects under the S3 prefix; the train marker records the
  store-relative key ``checkpoints/<run>/round=<r>``, which resolves from any machine and
  any working directory that opens the same store;
- or under an explicit location (``train.checkpoint_dir``: a local directory or
  ``s3://bucket/prefix``) as ``<location>/<store key>/<run>/round=<r>/``, where the store key
  is a hash of the store's canonical URI, so two stores with the same run name never share
  a checkpoint; the marker records that full location.

A trainer always writes to a local directory (``local_dir``): the final place for a local
location, else a cache directory (``$COEVOLVE_CACHE/checkpoints/<hash>``) that ``publish``
uploads, file by file and then a ``_COMPLETE`` object last. ``materialize`` turns a marker's
reference back into a local directory, downloading (and caching) a remote checkpoint whose
``_COMPLETE`` object exists; a half-uploaded checkpoint is an error, never loaded. A cached copy
is used only while it matches the store's: the cache keeps the listing it was made from (each
object's key, size and modification time, in ``_SOURCE.json``), and a store copy that changed
since (republished, or an object overwritten) is downloaded again.

    path = local_dir(cfg, run_id, round)              # where the trainer saves
    ref = publish(store, cfg, run_id, round, path)    # recorded in the train marker
    local = materialize(store, cfg, ref)              # on any machine, before loading
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from coevolve.config import RUN_NAME, ConfigError

if TYPE_CHECKING:
    from coevolve.config import RunConfig
    from coevolve.store import Store

PREFIX = "checkpoints"
COMPLETE = "_COMPLETE"  # written last: a remote checkpoint without it is incomplete
SOURCE = "_SOURCE.json"  # in a cached copy: the remote listing it was downloaded from


class CheckpointError(RuntimeError):
    """A checkpoint reference that does not resolve to a complete checkpoint."""


def _is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def canonical(uri: str) -> str:
    """A store or location URI in one spelling: ``s3://bucket/prefix`` or an absolute path."""
    return uri.rstrip("/") if _is_s3(uri) else str(Path(uri).expanduser().resolve())


def store_key(store_uri: str) -> str:
    """16 hex digits naming a store (its canonical URI) inside a shared checkpoint location."""
    return hashlib.sha256(canonical(store_uri).encode()).hexdigest()[:16]


def _relative(cfg: "RunConfig", run_id: str, round_no: int) -> tuple[str, str]:
    """``(root, key)``: the checkpoint of ``run_id``/``round`` is ``<root>/<key>``."""
    if not RUN_NAME.fullmatch(run_id):
        raise ConfigError(f"run id {run_id!r} is not a safe name (letters, digits, '.', '_', '-')")
    if cfg.train.checkpoint_dir:
        return canonical(cfg.train.checkpoint_dir), f"{store_key(cfg.store)}/{run_id}/round={int(round_no)}"
    return canonical(cfg.store), f"{PREFIX}/{run_id}/round={int(round_no)}"


def _inside(root: str, key: str) -> Path:
    path = (Path(root) / key).resolve()
    if not path.is_relative_to(Path(root).resolve()):
        raise ConfigError(f"checkpoint path {path} escapes its root {root}")
    return path


def _cache_dir(remote: str) -> Path:
    base = Path(os.environ.get("COEVOLVE_CACHE") or Path.home() / ".cache" / "coevolve")
    tail = remote.rstrip("/").rsplit("/", 2)[-2:]  # <run>/round=<r>, for people reading the cache
    return base / PREFIX / hashlib.sha256(remote.encode()).hexdigest()[:16] / "-".join(tail)


def local_dir(cfg: "RunConfig", run_id: str, round_no: int) -> str:
    """The local directory a trainer saves round ``round`` of ``run_id`` to."""
    root, key = _relative(cfg, run_id, round_no)
    if _is_s3(root):
        return str(_cache_dir(f"{root}/{key}"))
    return str(_inside(root, key))


def reference(cfg: "RunConfig", run_id: str, round_no: int) -> str:
    """What the train marker records: a store-relative key, or the explicit location's URI."""
    root, key = _relative(cfg, run_id, round_no)
    return key if not cfg.train.checkpoint_dir else f"{root}/{key}"


def _remote_store(cfg: "RunConfig", uri: str) -> "Store":
    from coevolve.store_open import store_at

    return store_at(uri, cfg.s3)


def publish(store: "Store", cfg: "RunConfig", run_id: str, round_no: int, trained: str) -> str:
    """Put the checkpoint a trainer saved at ``trained`` where it lives; return its reference."""
    root, key = _relative(cfg, run_id, round_no)
    src = Path(trained)
    if not (src / "config.json").is_file():
        raise CheckpointError(f"{trained} is not a Hugging Face checkpoint (no config.json)")
    if not _is_s3(root):
        target = _inside(root, key)
        if src.resolve() != target:  # the trainer saved elsewhere: copy into place atomically
            tmp = Path(tempfile.mkdtemp(prefix=".publish-", dir=_mkdir(target.parent)))
            shutil.copytree(src, tmp, dirs_exist_ok=True)
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        return reference(cfg, run_id, round_no)
    remote = store if not cfg.train.checkpoint_dir else _remote_store(cfg, root)
    base = f"{remote.root}/{key}"
    _delete_remote(remote, f"{base}/{COMPLETE}")  # a rerun: incomplete until the end
    for f in sorted(p for p in src.rglob("*") if p.is_file() and p.name not in (COMPLETE, SOURCE)):
        with f.open("rb") as fh, remote.fs.open_output_stream(f"{base}/{f.relative_to(src).as_posix()}") as out:
            shutil.copyfileobj(fh, out, 1 << 20)
    with remote.fs.open_output_stream(f"{base}/{COMPLETE}") as out:
        out.write(b"ok\n")
    # this machine's copy is the cache of the remote one, as of the listing just written
    (src / SOURCE).write_text(json.dumps(_listing(remote, base)))
    (src / COMPLETE).write_text("ok\n")
    return reference(cfg, run_id, round_no)


def _listing(remote: "Store", base: str) -> list[list]:
    """Every object under ``base``: ``[key, size, mtime ns]``, sorted; what a cached copy was
    made from, compared again before the copy is used (the store's copy may have changed)."""
    infos = remote.fs.get_file_info(pafs.FileSelector(base, recursive=True))
    return sorted([i.path[len(base) + 1 :], i.size, i.mtime_ns] for i in infos if i.type == pafs.FileType.File)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _delete_remote(remote: "Store", path: str) -> None:
    try:
        remote.fs.delete_file(path)
    except (FileNotFoundError, OSError):
        pass


def materialize(store: "Store", cfg: "RunConfig", ref: str) -> str:
    """A local directory holding the checkpoint ``ref`` names (a train marker's value).

    ``checkpoints/<run>/round=<r>`` resolves against ``store``; an ``s3://`` or absolute
    reference is an explicit location; remote checkpoints are downloaded once into the cache.
    Any other value (a model name, a path recorded by an older version) is returned as is.
    """
    if ref.startswith(f"{PREFIX}/"):
        if not store.is_s3:
            path = _inside(store.root, ref)
            if not (path / "config.json").is_file():
                raise CheckpointError(f"checkpoint {ref} is missing from store {store.uri} (looked at {path})")
            return str(path)
        return _download(store, f"{store.root}/{ref}", f"{canonical(store.uri)}/{ref}")
    if _is_s3(ref):
        return _download(_remote_store(cfg, ref), None, canonical(ref))
    return ref


def _download(remote: "Store", base: str | None, uri: str) -> str:
    base = base or remote.root
    target = _cache_dir(uri)
    if remote.fs.get_file_info(f"{base}/{COMPLETE}").type == pafs.FileType.NotFound:
        raise CheckpointError(f"checkpoint {uri} is missing or incomplete (no {COMPLETE} object)")
    listing = _listing(remote, base)
    if (target / COMPLETE).is_file() and _cached_listing(target) == listing:
        return str(target)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=_mkdir(target.parent)))
    for rel, _, _ in listing:
        dest = _inside(str(tmp), rel)
        _mkdir(dest.parent)
        with remote.fs.open_input_stream(f"{base}/{rel}") as src, dest.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    (tmp / SOURCE).write_text(json.dumps(listing))
    tmp.chmod(0o755)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return str(target)


def _cached_listing(target: Path) -> list | None:
    try:
        return json.loads((target / SOURCE).read_text())
    except (OSError, ValueError):
        return None  # a cache made before listings were kept, or damaged: download again
