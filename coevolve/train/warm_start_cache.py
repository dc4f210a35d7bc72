"""The SFT warm start, cached per machine by content.

A warm start is a deterministic function of the base model's weights, the examples (token
ids and loss masks), the SFT settings, the LoRA shape and the seed. Every ablation condition
of a seed warm-starts on the same pool, and a second ``make run`` into a new store repeats the
first's: so the trained parameters (the LoRA adapters, or every weight without LoRA) are
saved under ``$COEVOLVE_CACHE/warm-start/<key>.safetensors`` once and loaded after that.

    key = cache_key(policy.model_path, examples, settings)
    if not load(model, key):
        run_sft(...); save(model, key)

The key hashes the model's weight files by name, size and modification time (a rebuilt model is
a new model), every example's ids and mask, and the settings dict; ``RECIPE`` is bumped when
the warm start's computation changes. ``train.warm_start_cache: false`` always recomputes.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from coevolve.policy.models import cache_root

RECIPE = "sft-1"


def cache_key(model_path: str, examples: list[tuple[list[int], list[int]]], settings: dict[str, Any]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([RECIPE, torch.__version__, settings], sort_keys=True, default=str).encode())
    root = Path(model_path)
    for f in sorted(root.glob("*.safetensors")) + sorted(root.glob("*.bin")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(str(root.resolve()).encode())
    for ids, mask in examples:
        h.update(json.dumps([list(ids), list(mask)]).encode())
    return h.hexdigest()[:32]


def path_of(key: str) -> Path:
    return cache_root() / "warm-start" / f"{key}.safetensors"


def _trained(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def load(model: torch.nn.Module, key: str) -> bool:
    """Copy the cached warm start ``key`` into ``model``'s trained parameters; False (model
    untouched) when there is none or it does not fit the model (other names or shapes)."""
    from safetensors.torch import load_file

    path = path_of(key)
    if not path.is_file():
        return False
    try:
        saved = load_file(str(path))
    except Exception:  # a torn or foreign file is a miss, never a crash
        return False
    params = _trained(model)
    if saved.keys() != params.keys() or any(saved[n].shape != p.shape for n, p in params.items()):
        return False
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(saved[n].to(p.device, p.dtype))
    return True


def save(model: torch.nn.Module, key: str) -> Path:
    """Write ``model``'s trained parameters as warm start ``key`` (atomically: a temp file renamed)."""
    from safetensors.torch import save_file

    path = path_of(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {n: p.detach().to("cpu").contiguous() for n, p in _trained(model).items()}
    fd, tmp = tempfile.mkstemp(prefix=".ws-", suffix=".safetensors", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
