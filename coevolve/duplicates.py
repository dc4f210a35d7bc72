"""Duplicate candidates: exact (same content hash) and near (same start state, and a Jaccard
similarity of the sets of reference calls at or above a threshold).

    index = pool_index(pool_rows, threshold=0.9)       # the pool's ``tasks`` rows
    reason = index.find(task.content_hash, state_key(task.env, task.initial_state), task_calls(task))
    index.add(task.task_id, task.content_hash, state, calls)   # later candidates see this one

Validation's third check (``coevolve.validate``) rejects a candidate with ``reason``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from typing import Any

from coevolve.tasks import Task


def call_key(call: dict[str, Any]) -> str:
    return json.dumps([call.get("name"), call.get("arguments") or {}], sort_keys=True, default=str)


def state_key(env: str, initial_state: dict[str, Any] | str) -> str:
    text = initial_state if isinstance(initial_state, str) else json.dumps(initial_state, sort_keys=True)
    return env + ":" + hashlib.sha1(text.encode()).hexdigest()


class DuplicateIndex:
    """Exact (content hash) and near duplicates (Jaccard of call sets, same start state).

    An inverted index from call to tasks makes a lookup cost the tasks that share a call
    with the candidate, not the whole pool.
    """

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.hashes: dict[str, str] = {}
        self.sizes: list[int] = []
        self.ids: list[str] = []
        self.postings: dict[tuple[str, str], list[int]] = defaultdict(list)

    def add(self, task_id: str, content_hash: str, state_key: str, calls: set[str]) -> None:
        self.hashes.setdefault(content_hash, task_id)
        i = len(self.ids)
        self.ids.append(task_id)
        self.sizes.append(len(calls))
        for c in calls:
            self.postings[(state_key, c)].append(i)

    def find(self, content_hash: str, state_key: str, calls: set[str]) -> str | None:
        """Why the candidate duplicates an indexed task, or None."""
        if content_hash in self.hashes:
            return f"duplicate: same content as {self.hashes[content_hash]}"
        overlap: Counter[int] = Counter()
        for c in calls:
            overlap.update(self.postings.get((state_key, c), ()))
        for i, shared in overlap.items():
            jaccard = shared / (len(calls) + self.sizes[i] - shared)
            if jaccard >= self.threshold:
                return f"near-duplicate: {jaccard:.2f} call overlap with {self.ids[i]}"
        return None


def task_calls(task: Task) -> set[str]:
    return {call_key(c) for turn in task.reference_actions for c in turn}


def pool_index(pool_rows: list[dict[str, Any]], threshold: float) -> DuplicateIndex:
    """A duplicate index over ``tasks`` rows (JSON columns still encoded)."""
    index = DuplicateIndex(threshold)
    for r in pool_rows:
        calls = {call_key(c) for turn in json.loads(r["reference_actions"]) for c in turn}
        index.add(r["task_id"], r["content_hash"], state_key(r["env"], r["initial_state"]), calls)
    return index
