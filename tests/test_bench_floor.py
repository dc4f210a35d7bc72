"""``coevolve bench floor``: a run's logged model work, weighed in FLOPs, beside its stage times."""

from __future__ import annotations

from typer.testing import CliRunner

from coevolve.bench.floor import stage_seconds, work_floor
from coevolve.bench.limits import attention_width, head_params, linear_params
from coevolve.train.scoring import causal_keys
from coevolve.cli import app
from coevolve.store import Store


def _message(phase, episode, step, prompt, answer):
    return {
        "phase": phase,
        "episode_id": episode,
        "turn": 0,
        "step": step,
        "prompt_ids": prompt,
        "completion_ids": answer,
    }


def _run_store(tmp_path) -> Store:
    system = list(range(100, 140))
    store = Store(str(tmp_path / "s"))
    store.write(
        "rollouts",
        1,
        "run-train",
        [
            _message("train", "a", 0, system + [1, 2], [3, 4, 5]),
            _message("train", "a", 1, system + [1, 2, 3, 4, 5, 6], [7]),  # extends: 1 new token
            {"phase": "train", "episode_id": "a", "turn": 0, "step": 1, "action_name": "ls"},  # a call's second row
            _message("train", "b", 0, system + [8], [9, 10]),  # shares the system message with a
        ],
    )
    store.write("rollouts", 1, "run-eval", [_message("eval", "e", 0, system + [11], [12])])
    store.write("rollouts", 2, "run-eval", [_message("eval", "f", 0, [7, 7, 7], [12, 13])])
    # two optimizer steps in round 1, one in round 2 (logged before train_steps had n_attended_keys)
    store.write(
        "train_steps",
        1,
        "run",
        [
            {"step": 1, "n_computed_tokens": 300, "n_attended_keys": 9000},
            {"step": 2, "n_computed_tokens": 200, "n_attended_keys": 6000},
        ],
    )
    store.write("train_steps", 2, "run", [{"step": 1, "n_computed_tokens": 50}])
    store.write(
        "rounds",
        1,
        "run",
        [
            {
                "t_train_rollouts": 4.0,
                "t_train_update": 6.0,
                "t_validate_pass2": None,
                "t_evaluate_prefill": 1.5,
                "t_evaluate_decode": 2.5,
            }
        ],
    )
    return store


def test_floor_counts_computed_prompt_tokens_sampled_tokens_and_update_tokens_per_round(tmp_path):
    store = _run_store(tmp_path)
    rows = {(r["round"], r["stage"]): r for r in work_floor(store, "tiny")}
    assert sorted({r for r, _ in rows}) == [1, 2], "round 0 has no model work"

    train = rows[(1, "train rollouts")]
    # prefill: a's opening (42), a's extension (1 new token), b's opening past the shared system (1)
    assert (train["prefill_tokens"], train["decode_tokens"]) == (42 + 1 + 1, 3 + 1 + 2)
    assert rows[(1, "train update")]["update_tokens"] == 500 and rows[(2, "train update")]["update_tokens"] == 50
    # eval's opening in round 1 shares nothing with another eval episode of its round
    assert (rows[(1, "evaluate")]["prefill_tokens"], rows[(1, "evaluate")]["decode_tokens"]) == (41, 1)
    assert rows[(1, "validate pass 2")]["flops"] == 0, "no validation attempts logged"

    # each token fed attends to itself and everything before it: a's opening and two of its three
    # sampled tokens (the last ends the message), a's one new token, b's new token and first sample
    keys = causal_keys(0, 42 + 2) + causal_keys(45, 46) + causal_keys(40, 42)
    assert train["attended_keys"] == keys
    linear, head, width = linear_params("tiny"), head_params("tiny"), attention_width("tiny")
    # 3 messages: 44 prompt tokens and 6 - 3 sampled ones fed; 6 sampled through the output head
    assert train["attention_flops"] == 4 * width * keys
    assert train["flops"] == 2 * linear * (44 + 6 - 3) + 2 * head * 6 + 4 * width * keys

    update = rows[(1, "train update")]
    assert update["attended_keys"] == 15000 and update["attention_flops"] == 12 * width * 15000
    assert update["flops"] == 4 * linear * 500 + 12 * width * 15000, "LoRA: forward and activation gradients"
    old = rows[(2, "train update")]
    assert old["attended_keys"] == 0 and old["flops"] == 4 * linear * 50, "no n_attended_keys: projections only"
    full = {(r["round"], r["stage"]): r for r in work_floor(store, "tiny", lora=False)}
    assert full[(1, "train update")]["flops"] == 6 * linear * 500 + 12 * width * 15000, "every weight: its gradient"


def test_stage_seconds_sum_the_columns_that_time_each_stage(tmp_path):
    seconds = stage_seconds(_run_store(tmp_path))
    assert seconds[(1, "evaluate")] == 4.0, "prefill + decode"
    assert seconds[(1, "train update")] == 6.0
    assert (1, "validate pass 2") not in seconds, "a stage whose time was not measured has none"


def test_bench_floor_prints_the_floor_beside_the_measured_time(tmp_path):
    store = _run_store(tmp_path)
    res = CliRunner().invoke(app, ["bench", "floor", "--store", store.uri, "--model", "tiny", "--precision", "float32"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # the console wraps long lines
    assert "train update" in text and "this machine: CPU" in text
    assert "float32 matrix products reach" in text and "takes at least" in text
    assert "nor the update's attention" in text, "round 2's step predates n_attended_keys"

    empty = CliRunner().invoke(app, ["bench", "floor", "--store", str(tmp_path / "none"), "--model", "tiny"])
    assert empty.exit_code != 0
    bad = CliRunner().invoke(app, ["bench", "floor", "--store", store.uri, "--precision", "fp8"])
    assert bad.exit_code == 2 and "--precision" in bad.output
