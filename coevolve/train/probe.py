"""Hand-made single-turn tasks over BFCL-V3 *training scenario states*: a fixed task set on
which a GRPO run's reward can be watched rising (the learning test, ``coevolve bench train``'s
whole-step figure).

Only what the training side may read is used: the initial state of training scenarios
(``coevolve.envs.bfcl_data.scenario_states``). The instructions and reference calls are
written here by hand, never taken from BFCL's questions or ground truth:

    "List the files in the current directory."   -> ls()
    "Print the current working directory."       -> pwd()
    "Create a new directory called backup."      -> mkdir(dir_name="backup")
    ...

The file-system scenarios' states differ (directory trees, current directory), so the same
instruction gives different observations per scenario. ``functions`` limits the tool block
to a few file-system functions (the others go to the state's ``excluded_function``), which
keeps prompts short enough for a CPU test.
"""

from __future__ import annotations

import copy
import json

from coevolve.tasks import Task

# (instruction, reference call): each is answered by one call of the file system.
INSTRUCTIONS: list[tuple[str, dict]] = [
    ("List the files in the current directory.", {"name": "ls", "arguments": {}}),
    ("Print the current working directory.", {"name": "pwd", "arguments": {}}),
    ("How much disk space does the current directory use?", {"name": "du", "arguments": {}}),
    ("Show every file here, hidden ones included.", {"name": "ls", "arguments": {"a": True}}),
    ("Create a new directory called backup.", {"name": "mkdir", "arguments": {"dir_name": "backup"}}),
]

FUNCTIONS = ("ls", "pwd", "du", "cd", "mkdir")


def file_system_tasks(n_scenarios: int = 4, *, heldout: frozenset[int] = frozenset(),
                      functions: tuple[str, ...] = FUNCTIONS, named: bool = False) -> list[Task]:
    """``len(INSTRUCTIONS) x n_scenarios`` single-turn tasks on the first ``n_scenarios``
    training scenarios whose only class is GorillaFileSystem (multi_turn_base states).

    ``named``: the instruction names the call instead ("Call ls with {"a": true}."): a sibling
    family that teaches the call format without what each plain instruction means."""
    from coevolve.envs import bfcl_data

    states = [t for t in bfcl_data.scenario_states(bfcl_data.training_scenarios(heldout), ["multi_turn_base"])
              if t.initial_state["involved_classes"] == ["GorillaFileSystem"]][:n_scenarios]
    if len(states) < n_scenarios:
        raise ValueError(f"only {len(states)} file-system training scenarios, {n_scenarios} asked for")
    hidden = [d["name"] for d in bfcl_data._class_docs("GorillaFileSystem") if d["name"] not in functions]
    tasks = []
    for state in states:
        initial = copy.deepcopy(state.initial_state)
        initial["excluded_function"] = sorted(set(initial.get("excluded_function", [])) | set(hidden))
        for k, (text, call) in enumerate(INSTRUCTIONS):
            if named:
                args = f" with {json.dumps(call['arguments'])}" if call["arguments"] else ""
                text = f"Call {call['name']}{args}."
            tasks.append(Task(
                task_id=f"{state.task_id}-{'named' if named else 'probe'}{k}", env="bfcl-v3", turns=[text],
                initial_state=initial,
                reference_actions=[[copy.deepcopy(call)]], tools=[f for f in state.tools if f in functions],
                category=state.category, split="train", origin="static",
            ))
    return tasks
