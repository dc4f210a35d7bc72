"""Benchmark of the signal queries: a synthetic rollout log, a pandas reference, timings.

    coevolve bench signals --rows 10000000

1. ``generate_log`` writes N step rows of a synthetic run as Parquet into a store
   (``tables/rollouts/round=<r>/bench-<k>.parquet``), chunk by chunk with numpy and pyarrow
   so memory stays bounded whatever N. It plants each kind of signal: tasks solved in
   earlier rounds and failed in the last, tasks whose samples disagree, and tool-call
   pairs that occur in a handful of episodes; it mixes in eval episodes, another run's
   episodes, parse errors and null outcomes that must not leak.
2. The SQL side (``coevolve.signals.run_queries``) and ``pandas_signals``, a vectorized
   pandas implementation of the same definitions (groupby / shift / merge, no Python
   loop over rows or groups), each run in a fresh child process, so that the peak memory
   each reports (``ru_maxrss``, the child's resident high-water mark) is its own.
3. ``compare`` checks both found the same signals: same keys, same counts and evidence,
   numbers equal to a relative 1e-9.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from coevolve.config import SignalsConfig
from coevolve.schemas import ROLLOUTS

# ROLLOUTS columns no signal query reads: the synthetic log leaves them null
_UNREAD = {"reward_progress", "reward_format", "prompt_ids", "completion_ids", "completion_logprobs"}

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
KEY = {"forgetting": "task_id", "boundary": "task_id", "rare": "pattern"}


@dataclass
class Planted:
    """What ``generate_log`` planted, to check that the queries recover it."""

    rounds: int
    tasks: int
    forgetting: list[str]
    rare: str


# --------------------------------------------------------------------------- synthetic log
def _task_kinds(n_tasks: int, rng: np.random.Generator) -> np.ndarray:
    """0 easy, 1 hard, 2 coin flip, 3 forgotten in the last round, 4 learned in the last."""
    return rng.choice(5, size=n_tasks, p=[0.45, 0.35, 0.10, 0.05, 0.05])


def _success_prob(kind: np.ndarray, last_round: bool) -> np.ndarray:
    easy, hard, coin = 0.97, 0.02, 0.5
    before = np.array([easy, hard, coin, 1.0, 0.0])
    after = np.array([easy, hard, coin, 0.0, 1.0])
    return (after if last_round else before)[kind]


def _dict_array(indices: np.ndarray, values: list[str]) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(values)).cast(pa.string())


def _episodes(round: int, rounds: int, kinds: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
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
    p = _success_prob(kinds[task], last_round=round == rounds)
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
    }


def _steps(eps: dict[str, np.ndarray], sel: np.ndarray, round: int, workflows: np.ndarray, rng) -> pa.Table:
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
        np.where(eps["phase"][ep] == 1, f"r{round}-v", f"r{round}-e").astype(object),
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
            "policy_version": _dict_array(np.zeros(n, np.int8), [f"r{round}"]),
            "finish_reason": pa.nulls(n, pa.string()),
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
    base = Path(store_dir) / "tables" / "rollouts"
    for stale in base.glob("round=*/bench-*.parquet"):  # an earlier, larger log's extra parts
        stale.unlink()
    for round in range(1, rounds + 1):
        eps = _episodes(round, rounds, kinds, rng)
        out = base / f"round={round}"
        out.mkdir(parents=True, exist_ok=True)
        plant = round == rounds
        if plant:
            _plant_rare(eps, rng)
        cum = np.cumsum(eps["length"])
        cuts = np.searchsorted(cum, np.arange(chunk_rows, int(cum[-1]), chunk_rows))
        edges = np.unique(np.concatenate([[0], cuts, [len(cum)]]))
        for part, (start, stop) in enumerate(zip(edges[:-1], edges[1:])):
            sel = np.arange(start, stop)
            table = _steps(eps, sel, round, workflows, rng)
            if plant:
                table = _apply_plants(table, eps, sel)
            pq.write_table(table, out / f"bench-{part:04d}.parquet", compression="zstd", row_group_size=256_000)
    forgotten = [f"t{i}" for i in np.flatnonzero(kinds == 3)]
    return Planted(rounds=rounds, tasks=n_tasks, forgetting=forgotten, rare=" > ".join(RARE_PLANTED))


# --------------------------------------------------------------------------- pandas reference
def _read(store_dir: str | Path, run_id: str, columns: list[str], phases: list[str], where: Any) -> pd.DataFrame:
    """Rows of ``run_id`` in ``phases`` matching ``where`` (a pyarrow dataset expression)."""
    dataset = ds.dataset(
        Path(store_dir) / "tables" / "rollouts",
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("round", pa.int32())]), flavor="hive"),
    )
    filt = (ds.field("run_id") == run_id) & ds.field("phase").isin(phases) & where
    table = dataset.to_table(columns=columns, filter=filt)
    if "success" in columns:  # nullable bool -> 1.0 / 0.0 / NaN, so that max and mean skip nulls
        table = table.set_column(
            table.schema.get_field_index("success"), "success", pc.cast(table["success"], pa.float64())
        )
    return table.to_pandas()


def _forgetting(store_dir, cfg: SignalsConfig, run_id: str, round: int) -> pd.DataFrame:
    cols = ["round", "phase", "episode_id", "task_id", "epoch", "train_step", "success", "episode_reward"]
    df = _read(store_dir, run_id, cols, cfg.phases, (ds.field("round") <= round) & ds.field("task_id").is_valid())
    ep = df.groupby(cols[:-2], dropna=False, sort=False).agg(
        success=("success", "max"), reward=("episode_reward", "max")
    )
    ep = ep.reset_index()
    point = ["task_id", "round", "epoch", "train_step"]
    pts = (
        ep.groupby(point, dropna=False, sort=False)
        .agg(n=("success", "size"), rate=("success", "mean"), reward=("reward", "mean"))
        .reset_index()
    )
    failing = ep[ep["success"].ne(1)].groupby(point, dropna=False)["episode_id"].min().rename("failing_episode_id")
    pts = pts.merge(failing.reset_index(), on=point, how="left")
    pts = pts.sort_values(point, na_position="last", kind="stable")
    pts["recency"] = pts.groupby("task_id").cumcount(ascending=False) + 1
    latest = pts[(pts["recency"] == 1) & (pts["round"] == round)]
    pairs = pts[pts["recency"] > 1].merge(latest, on="task_id", suffixes=("_before", "_now"))
    success_ok = (pairs["rate_before"] >= cfg.forget_before_min) & (pairs["rate_now"] <= cfg.forget_now_max)
    reward_diff = pairs["reward_before"] - pairs["reward_now"]
    pairs["success_drop"] = (pairs["rate_before"] - pairs["rate_now"]).where(success_ok)
    pairs["reward_drop"] = reward_diff.where(reward_diff >= cfg.forget_reward_drop - 1e-9)
    pairs["drop"] = pairs[["success_drop", "reward_drop"]].max(axis=1).round(12)
    pairs = pairs[pairs["drop"].notna()]
    out = pairs.sort_values(["task_id", "drop", "recency_before"], ascending=[True, False, True]).drop_duplicates(
        "task_id"
    )
    return pd.DataFrame(
        {
            "task_id": out["task_id"],
            "score": out["drop"],
            "success_drop": out["success_drop"].round(12),
            "reward_drop": out["reward_drop"].round(12),
            "before_rate": out["rate_before"],
            "before_reward": out["reward_before"],
            "before_n": out["n_before"],
            "before_round": out["round_before"],
            "before_epoch": out["epoch_before"],
            "before_step": out["train_step_before"],
            "now_rate": out["rate_now"],
            "now_reward": out["reward_now"],
            "now_n": out["n_now"],
            "now_epoch": out["epoch_now"],
            "now_step": out["train_step_now"],
            "failing_episode_id": out["failing_episode_id_now"],
        }
    )


def _boundary(store_dir, cfg: SignalsConfig, run_id: str, round: int) -> pd.DataFrame:
    cols = ["phase", "episode_id", "task_id", "success", "episode_reward"]
    df = _read(store_dir, run_id, cols, cfg.phases, (ds.field("round") == round) & ds.field("task_id").is_valid())
    ep = (
        df.groupby(cols[:3], sort=False).agg(success=("success", "max"), reward=("episode_reward", "max")).reset_index()
    )
    g = ep.groupby("task_id", sort=False)
    tasks = g.agg(
        n=("success", "size"),
        n_success=("success", "count"),
        rate=("success", "mean"),
        n_reward=("reward", "count"),
    )
    tasks["reward_var"] = g["reward"].var(ddof=0)
    tasks["failing_episode_id"] = ep[ep["success"].ne(1)].groupby("task_id")["episode_id"].min()
    tasks = tasks.reset_index()
    keep = ((tasks["n_success"] >= cfg.boundary_min_samples) & (tasks["rate"] > 0) & (tasks["rate"] < 1)) | (
        (tasks["n_reward"] >= cfg.boundary_min_samples) & (tasks["reward_var"] >= cfg.boundary_reward_std**2 - 1e-9)
    )
    tasks = tasks[keep]
    score = np.maximum((tasks["rate"] * (1 - tasks["rate"])).fillna(0), tasks["reward_var"].fillna(0)).round(12)
    return tasks.assign(score=score)[
        ["task_id", "score", "n", "n_success", "rate", "n_reward", "reward_var", "failing_episode_id"]
    ]


def _rare(store_dir, cfg: SignalsConfig, run_id: str, round: int) -> pd.DataFrame:
    if cfg.rare_with_arg_keys:
        raise ValueError("the pandas reference implements name patterns only (rare_with_arg_keys=false)")
    cols = ["phase", "episode_id", "task_id", "turn", "step", "action_name", "parse_error"]
    where = (ds.field("round") == round) & ds.field("action_name").is_valid()
    if not cfg.include_parse_errors:
        where = where & ds.field("parse_error").is_null()
    df = _read(store_dir, run_id, cols, cfg.phases, where)
    df = df.sort_values(["phase", "episode_id", "turn", "step"], kind="stable")
    phase, episode = df["phase"].to_numpy(), df["episode_id"].to_numpy()
    first = np.r_[True, (phase[1:] != phase[:-1]) | (episode[1:] != episode[:-1])]
    ep = np.cumsum(first) - 1  # episode number of each step (rows are sorted by episode)
    tok, vocab = pd.factorize(df["action_name"])
    n, size = cfg.rare_n, len(df)
    gram_cols = [f"c{j}" for j in range(n)]
    # the n-gram starting at each step: its token and the next n-1 of the same episode
    grams = {"c0": tok}
    valid = np.ones(size, bool)
    for j in range(1, n):
        shifted = np.full(size, -1)
        shifted[: size - j] = tok[j:]
        same = np.zeros(size, bool)
        same[: size - j] = ep[j:] == ep[: size - j]
        grams[f"c{j}"] = shifted
        valid &= same
    grams = pd.DataFrame({**grams, "ep": ep})[valid]
    per_episode = grams.groupby(gram_cols + ["ep"], sort=False).size().rename("c").reset_index()
    counts = per_episode.groupby(gram_cols, sort=False).agg(n_occurrences=("c", "sum"), n_episodes=("c", "size"))
    total = int(counts["n_occurrences"].sum())
    counts["share"] = counts["n_occurrences"] / total
    candidates = counts[counts["n_episodes"] >= cfg.rare_min_episodes]
    # the lower quantile of the candidates' counts, as DuckDB's quantile_disc takes it
    ranked = np.sort(candidates["n_occurrences"].to_numpy())
    cutoff = int(ranked[int(np.floor(cfg.rare_quantile * (len(ranked) - 1)))]) if len(ranked) else 0
    keep = (candidates["n_occurrences"] <= cutoff) & (candidates["n_occurrences"] < ranked.max(initial=0))
    rare = candidates[keep & (total >= cfg.rare_min_total)].reset_index()
    rare["cutoff"] = cutoff
    names = np.stack([np.asarray(vocab, dtype=object)[rare[c].to_numpy()] for c in gram_cols], axis=1)
    rare["pattern"] = names[:, 0]
    for j in range(1, n):
        rare["pattern"] = rare["pattern"] + " > " + names[:, j]
    rare["actions"] = names.tolist()
    # evidence: first task ids and episode ids of each rare pattern, sorted
    ep_task = df["task_id"].to_numpy()[first]
    ep_id = df["episode_id"].to_numpy()[first]
    hits = per_episode.merge(rare[gram_cols + ["pattern"]], on=gram_cols)
    hits = pd.DataFrame({"pattern": hits["pattern"], "task_id": ep_task[hits["ep"]], "episode_id": ep_id[hits["ep"]]})
    evidence = {}
    for col in ("task_id", "episode_id"):
        firsts = (
            hits[["pattern", col]]
            .drop_duplicates()
            .sort_values(["pattern", col])
            .groupby("pattern")
            .head(cfg.evidence_limit)
        )
        evidence[f"{col}s"] = firsts.groupby("pattern")[col].agg(list)
    rare = rare.merge(pd.DataFrame(evidence), left_on="pattern", right_index=True)
    rare["total"] = total
    rare["score"] = (total / rare["n_occurrences"]).round(12)
    return rare[
        [
            "pattern",
            "score",
            "n_occurrences",
            "n_episodes",
            "share",
            "total",
            "cutoff",
            "actions",
            "task_ids",
            "episode_ids",
        ]
    ]


def pandas_signals(store_dir: str | Path, cfg: SignalsConfig, run_id: str, round: int) -> dict[str, pd.DataFrame]:
    """The reference: every signal of ``run_id`` at ``round``, per type, with the columns of
    the SQL queries, computed with vectorized pandas from the local store at ``store_dir``."""
    return {
        "forgetting": _forgetting(store_dir, cfg, run_id, round),
        "boundary": _boundary(store_dir, cfg, run_id, round),
        "rare": _rare(store_dir, cfg, run_id, round),
    }


# --------------------------------------------------------------------------- comparison
def _plain(value: Any) -> Any:
    """One value in a form both sides agree on: None for nulls, floats for numbers, tuples for lists."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(_plain(v) for v in value)
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, float, np.integer, np.floating)) or type(value).__name__ == "Decimal":
        return float(value)
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal, numbers to 1e-9 (the two sides sum variances in different orders)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def canonical(found: dict[str, pa.Table | pd.DataFrame]) -> dict[str, list[dict]]:
    """Signals of each type as plain rows sorted by key, for comparison and for JSON."""
    out = {}
    for signal_type, rows in found.items():
        records = rows.to_pylist() if isinstance(rows, pa.Table) else rows.to_dict("records")
        plain = [{k: _plain(v) for k, v in r.items()} for r in records]
        out[signal_type] = sorted(plain, key=lambda r: r[KEY[signal_type]])
    return out


def compare(a: dict[str, list[dict]], b: dict[str, list[dict]]) -> list[str]:
    """Differences between two canonical signal sets (empty when identical)."""
    problems = []
    for signal_type in KEY:
        left = {r[KEY[signal_type]]: r for r in a[signal_type]}
        right = {r[KEY[signal_type]]: r for r in b[signal_type]}
        only_l, only_r = sorted(set(left) - set(right)), sorted(set(right) - set(left))
        if only_l or only_r:
            problems.append(
                f"{signal_type}: only SQL {only_l[:5]} ({len(only_l)}), only pandas {only_r[:5]} ({len(only_r)})"
            )
        for key in sorted(set(left) & set(right)):
            diff = {c for c in left[key] if not _same(left[key][c], right[key].get(c))}
            if diff:
                problems.append(f"{signal_type} {key}: columns {sorted(diff)} differ: {left[key]} vs {right[key]}")
                break
    return problems


# --------------------------------------------------------------------------- the benchmark
def _measure(side: str, store_dir: str, cfg: SignalsConfig, round: int, out: str) -> None:
    """Child process: mine the signals one way, write them as JSON to ``out`` with the
    wall time and this process's peak resident memory."""
    start, cpu = time.perf_counter(), time.process_time()
    if side == "sql":
        from coevolve.signals import run_queries
        from coevolve.sql import connect
        from coevolve.store import Store

        con = connect(Store(store_dir), memory_limit=cfg.memory_limit, threads=cfg.threads or None)
        found = run_queries(con, cfg, RUN_ID, round)
    else:
        found = pandas_signals(store_dir, cfg, RUN_ID, round)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu  # cpu: all threads
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    result = {"seconds": seconds, "cpu_seconds": cpu, "peak_mb": peak_mb, "load": os.getloadavg()[0]}
    Path(out).write_text(json.dumps(result | {"signals": canonical(found)}))


def _child(side: str, store_dir: str, cfg: SignalsConfig, round: int, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "coevolve.bench.signals",
        side,
        store_dir,
        json.dumps(cfg.__dict__),
        str(round),
        str(out),
    ]
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def _timing(side: dict) -> str:
    # CPU seconds and the machine's load beside the wall time: on a shared machine the
    # wall time alone says more about the neighbours than about the queries
    return f"{side['seconds']:.2f} s wall ({side['cpu_seconds']:.2f} s CPU, load {side['load']:.1f} on {os.cpu_count()} cores)"


def bench(
    rows: int,
    store_dir: str,
    *,
    rounds: int = 4,
    cfg: SignalsConfig | None = None,
    pandas_max_rows: int = 30_000_000,
    echo: Any = print,
) -> dict:
    """Generate the log, mine it both ways in child processes, compare, print the figures.

    Returns ``{"sql": {...}, "pandas": {...} or None, "identical": bool | None, ...}``.
    """
    cfg = cfg or SignalsConfig()
    start = time.perf_counter()
    planted = generate_log(store_dir, rows, rounds=rounds)
    files = list((Path(store_dir) / "tables" / "rollouts").rglob("*.parquet"))
    written = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    size_mb = sum(f.stat().st_size for f in files) / 2**20
    echo(
        f"log: {written:,} step rows, {planted.tasks:,} tasks, rounds 1-{rounds}, {len(files)} files, "
        f"{size_mb:,.0f} MiB, generated in {time.perf_counter() - start:.1f} s ({store_dir})"
    )
    scratch = Path(store_dir) / "bench-results"
    scratch.mkdir(exist_ok=True)
    sql = _child("sql", store_dir, cfg, rounds, scratch / "sql.json")
    counts = ", ".join(f"{t} {len(v):,}" for t, v in sql["signals"].items())
    echo(
        f"SQL (DuckDB, threads={cfg.threads or os.cpu_count()}, memory_limit={cfg.memory_limit}): "
        f"{_timing(sql)}, peak RSS {sql['peak_mb']:,.0f} MiB; signals: {counts}"
    )
    found = {t: {r[KEY[t]] for r in v} for t, v in sql["signals"].items()}
    recovered = sum(t in found["forgetting"] for t in planted.forgetting)
    echo(
        f"planted: forgetting {recovered}/{len(planted.forgetting)} recovered; "
        f"rare {planted.rare!r} {'recovered' if planted.rare in found['rare'] else 'MISSED'}; "
        f"near miss {' > '.join(RARE_NEAR_MISS)!r} {'LEAKED' if ' > '.join(RARE_NEAR_MISS) in found['rare'] else 'rejected'}"
    )
    result = {"rows": written, "sql": sql, "pandas": None, "identical": None}
    if written > pandas_max_rows:
        echo(
            f"pandas reference skipped: {written:,} rows > --pandas-max-rows {pandas_max_rows:,} (it would not fit in memory)"
        )
        return result
    ref = _child("pandas", store_dir, cfg, rounds, scratch / "pandas.json")
    problems = compare(sql["signals"], ref["signals"])
    result.update(pandas=ref, identical=not problems)
    echo(f"pandas reference: {_timing(ref)}, peak RSS {ref['peak_mb']:,.0f} MiB")
    echo(f"SQL is {ref['seconds'] / sql['seconds']:.1f}x faster; results {'identical' if not problems else 'DIFFER'}")
    for p in problems:
        echo(f"  {p}")
    return result


if __name__ == "__main__":  # the child processes of `bench`
    _side, _store, _cfg, _round, _out = sys.argv[1:]
    _measure(_side, _store, SignalsConfig(**json.loads(_cfg)), int(_round), _out)
