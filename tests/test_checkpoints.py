"""Checkpoints live with their store: same run name in two stores, resumed from another directory."""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
import torch
from safetensors.torch import load_file, save_file

from coevolve.checkpoints import CheckpointError, local_dir, materialize, publish
from coevolve.config import load_config
from coevolve.registry import register
from coevolve.round import RoundContext, open_run_store, run_stage
from coevolve.store import Store
from coevolve.train import TrainResult, checkpoint_path


@register("trainer", "test-seeded")
def seeded_trainer(store, cfg, run_id, round_no, policy_in, tasks) -> TrainResult:
    """Writes a 'checkpoint' whose weights are the run seed: tells stores apart by weights."""
    out = Path(checkpoint_path(cfg, run_id, round_no))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"model_type": "test", "policy_in": policy_in}))
    save_file({"w": torch.full((4, 4), float(cfg.seed))}, str(out / "model.safetensors"))
    return TrainResult(checkpoint=str(out), n_rollouts=0, mean_reward=0.0, success_rate=0.0)


def _cfg(store: str, seed: int, endpoint: str = "", **more):
    return load_config(
        None,
        {
            "run_name": "nightly",
            "store": store,
            "seed": seed,
            "train.backend": "test-seeded",
            "s3.endpoint_url": endpoint,
            **more,
        },
    )


def _weights(path: str) -> float:
    return float(load_file(str(Path(path) / "model.safetensors"))["w"][0, 0])


def test_two_stores_same_run_name_each_round_2_loads_its_own_checkpoint(tmp_path, monkeypatch, s3_endpoint, s3_bucket):
    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path / "cache-machine-1"))
    first, second = tmp_path / "dir1", tmp_path / "dir2"
    first.mkdir(), second.mkdir()
    monkeypatch.chdir(first)  # round 1 of both stores, from one directory, with a relative local store
    local_cfg = _cfg("store-a", seed=1)
    s3_cfg = _cfg(f"s3://{s3_bucket}/lineage", seed=2, endpoint=s3_endpoint)
    for cfg in (local_cfg, s3_cfg):
        run_stage(open_run_store(cfg), cfg, 1, "train")
    assert not (first / ".coevolve").exists()  # nothing lands in the working directory
    keys = [
        o["Key"] for o in boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(Bucket=s3_bucket)["Contents"]
    ]
    assert "lineage/checkpoints/nightly/round=1/model.safetensors" in keys
    assert "lineage/checkpoints/nightly/round=1/_COMPLETE" in keys

    # round 2 of each, from another directory (and, for S3, another machine's empty cache)
    monkeypatch.chdir(second)
    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path / "cache-machine-2"))
    local_cfg = _cfg(str(first / "store-a"), seed=1)
    for cfg, seed in ((local_cfg, 1.0), (s3_cfg, 2.0)):
        store = open_run_store(cfg)
        marker = store.stage_done("nightly", 1, "train")
        assert marker["checkpoint"] == "checkpoints/nightly/round=1"  # store-relative
        path = RoundContext(store, cfg, 2).policy_in()
        assert _weights(path) == seed, f"{cfg.store} loaded another store's weights"
    assert str(tmp_path / "cache-machine-2") in RoundContext(open_run_store(s3_cfg), s3_cfg, 2).policy_in()


def test_explicit_location_is_keyed_by_store(tmp_path):
    shared = tmp_path / "ckpt"
    a = _cfg(str(tmp_path / "a"), 1, **{"train.checkpoint_dir": str(shared)})
    b = _cfg(str(tmp_path / "b"), 2, **{"train.checkpoint_dir": str(shared)})
    assert local_dir(a, "nightly", 1) != local_dir(b, "nightly", 1)
    assert Path(local_dir(a, "nightly", 1)).is_relative_to(shared)


def test_incomplete_remote_checkpoint_is_an_error(tmp_path, monkeypatch, s3_endpoint, s3_bucket):
    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path / "cache"))
    cfg = _cfg(f"s3://{s3_bucket}/p", 1, endpoint=s3_endpoint)
    store = Store(cfg.store, endpoint_url=s3_endpoint)
    trained = Path(seeded_trainer(store, cfg, "nightly", 1, "tiny", []).checkpoint)
    ref = publish(store, cfg, "nightly", 1, str(trained))
    boto3.client("s3", endpoint_url=s3_endpoint).delete_object(Bucket=s3_bucket, Key=f"p/{ref}/_COMPLETE")
    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path / "other-cache"))
    with pytest.raises(CheckpointError, match="incomplete"):
        materialize(store, cfg, ref)
    with pytest.raises(CheckpointError, match="missing"):
        materialize(Store(str(tmp_path / "empty")), cfg, "checkpoints/nightly/round=3")


def test_cached_checkpoint_is_revalidated_when_the_store_copy_changes(tmp_path, monkeypatch, s3_endpoint, s3_bucket):
    """Issue 29: a cached copy marked complete was used forever; now it is compared with the
    store's listing (key, size, mtime) and downloaded again when the store's copy changed."""
    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path / "cache"))
    cfg = _cfg(f"s3://{s3_bucket}/reval", 1, endpoint=s3_endpoint)
    store = Store(cfg.store, endpoint_url=s3_endpoint)
    ref = publish(store, cfg, "nightly", 1, seeded_trainer(store, cfg, "nightly", 1, "tiny", []).checkpoint)
    monkeypatch.setenv("COEVOLVE_CACHE", str(tmp_path / "machine-2"))
    first = materialize(store, cfg, ref)
    assert load_file(f"{first}/model.safetensors")["w"][0, 0].item() == 1.0
    assert materialize(store, cfg, ref) == first  # unchanged: the cache serves it
    # the store's copy is replaced behind the cache's back (a republish, or an overwrite)
    newer = tmp_path / "newer.safetensors"
    save_file({"w": torch.full((8, 8), 7.0)}, str(newer))
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.upload_file(str(newer), s3_bucket, f"reval/{ref}/model.safetensors")
    again = materialize(store, cfg, ref)
    assert load_file(f"{again}/model.safetensors")["w"][0, 0].item() == 7.0
    s3.delete_object(Bucket=s3_bucket, Key=f"reval/{ref}/_COMPLETE")
    with pytest.raises(CheckpointError, match="incomplete"):  # cached, but no longer complete in the store
        materialize(store, cfg, ref)
