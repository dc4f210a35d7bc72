"""The synthetic rollout log of ``coevolve bench signals``: N step rows with planted signals.

    planted = generate_log("/tmp/store", 10_000_000)   # tables/rollouts/round=<r>/bench-<k>.parquet

``generate_log`` writes the step rows of a synthetic run as Parquet into a store, chunk by chunk
with numpy and pyarrow so memory stays bounded whatever N. It plants each kind of signal: tasks
solved in earlier rounds and failed in the last, tasks whose samples disagree, tool-call pairs
that occur in a handful of episodes, coin-flip tasks acted on with low confidence (behaviour
log-probs), and hard tasks that earn partial credit without ever being solved; it mixes in eval episodes, another run's episodes, parse
errors and null outcomes that must not leak. ``Planted`` says what the queries must recover.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coevolve.schemas import ROLLOUTS

# ROLLOUTS columns no signal query reads: the synthetic log leaves them null
_UNREAD = {"prompt_ids", "completion_ids"}
TOKENS_PER_MESSAGE = 4  # behaviour log-probs logged per step (one model message per step here)
LOW_CONFIDENCE = -0.5  # mean token log-prob of the planted uncertain tasks (the others: -0.03)

RUN_ID = "bench"
OTHER_RUN_ID = "bench-other"
N_TOOLS = 40
N_WORKFLOWS = 4  # few enough that their steps are the most common patterns (never rare)
MAX_LEN = 12  # steps per episode: uniform in [4, MAX_LEN]
STEPS_PER_TURN = 4
GROUP = 4  # samples per task per training step
EPOCHS = 2  # each task is trained on once per epoch
TASKS_PER_STEP = 64
# the planted rare pattern, in a few episodes of the last round, and a near miss in one
RARE_PLANTED = ("planted_rare_a", "planted_rare_b")
RARE_NEAR_MISS = ("near_miss_a", "near_miss_b")


@dataclass
class Planted:
    """What ``generate_log`` planted, to check that the queries recover it."""

    rounds: int
    tasks: int
    forgetting: list[str]
    rare: str
    uncertain: list[str]  # coin-flip tasks the policy acts on with low confidence


def _task_kinds(n_tasks: int, rng: np.random.Generator) -> np.ndarray:
    """0 easy, 1 hard, 2 coin flip, 3 forgotten in the last round, 4 learned in the last."""
    return rng.choice(5, size=n_tasks, p=[0.45, 0.35, 0.10, 0.05, 0.05])


def _confidence(n_tasks: int, kinds: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each task's mean token log-prob: low for a third of the coin-flip tasks (planted
    uncertainty) and a few others (low confidence alone, outcomes not mixed), -0.03 elsewhere."""
    low = ((kinds == 2) & (rng.random(n_tasks) < 1 / 3)) | ((kinds == 0) & (rng.random(n_tasks) < 0.02))
    return np.where(low, LOW_CONFIDENCE, -0.03)


def _success_prob(kind: np.ndarray, last_round: bool) -> np.ndarray:
    easy, hard, coin = 0.97, 0.02, 0.5
    before = np.array([easy, hard, coin, 1.0, 0.0])
    after = np.array([easy, hard, coin, 0.0, 1.0])
    return (after if last_round else before)[kind]


def _dict_array(indices: np.ndarray, values: list[str]) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(values)).cast(pa.string())


def _episodes(round_no: int, rounds: int, kinds: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Episode-level arrays of one round: training groups, plus eval and other-run episodes."""
    n_tasks = len(kinds)
    task = np.tile(np.repeat(np.arange(n_tasks), GROUP), EPOCHS)
    epoch = np.repeat(np.arange(EPOCHS), n_tasks * GROUP)
    steps_per_epoch = -(-n_tasks // TASKS_PER_STEP)
    train_step = epoch * steps_per_epoch + task // TASKS_PER_STEP
    sample = np.tile(np.arange(GROUP), n_tasks * EPOCHS)
    phase = np.zeros(len(task), np.int8)  # 0 train, 1 eval
    run = np.zeros(len(task), np.int8)  # 0 this run, 1 another run
    # eval episodes (one per task for a tenth of the tasks) and another run's episodes:
    # both with inverted outcomes, so that any leak changes the signals
    n_extra = max(1, n_tasks // 10)
    extra_task = rng.integers(0, n_tasks, 2 * n_extra)
    task = np.concatenate([task, extra_task])
    epoch = np.concatenate([epoch, np.full(2 * n_extra, -1)])
    train_step = np.concatenate([train_step, np.full(2 * n_extra, -1)])
    sample = np.concatenate([sample, np.zeros(2 * n_extra, np.int64)])
    phase = np.concatenate([phase, np.repeat(np.array([1, 0], np.int8), n_extra)])
    run = np.concatenate([run, np.repeat(np.array([0, 1], np.int8), n_extra)])
    p = _success_prob(kinds[task], last_round=round_no == rounds)
    p = np.where((phase == 1) | (run == 1), 1.0 - p, p)
    success = rng.random(len(task)) < p
    # partial rewards: the fraction of 4 turns passed; a success passes all of them
    reward = np.where(success, 1.0, rng.integers(0, 4, len(task)) / 4.0)
    return {
        "task": task,
        "epoch": epoch,
        "train_step": train_step,
        "sample": sample,
        "phase": phase,
        "run": run,
        "success": success,
        "success_null": rng.random(len(task)) < 0.005,
        "reward": reward,
        "reward_null": rng.random(len(task)) < 0.01,
        "length": rng.integers(4, MAX_LEN + 1, len(task)),
        "format": rng.integers(0, 5, len(task)) / 4.0,
    }


def _logprobs(mean: np.ndarray, rng: np.random.Generator) -> pa.ListArray:
    """``TOKENS_PER_MESSAGE`` log-probs per row around ``mean``, multiples of 1/64 so that any
    order of summation (float32 lists, float64 sums) gives the same totals."""
    n = len(mean)
    noise = rng.integers(-4, 5, (n, TOKENS_PER_MESSAGE)) / 64.0
    values = np.minimum(np.round(mean[:, None] * 64) / 64 + noise, 0.0).astype(np.float32).ravel()
    offsets = np.arange(0, n * TOKENS_PER_MESSAGE + 1, TOKENS_PER_MESSAGE, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.float32()))


def _steps(eps: dict[str, np.ndarray], sel: np.ndarray, round_no: int, workflows: np.ndarray, rng) -> pa.Table:
    """Step rows of the episodes ``sel`` (indices into ``eps``), as a ROLLOUTS table."""
    length = eps["length"][sel]
    n = int(length.sum())
    ep = np.repeat(sel, length)
    starts = np.repeat(np.cumsum(length) - length, length)
    k = np.arange(n) - starts
    task = eps["task"][ep]
    tool = workflows[task % N_WORKFLOWS, k]
    noise = rng.random(n) < 0.01
    tool = np.where(noise, rng.integers(0, N_TOOLS, n), tool)
    no_call = rng.random(n) < 0.03
    parse_error = rng.random(n) < 0.02
    # parse-error steps keep a random name: counting them would change the patterns
    tool = np.where(parse_error, rng.integers(0, N_TOOLS, n), tool)
    tool = np.where(no_call & ~parse_error, -1, tool)
    tools = [f"tool_{i:02d}" for i in range(N_TOOLS)] + list(RARE_PLANTED) + list(RARE_NEAR_MISS)
    names = pa.array(np.asarray(tools, dtype=object)[np.maximum(tool, 0)], pa.string())
    names = pc.if_else(pa.array(tool < 0), pa.scalar(None, pa.string()), names)
    episode_id = pc.binary_join_element_wise(
        np.where(eps["phase"][ep] == 1, f"r{round_no}-v", f"r{round_no}-e").astype(object),
        pa.array(ep).cast(pa.string()),
        "",
    )
    task_id = pc.binary_join_element_wise("t", pa.array(task).cast(pa.string()), "")
    epoch = eps["epoch"][ep]
    train_step = eps["train_step"][ep]
    return pa.table(
        {
            "run_id": _dict_array(eps["run"][ep], [RUN_ID, OTHER_RUN_ID]),
            "phase": _dict_array(eps["phase"][ep], ["train", "eval"]),
            "task_id": task_id,
            "episode_id": episode_id,
            "sample_idx": pa.array(eps["sample"][ep], pa.int32()),
            "train_step": pa.array(train_step, pa.int32(), mask=train_step < 0),
            "epoch": pa.array(epoch, pa.int32(), mask=epoch < 0),
            "turn": pa.array(k // STEPS_PER_TURN, pa.int32()),
            "step": pa.array(k % STEPS_PER_TURN, pa.int32()),
            "action_name": names,
            "action_args": _dict_array(np.maximum(tool, 0) % 3, ['{"path": "a"}', "{}", '{"id": 1, "q": "x"}']),
            "observation": _dict_array(np.zeros(n, np.int8), ["ok"]),
            "parse_error": pa.array(np.where(parse_error, "invalid JSON", None), pa.string()),
            "error": pa.nulls(n, pa.string()),
            "step_reward": pa.array(np.zeros(n)),
            "episode_reward": pa.array(eps["reward"][ep], mask=eps["reward_null"][ep]),
            "success": pa.array(eps["success"][ep], mask=eps["success_null"][ep]),
            "n_tokens": pa.array(rng.integers(5, 60, n), pa.int32()),
            "policy_version": _dict_array(np.zeros(n, np.int8), [f"r{round_no}"]),
            "finish_reason": pa.nulls(n, pa.string()),
            # reward parts: progress is the partial credit, format a per-episode share of well-formed calls
            "reward_progress": pa.array(eps["reward"][ep], mask=eps["reward_null"][ep]),
            "reward_format": pa.array(eps["format"][ep], mask=eps["reward_null"][ep]),
            # a message's log-probs sit on its step row; steps without a call have them too
            "completion_logprobs": _logprobs(eps["confidence"][task], rng),
            # the columns the signal queries do not read stay null
            **{f.name: pa.nulls(n, f.type) for f in ROLLOUTS if f.name in _UNREAD},
        },
        schema=ROLLOUTS,
    )


def _plant_rare(eps: dict[str, np.ndarray], rng: np.random.Generator) -> None:
    """Route 2 training episodes through the planted pair and 1 through the near miss.

    Two episodes is the least a candidate pattern has, so the pair sits at or under the
    round's count quantile whatever the log's size; the near miss is seen in one episode."""
    train = np.flatnonzero((eps["phase"] == 0) & (eps["run"] == 0))
    chosen = rng.choice(train, 3, replace=False)
    eps["plant"] = np.full(len(eps["task"]), -1)
    eps["plant"][chosen[:2]] = 0
    eps["plant"][chosen[2]] = 1


def _apply_plants(table: pa.Table, eps: dict[str, np.ndarray], sel: np.ndarray) -> pa.Table:
    """Overwrite the first two calls of planted episodes with the planted pair (no parse error)."""
    length = eps["length"][sel]
    plant = np.repeat(eps["plant"][sel], length)
    k = np.arange(len(plant)) - np.repeat(np.cumsum(length) - length, length)
    hit = (plant >= 0) & (k < 2)
    if not hit.any():
        return table
    planted = np.where(k == 0, RARE_PLANTED[0], RARE_PLANTED[1])
    pair = np.where(plant == 0, planted, np.where(k == 0, RARE_NEAR_MISS[0], RARE_NEAR_MISS[1]))
    names = pc.if_else(pa.array(hit), pa.array(pair.astype(object), pa.string()), table.column("action_name"))
    errors = pc.if_else(pa.array(hit), pa.scalar(None, pa.string()), table.column("parse_error"))
    table = table.set_column(table.schema.get_field_index("action_name"), "action_name", names)
    return table.set_column(table.schema.get_field_index("parse_error"), "parse_error", errors)


def generate_log(
    store_dir: str | Path, rows: int, *, rounds: int = 4, seed: int = 0, chunk_rows: int = 2_000_000
) -> Planted:
    """Write about ``rows`` step rows of run ``bench`` (rounds 1..``rounds``) into the store at
    ``store_dir``; return what was planted. Memory stays within a few chunks of rows."""
    rng = np.random.default_rng(seed)
    per_task = rounds * EPOCHS * GROUP * (4 + MAX_LEN) / 2 * 1.025  # step rows per task, with eval and other run
    n_tasks = max(TASKS_PER_STEP, int(rows / per_task))
    kinds = _task_kinds(n_tasks, rng)
    workflows = rng.integers(0, N_TOOLS, (N_WORKFLOWS, MAX_LEN))
    confidence = _confidence(n_tasks, kinds, rng)
    base = Path(store_dir) / "tables" / "rollouts"
    for stale in base.glob("round=*/bench-*.parquet"):  # an earlier, larger log's extra parts
        stale.unlink()
    for round_no in range(1, rounds + 1):
        eps = _episodes(round_no, rounds, kinds, rng)
        eps["confidence"] = confidence
        out = base / f"round={round_no}"
        out.mkdir(parents=True, exist_ok=True)
        plant = round_no == rounds
        if plant:
            _plant_rare(eps, rng)
        cum = np.cumsum(eps["length"])
        cuts = np.searchsorted(cum, np.arange(chunk_rows, int(cum[-1]), chunk_rows))
        edges = np.unique(np.concatenate([[0], cuts, [len(cum)]]))
        for part, (start, stop) in enumerate(zip(edges[:-1], edges[1:])):
            sel = np.arange(start, stop)
            table = _steps(eps, sel, round_no, workflows, rng)
            if plant:
                table = _apply_plants(table, eps, sel)
            pq.write_table(table, out / f"bench-{part:04d}.parquet", compression="zstd", row_group_size=256_000)
    forgotten = [f"t{i}" for i in np.flatnonzero(kinds == 3)]
    uncertain = [f"t{i}" for i in np.flatnonzero((kinds == 2) & (confidence == LOW_CONFIDENCE))]
    return Planted(
        rounds=rounds, tasks=n_tasks, forgetting=forgotten, rare=" > ".join(RARE_PLANTED), uncertain=uncertain
    )
