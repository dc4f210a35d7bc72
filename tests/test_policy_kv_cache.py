"""The decoder's KV cache: rows join and leave a running batch by copying their own columns
only, and the cache always reads as the left-padded batch a plain concatenation would give."""

from __future__ import annotations

import random

import torch

from coevolve.policy import kv_cache
from coevolve.policy.kv_cache import fill_holes, growing_cache


def test_fill_holes_moves_rows_from_the_end_into_the_holes():
    assert fill_holes(5, [1, 4]) == ([(3, 1)], [0, 3, 2])
    assert fill_holes(4, [0, 1, 2, 3]) == ([], [])
    assert fill_holes(3, [2]) == ([], [0, 1])
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 12)
        leaving = rng.sample(range(n), rng.randint(0, n))
        moves, order = fill_holes(n, leaving)
        assert sorted(order) == sorted(set(range(n)) - set(leaving))  # every staying row, once
        assert len(moves) == sum(1 for j in leaving if j < n - len(leaving))  # only the holes are filled


def _row(length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 2, length, 4, generator=g), torch.randn(1, 2, length, 4, generator=g)


def test_rows_joining_and_leaving_read_as_the_padded_batch_and_reuse_the_buffers(monkeypatch):
    # buffers come uninitialized: NaN here, so any column that comes into view unwritten shows
    monkeypatch.setattr(kv_cache, "_buffer", lambda like, shape: like.new_full(shape, float("nan")))
    rng = random.Random(1)
    rows: list[list[torch.Tensor]] = []  # the reference: each row's keys, one column per entry
    layer = growing_cache([(torch.zeros(0, 2, 0, 4), torch.zeros(0, 2, 0, 4))], 64).layers[0]
    reallocations, seed = 0, 0
    for step in range(300):
        if step < 2:  # a short row, then a longer one: the batch widens on the left
            seed += 1
            k, v = _row(3 + 20 * step, seed)
            layer.add_rows([(k, v)])
            rows.append([k[0, :, i] for i in range(k.shape[2])])
            continue
        buffer = layer._k.data_ptr()
        action = rng.random()
        if action < 0.25 or not rows:  # a row joins with its prompt's keys
            seed += 1
            k, v = _row(rng.randint(1, 12), seed)
            layer.add_rows([(k, v)])
            rows.append([k[0, :, i] for i in range(k.shape[2])])
        elif action < 0.45:  # a row leaves; leading columns no row needs go with it
            gone = rng.randrange(len(rows))
            moves, order = fill_holes(len(rows), [gone])
            rows = [rows[j] for j in order]
            layer.move_rows(moves, len(rows))
            layer.trim(layer.keys.shape[2] - max((len(r) for r in rows), default=0))
        else:  # a decoding step appends one column to every row
            new = torch.randn(len(rows), 2, 1, 4)
            layer.update(new, new)
            for r, col in zip(rows, new):
                r.append(col[:, 0])
        reallocations += layer._k.data_ptr() != buffer
        if not rows:
            continue
        width = max(len(r) for r in rows)
        assert layer.keys.shape == (len(rows), 2, width, 4)
        for j, r in enumerate(rows):  # each row ends at the last column; what is before it is masked
            assert torch.equal(layer.keys[j, :, width - len(r) :], torch.stack(r, dim=1))
        assert torch.isfinite(layer.keys).all()  # a masked column adds exactly nothing
    assert reallocations < 12  # joins and leaves copy one row; only growth reallocates


def test_ever_longer_rows_join_without_reallocating_each_time(monkeypatch):
    """An episode's next prompt extends its last, so rows longer than the batch keep joining:
    the buffers keep a margin on the left for them (12 rows, each 10% longer than the one
    before: at most 4 buffers, where without the margin every row reallocated), and the cache still reads as the
    left-padded batch."""
    monkeypatch.setattr(kv_cache, "_buffer", lambda like, shape: like.new_full(shape, float("nan")))
    layer = growing_cache([(torch.zeros(0, 2, 0, 4), torch.zeros(0, 2, 0, 4))], 64).layers[0]
    buffers: list[int] = []  # each new buffer's address (a freed one's may come back: count changes)
    rows = []
    length = 100
    for seed in range(12):
        k, v = _row(length, seed)
        layer.add_rows([(k, v)])
        rows.append(k)
        if not buffers or buffers[-1] != layer._k.data_ptr():
            buffers.append(layer._k.data_ptr())
        length = length * 11 // 10
    assert len(buffers) <= 4, f"{len(buffers)} buffers for 12 ever longer rows"
    width = max(r.shape[2] for r in rows)
    assert layer.keys.shape == (12, 2, width, 4)
    for j, r in enumerate(rows):
        assert torch.equal(layer.keys[j, :, width - r.shape[2] :], r[0])
    assert torch.isfinite(layer.keys).all()
