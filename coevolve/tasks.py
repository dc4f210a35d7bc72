"""The task record: what the pool holds, what environments run, what abstraction produces.

A ``Task`` is one row of the ``tasks`` table (see ``coevolve.schemas.TASKS``) with its JSON
columns decoded. Reference actions are structured calls, one list per turn:
``[[{"name": "cd", "arguments": {"folder": "document"}}, ...], ...]``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Task:
    task_id: str
    env: str
    turns: list[str]  # one user instruction per turn; "" means the turn brings no user message
    initial_state: dict[str, Any]  # environment specific (BFCL: initial_config, involved_classes, ...)
    reference_actions: list[list[dict[str, Any]]]  # per turn: [{"name", "arguments"}]
    tools: list[str] = field(default_factory=list)
    category: str = ""
    split: str = "train"
    origin: str = "seed"
    signal_type: str | None = None
    seed_task_id: str | None = None
    created_round: int = 0
    run_id: str = ""

    @property
    def content_hash(self) -> str:
        """Hash of what makes two tasks the same task (not ids, not provenance)."""
        payload = json.dumps(
            [self.env, self.turns, self.initial_state, self.reference_actions, sorted(self.tools)],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:32]

    def to_row(self) -> dict[str, Any]:
        row = asdict(self)
        # key order is meaningful to some backends (BFCL's file system takes the first key
        # of `root` as the root directory): keep it; only the hash is order-insensitive
        row["initial_state"] = json.dumps(self.initial_state)
        row["reference_actions"] = json.dumps(self.reference_actions)
        row["content_hash"] = self.content_hash
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Task":
        fields = {k: row[k] for k in cls.__dataclass_fields__ if k in row and row[k] is not None}
        for key in ("initial_state", "reference_actions"):
            if isinstance(fields.get(key), str):
                fields[key] = json.loads(fields[key])
        fields["turns"] = list(fields.get("turns", []))
        fields["tools"] = list(fields.get("tools", []))
        return cls(**fields)

    @classmethod
    def from_json(cls, text: str) -> "Task":
        return cls.from_row(json.loads(text))

    def to_json(self) -> str:
        return json.dumps(self.to_row(), sort_keys=True)
