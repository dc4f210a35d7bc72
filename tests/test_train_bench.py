"""``coevolve bench train``'s measurement runs the trainer's step and the plain reference on one
model, and the probe tasks are built from training scenario states only."""

from __future__ import annotations

from coevolve.train.bench import measure_update
from coevolve.train.probe import INSTRUCTIONS, file_system_tasks


def test_trainer_and_plain_reference_are_timed_side_by_side():
    m = measure_update("tiny", lora=False, steps=1, batch=2, seq_len=64, threads=1)
    assert m["trainer_s"] > 0 and m["reference_s"] > 0 and m["threads"] == 1
    assert m["ratio"] == m["reference_s"] / m["trainer_s"] and m["tokens"] == 128 and m["trainable"] > 10**6


def test_probe_tasks_use_training_scenario_states_and_hand_made_calls():
    from coevolve.envs.bfcl_data import scenario_of

    heldout = frozenset({1, 2, 3})
    tasks = file_system_tasks(2, heldout=heldout)
    named = file_system_tasks(2, heldout=heldout, named=True)
    assert len(tasks) == len(named) == 2 * len(INSTRUCTIONS)
    scenarios = {scenario_of(t.task_id.rsplit("-", 1)[0]) for t in tasks}
    assert not scenarios & heldout
    assert [t.reference_actions for t in tasks] == [t.reference_actions for t in named]
    assert named[0].turns == ["Call ls."] and tasks[0].turns == [INSTRUCTIONS[0][0]]
    assert all(set(t.tools) <= {"ls", "pwd", "du", "cd", "mkdir"} for t in tasks)
