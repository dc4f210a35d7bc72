"""A policy that replays each task's reference calls: the faithfulness check of env + scorer.

For turn ``t`` of task ``task_id`` (read from the ``meta`` the rollout engine passes), the
first assistant message holds all of the turn's reference calls as Hermes blocks
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; the next message is plain text,
which ends the turn. A turn without reference calls gets the plain text at once.

    policy = ReplayPolicy(tasks)
    results = run_episodes(policy, env, tasks, ...)   # every BFCL entry should succeed
"""

from __future__ import annotations

import json
from typing import Any

from coevolve.policy.base import Generation, Message, SamplingParams
from coevolve.tasks import Task

FINAL_TEXT = "Done."


class ReplayPolicy:
    name = "replay"
    version = "ground-truth"

    def __init__(self, tasks: list[Task]):
        self._reference = {t.task_id: t.reference_actions for t in tasks}

    def message(self, task_id: str, turn: int, step: int) -> str:
        """The assistant text for ``step`` (0-based model message within the turn) of ``turn``."""
        if task_id not in self._reference:
            raise KeyError(f"ReplayPolicy has no reference calls for task {task_id!r}")
        turns = self._reference[task_id]
        calls = turns[turn] if turn < len(turns) else []
        if step > 0 or not calls:
            return FINAL_TEXT
        return "\n".join(
            "<tool_call>" + json.dumps({"name": c["name"], "arguments": c.get("arguments", {})}) + "</tool_call>"
            for c in calls
        )

    def chat(
        self,
        conversations: list[list[Message]],
        tools: list[list[dict[str, Any]]],
        sampling: SamplingParams,
        meta: list[dict[str, Any]] | None = None,
    ) -> list[Generation]:
        """One replayed message per conversation; ``meta[i]`` must carry task_id, turn and step."""
        if meta is None or len(meta) != len(conversations):
            raise ValueError("ReplayPolicy needs meta (task_id, turn, step) for every conversation")
        out = []
        for m in meta:
            text = self.message(m["task_id"], int(m["turn"]), int(m.get("step", 0)))
            out.append(Generation(text=text, prompt_tokens=0, completion_tokens=0))
        return out
