"""Export coevolve tasks as verl's RL dataset Parquet, and the agent-loop registration YAML.

One row per task, in the columns verl's ``RLHFDataset`` reads:

- ``data_source``  ``"coevolve/<env>"``
- ``prompt``       the opening chat (the first turn's user message) - verl only measures and
                   passes it on; coevolve's agent loop rebuilds the full prompt from the task
- ``ability``      ``"tool_use"``
- ``reward_model`` ``{"style": "rule", "ground_truth": <reference actions JSON>}``
- ``extra_info``   ``{"index", "task_id", "task" (the Task as JSON: turns, initial state, tools)}``;
                   no ``tools_kwargs``: the agent loop runs coevolve's environment, not verl tools
                   (and Parquet cannot store an empty struct)
- ``agent_name``   ``"coevolve"`` (which registered agent loop runs the row)
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from coevolve.tasks import Task
from coevolve.train.verl_config import AGENT_NAME

AGENT_LOOP_TARGET = "coevolve.train.verl_agent_loop.CoevolveAgentLoop"


def task_rows(tasks: list[Task]) -> list[dict]:
    """The dataset rows of ``tasks`` (see the module docstring for the columns)."""
    rows = []
    for i, task in enumerate(tasks):
        first = next((t for t in task.turns if t), "")
        rows.append(
            {
                "data_source": f"coevolve/{task.env}",
                "prompt": [{"role": "user", "content": first}],
                "ability": "tool_use",
                "reward_model": {"style": "rule", "ground_truth": json.dumps(task.reference_actions)},
                "extra_info": {
                    "index": i,
                    "task_id": task.task_id,
                    "task": task.to_json(),
                },
                "agent_name": AGENT_NAME,
            }
        )
    return rows


def export_tasks(tasks: list[Task], path: str | Path) -> str:
    """Write ``tasks`` as verl's dataset Parquet at ``path``; returns the path."""
    if not tasks:
        raise ValueError("no tasks to export: the pool is empty")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(task_rows(tasks))
    pq.write_table(table, path)
    return str(path)


def write_agent_loop_config(path: str | Path) -> str:
    """Write the YAML that registers coevolve's agent loop with verl's workers
    (``actor_rollout_ref.rollout.agent.agent_loop_config_path``); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"- name: {AGENT_NAME}\n  _target_: {AGENT_LOOP_TARGET}\n")
    return str(path)
