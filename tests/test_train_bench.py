"""``coevolve bench train``'s measurement runs the trainer's step and the plain reference on one
model, and the benchmarks' tasks are synthesized (round 0), never BFCL's questions."""

from __future__ import annotations

from coevolve.bench.train import measure_update
from coevolve.train.probe import split_by_scenario, synthesized_tasks


def test_trainer_and_plain_reference_are_timed_side_by_side():
    m = measure_update("tiny", lora=False, steps=1, batch=2, seq_len=64, threads=1)
    assert m["trainer_s"] > 0 and m["reference_s"] > 0 and m["threads"] == 1
    assert m["ratio"] == m["reference_s"] / m["trainer_s"] and m["tokens"] == 128 and m["trainable"] > 10**6
    assert m["trainer_bf16_s"] > 0 and m["bf16_speedup"] == m["trainer_s"] / m["trainer_bf16_s"]
    assert m["auto"] == "float32"  # the tiny model is under the 50M parameters where bfloat16 pays


def test_probe_tasks_are_round_zero_synthesized_tasks_split_by_scenario():
    tasks = synthesized_tasks(0)
    assert tasks == synthesized_tasks(0)  # deterministic for a seed
    assert tasks and all(t.origin == "static" and t.split == "train" and "~" in t.task_id for t in tasks)
    short = synthesized_tasks(0, max_turns=1)
    assert short and all(len(t.turns) == 1 for t in short) and len(short) < len(tasks)
    first, rest = split_by_scenario(tasks, 0.5)
    assert first and rest and len(first) + len(rest) == len(tasks)
    assert not {t.task_id.split("~")[0] for t in first} & {t.task_id.split("~")[0] for t in rest}


def test_bench_tables_print_at_full_width_into_a_pipe(capsys):
    from rich.table import Table

    from coevolve.cli.common import print_table

    table = Table(*[f"trainer / plain speed {i}" for i in range(6)])
    table.add_row(*[f"smollm2 LoRA r=16 {i}" for i in range(6)])
    print_table(table)  # captured output is not a terminal
    out = capsys.readouterr().out
    assert "smollm2 LoRA r=16 5" in out and "…" not in out and max(len(line) for line in out.splitlines()) > 80


def test_the_update_flop_count_is_the_models_own_projection_weights(monkeypatch):
    """``linear_params`` (from the config) is the number of weights of every layer's linear
    projections of the built model: the embedding, norms and output head are not in it;
    ``matmul_flops`` is 2 n^3 over the fastest of its timed products."""
    import types

    import torch
    from transformers import AutoModelForCausalLM

    from coevolve.bench import limits
    from coevolve.bench.limits import linear_params, matmul_flops
    from coevolve.policy.models import resolve_model

    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"))
    layers = model.get_decoder().layers
    counted = sum(m.weight.numel() for m in layers.modules() if isinstance(m, torch.nn.Linear))
    assert linear_params("tiny") == linear_params(model.config) == counted
    # a clock read before and after each product: they take 0.5 s, 0.25 s and 0.75 s
    ticks = iter([10.0, 10.5, 20.0, 20.25, 30.0, 30.75])
    monkeypatch.setattr(limits, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    assert matmul_flops(n=256, repeats=3) == 2 * 256**3 / 0.25
    assert next(ticks, None) is None  # every product timed, no more


def _logged_step(rewards: list[float], step: int = 1) -> list[dict]:
    """Train rollout rows of one task's group, one model message each, opening with 40 shared ids."""
    rows = []
    for i, reward in enumerate(rewards):
        rows.append(
            {
                "phase": "train", "round": 1, "train_step": step, "task_id": "t", "episode_id": f"e{step}.{i}",
                "turn": 0, "step": 0, "n_tokens": 5, "episode_reward": reward,
                "prompt_ids": list(range(3, 43)) + [50 + i, 60 + i],
                "completion_ids": [70 + i, 71, 72, 73, 2], "completion_logprobs": [-1.0] * 5,
            }
        )  # fmt: skip
    return rows


class _Rows:
    def __init__(self, rows):
        self.rows = rows

    def read(self, table, filter=None):
        import pyarrow as pa

        assert table == "rollouts"
        rows = pa.Table.from_pylist(self.rows)
        return rows if filter is None else rows.filter(filter)


def test_a_logged_update_is_replayed_on_the_steps_own_sequences():
    import pytest

    from coevolve.bench.train import replay_update

    store = _Rows(_logged_step([1.0, 0.0, 0.2]) + _logged_step([0.0, 1.0], step=2))
    r = replay_update(store, round_no=1, step=1, model_name="tiny", profile=5)
    # step 1's three episodes only, one sequence each; their 40-id opening is computed once
    assert r["n_sequences"] == 3 and r["lengths"] == [47, 47, 47] and r["n_tokens"] == 141
    assert r["n_computed_tokens"] == 40 + 3 * 7 and r["seconds"] > 0 and r["precision"] == "float32"
    assert "aten::" in r["profile"] and len(r["profile"].splitlines()) < 20
    even = replay_update(_Rows(_logged_step([1.0, 0.0, 0.5])), round_no=1, step=1, model_name="tiny")
    assert even["n_sequences"] == 2  # the episode at its group's mean has no advantage: not trained on
    with pytest.raises(ValueError, match="no train rollouts of round 1, step 3"):
        replay_update(store, round_no=1, step=3, model_name="tiny")
    with pytest.raises(ValueError, match="past tiny's vocabulary"):
        replay_update(_Rows(_logged_step([1.0, 0.0]) + [{**_logged_step([0.0])[0], "completion_ids": [5000] * 5, "episode_id": "x"}]),
                      round_no=1, step=1, model_name="tiny")  # fmt: skip
    with pytest.raises(ValueError, match="rewards are equal"):
        replay_update(_Rows(_logged_step([0.5, 0.5])), round_no=1, step=1, model_name="tiny")
