"""The contamination check of validation: no synthesized task may re-create a held-out benchmark turn.

    index = heldout_index(env, cfg)          # once per validation stage
    sim, nearest = index.nearest(task)       # similarity in [0, 1] and "<heldout task id>#<turn>"

Exploring the same backends as the benchmark can land on the benchmark's own requests
(BFCL-V3 multi-turn has 200 entries per category). Every candidate is compared with every
turn of every held-out benchmark task (``Environment.heldout_tasks``, all categories):

- **instruction n-grams**: the Jaccard similarity of the sets of word ``n``-grams (lowercased
  words; ``n = 3``) of a candidate turn's instruction and a held-out turn's question;
- **call sequences on the same state**: where the candidate starts from the same state as the
  held-out task (same initial configuration), the Jaccard similarity of the two turns' sets of
  calls (function name and arguments).

A pair's similarity is the larger of the two; the candidate's is its nearest pair's, recorded
in ``candidates.contamination`` with the pair's id (``candidates.contamination_id``: the held-out
task id and turn index, never its text). Validation refuses a candidate whose similarity is
above ``validate.contamination_threshold`` (reason ``contamination: ...``).

**Provenance.** This module is the one place on the training side that reads held-out
questions and ground-truth calls, and only to refuse: nothing it reads leaves it except a
number and an id. ``tests/test_provenance.py`` checks that no other training-side code calls
``heldout_tasks`` or ``load_tasks``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from coevolve.tasks import Task

NGRAM = 3
_WORD = re.compile(r"[a-z0-9]+")


def ngrams(text: str, n: int = NGRAM) -> frozenset[tuple[str, ...]]:
    """The word ``n``-grams of ``text`` (lowercased words; a text shorter than ``n`` words is one gram)."""
    words = _WORD.findall((text or "").lower())
    if len(words) < n:
        return frozenset([tuple(words)]) if words else frozenset()
    return frozenset(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    if not a or not b:
        return 0.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def call_set(calls: list[dict[str, Any]]) -> frozenset[str]:
    """A turn's calls as comparable keys: name and arguments (canonical JSON)."""
    return frozenset(
        f"{c.get('name')}:{json.dumps(c.get('arguments') or {}, sort_keys=True, default=str)}" for c in calls or []
    )


def state_digest(initial_state: Any) -> str:
    """What 'the same state' means: the initial configuration (the whole state where there is none)."""
    state = json.loads(initial_state) if isinstance(initial_state, str) else initial_state
    if isinstance(state, dict) and "initial_config" in state:
        state = state["initial_config"]
    return json.dumps(state, sort_keys=True, default=str)


@dataclass
class HeldoutIndex:
    """Every turn of the held-out tasks, as n-gram sets and call sets, by start state."""

    turns: list[tuple[str, frozenset, str, frozenset]] = field(default_factory=list)  # id, grams, state, calls
    by_gram: dict[tuple[str, ...], set[int]] = field(default_factory=dict)
    by_state: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, tasks: list[Task]) -> "HeldoutIndex":
        index = cls()
        for t in tasks:
            state = state_digest(t.initial_state)
            for k, question in enumerate(t.turns):
                calls = t.reference_actions[k] if k < len(t.reference_actions) else []
                i = len(index.turns)
                grams = ngrams(question)
                index.turns.append((f"{t.task_id}#{k}", grams, state, call_set(calls)))
                for g in grams:
                    index.by_gram.setdefault(g, set()).add(i)
                index.by_state.setdefault(state, []).append(i)
        return index

    def nearest(self, task: Task) -> tuple[float, str | None]:
        """The similarity of ``task`` to its nearest held-out turn, and that turn's id
        (0.0 and None when no held-out turn shares an n-gram or a state with it)."""
        best, best_id = 0.0, None
        state = state_digest(task.initial_state)
        same_state = self.by_state.get(state, [])
        for k, instruction in enumerate(task.turns):
            grams = ngrams(instruction)
            calls = call_set(task.reference_actions[k] if k < len(task.reference_actions) else [])
            near = set(same_state)
            for g in grams:  # only turns that share an n-gram can have text similarity
                near |= self.by_gram.get(g, set())
            for i in sorted(near):
                turn_id, h_grams, h_state, h_calls = self.turns[i]
                sim = jaccard(grams, h_grams)
                if h_state == state:
                    sim = max(sim, jaccard(calls, h_calls))
                if sim > best:
                    best, best_id = sim, turn_id
        return round(best, 6), best_id


_INDEXES: dict[tuple[str, Any, int], HeldoutIndex] = {}


def heldout_index(env: Any, heldout: int | list[int], seed: int) -> HeldoutIndex:
    """The index of the held-out tasks of environment ``env`` for ``env.heldout_scenarios`` =
    ``heldout`` drawn with ``seed`` (every scenario, every category); built once per process
    and settings. An environment without held-out tasks gives an empty index."""
    key = (env.name, tuple(heldout) if isinstance(heldout, list) else heldout, seed)
    if key not in _INDEXES:
        if not hasattr(env, "heldout_tasks"):
            _INDEXES[key] = HeldoutIndex()
        else:
            _INDEXES[key] = HeldoutIndex.of(env.heldout_tasks(heldout, seed, 0, list(env.categories)))
    return _INDEXES[key]


def contamination_reason(similarity: float, nearest: str | None, threshold: float) -> str | None:
    """The rejection reason of a candidate whose similarity is above ``threshold``, else None."""
    if nearest is None or similarity <= threshold:
        return None
    return (
        f"contamination: similarity {similarity:.2f} > {threshold:.2f} to held-out turn {nearest} "
        "(instruction n-grams or calls on the same state)"
    )
