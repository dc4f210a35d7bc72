"""The pandas reference of ``coevolve bench signals``: the built-in signal definitions of
``sql/signals/`` (forgetting, boundary, rare, uncertainty, reward_hacking) again, in vectorized
pandas and pyarrow (groupby / shift / merge, list kernels; no Python loop over rows or groups),
with the columns of the SQL queries and their header defaults (``signals.params`` applied).

    found = pandas_signals("/tmp/store", SignalsConfig(), "bench", 4)   # {"forgetting": df, ...}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from coevolve.config import SignalsConfig


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


def _forgetting(store_dir, cfg: SignalsConfig, run_id: str, round_no: int) -> pd.DataFrame:
    cols = ["round", "phase", "episode_id", "task_id", "epoch", "train_step", "success", "episode_reward"]
    df = _read(store_dir, run_id, cols, cfg.phases, (ds.field("round") <= round_no) & ds.field("task_id").is_valid())
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
    latest = pts[(pts["recency"] == 1) & (pts["round"] == round_no)]
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


def _boundary(store_dir, cfg: SignalsConfig, run_id: str, round_no: int) -> pd.DataFrame:
    cols = ["phase", "episode_id", "task_id", "success", "episode_reward"]
    df = _read(store_dir, run_id, cols, cfg.phases, (ds.field("round") == round_no) & ds.field("task_id").is_valid())
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


def _rare(store_dir, cfg: SignalsConfig, run_id: str, round_no: int) -> pd.DataFrame:
    if cfg.rare_with_arg_keys:
        raise ValueError("the pandas reference implements name patterns only (rare_with_arg_keys=false)")
    cols = ["phase", "episode_id", "task_id", "turn", "step", "action_name", "parse_error", "error"]
    where = (ds.field("round") == round_no) & ds.field("action_name").is_valid()
    if not cfg.include_parse_errors:
        where = where & ds.field("parse_error").is_null()
    df = _read(store_dir, run_id, cols, cfg.phases, where)
    df = df[~df["error"].fillna("").str.startswith("unknown function ")]  # an invented function is no action
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


def _builtin_params(name: str, cfg: SignalsConfig) -> dict[str, Any]:
    """A built-in signal's declared parameters as the stage passes them (header defaults, then
    ``signals.params``)."""
    from coevolve.signals import BUILTIN_DIR, parse_header

    return parse_header(BUILTIN_DIR / f"{name}.sql", builtin=True).params | cfg.params.get(name, {})


def _uncertainty(store_dir, cfg: SignalsConfig, run_id: str, round_no: int) -> pd.DataFrame:
    p = _builtin_params("uncertainty", cfg)
    dataset = ds.dataset(
        Path(store_dir) / "tables" / "rollouts",
        format="parquet",
        partitioning=ds.partitioning(pa.schema([("round", pa.int32())]), flavor="hive"),
    )
    filt = (
        (ds.field("run_id") == run_id)
        & ds.field("phase").isin(cfg.phases)
        & (ds.field("round") == round_no)
        & ds.field("task_id").is_valid()
    )
    cols = ["phase", "episode_id", "task_id", "success", "episode_reward", "action_name", "completion_logprobs"]
    table = dataset.to_table(columns=cols, filter=filt)
    # the log-probs of tool-call messages only, reduced per row with arrow's list kernels
    lists = pc.if_else(
        pc.is_valid(table["action_name"]),
        table["completion_logprobs"],
        pa.scalar(None, table["completion_logprobs"].type),
    )
    lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    n_rows = len(lists)
    flat = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.float64)
    parent = pc.list_parent_indices(lists).to_numpy()
    has = pc.is_valid(lists).to_numpy(zero_copy_only=False)
    n_tok = np.bincount(parent, minlength=n_rows).astype(np.float64)
    sum_lp = np.bincount(parent, weights=flat, minlength=n_rows)
    n_low = np.bincount(parent, weights=(flat < p["low_logprob"]).astype(np.float64), minlength=n_rows)
    df = table.drop_columns(["completion_logprobs", "action_name"])
    df = df.set_column(
        df.schema.get_field_index("success"), "success", pc.cast(df["success"], pa.float64())
    ).to_pandas()
    df["has"] = has.astype(np.int64)
    df["n_tok"] = np.where(has, n_tok, np.nan)
    df["sum_lp"] = np.where(has, sum_lp, np.nan)
    df["n_low"] = np.where(has, n_low, np.nan)
    ep = (
        df.groupby(["phase", "episode_id", "task_id"], sort=False)
        .agg(
            success=("success", "max"),
            reward=("episode_reward", "max"),
            n_messages=("has", "sum"),
            n_tokens=("n_tok", "sum"),
            sum_logprob=("sum_lp", "sum"),
            n_low=("n_low", "sum"),
        )
        .reset_index()
    )
    g = ep.groupby("task_id", sort=False)
    tasks = g.agg(
        n=("success", "size"),
        n_success=("success", "count"),
        rate=("success", "mean"),
        n_reward=("reward", "count"),
        reward_max=("reward", "max"),
        reward_min=("reward", "min"),
        n_messages=("n_messages", "sum"),
        n_tokens=("n_tokens", "sum"),
        sum_logprob=("sum_logprob", "sum"),
        n_low=("n_low", "sum"),
    )
    tasks["reward_var"] = g["reward"].var(ddof=0)
    tasks["failing_episode_id"] = ep[ep["success"].ne(1)].groupby("task_id")["episode_id"].min()
    tasks = tasks.reset_index()
    tasks["mean_logprob"] = (tasks["sum_logprob"] / tasks["n_tokens"]).round(12)
    tasks["low_token_share"] = tasks["n_low"] / tasks["n_tokens"]
    mixed = ((tasks["n_success"] >= p["min_samples"]) & (tasks["rate"] > 0) & (tasks["rate"] < 1)) | (
        (tasks["n_reward"] >= p["min_samples"]) & (tasks["reward_max"] > tasks["reward_min"])
    )
    # the SQL compares the unrounded mean with the threshold and with the round's quantile
    raw_mean = tasks["sum_logprob"] / tasks["n_tokens"]
    with_tokens = raw_mean[tasks["n_tokens"] > 0].to_numpy()
    cutoff = float(np.quantile(with_tokens, p["quantile"])) if len(with_tokens) else np.nan
    tasks["cutoff"] = round(cutoff, 12) if len(with_tokens) else np.nan
    low = (raw_mean <= p["max_mean_logprob"]) | (raw_mean <= cutoff)
    tasks = tasks[(tasks["n_tokens"] > 0) & low & mixed]
    return tasks.assign(score=(-(tasks["sum_logprob"] / tasks["n_tokens"])).round(12))[
        [
            "task_id",
            "score",
            "n",
            "n_success",
            "rate",
            "reward_var",
            "mean_logprob",
            "low_token_share",
            "n_messages",
            "n_tokens",
            "cutoff",
            "failing_episode_id",
        ]
    ]


def _reward_hacking(store_dir, cfg: SignalsConfig, run_id: str, round_no: int) -> pd.DataFrame:
    p = _builtin_params("reward_hacking", cfg)
    cols = ["round", "phase", "episode_id", "task_id", "success", "episode_reward", "reward_progress", "reward_format"]
    df = _read(store_dir, run_id, cols, cfg.phases, (ds.field("round") <= round_no) & ds.field("task_id").is_valid())
    ep = (
        df.groupby(cols[:4], sort=False)
        .agg(
            success=("success", "max"),
            reward=("episode_reward", "max"),
            progress=("reward_progress", "max"),
            format=("reward_format", "max"),
        )
        .reset_index()
    )
    ep["solved"] = ep["success"].eq(1)
    rounds = (
        ep.groupby(["task_id", "round"], sort=False)
        .agg(
            n=("success", "size"),
            rate=("success", "mean"),
            reward=("reward", "mean"),
            progress=("progress", "mean"),
            format=("format", "mean"),
            solved=("solved", "any"),
        )
        .reset_index()
    )
    failing = ep[ep["success"].ne(1)].groupby(["task_id", "round"])["episode_id"].min().rename("failing_episode_id")
    rounds = rounds.merge(failing.reset_index(), on=["task_id", "round"], how="left")
    ever = rounds.groupby("task_id")["solved"].any().rename("ever_solved").reset_index()
    now = rounds[(rounds["round"] == round_no) & (rounds["n"] >= p["min_samples"])]
    earlier = (
        rounds[rounds["round"] < round_no].sort_values(["task_id", "round"]).drop_duplicates("task_id", keep="last")
    )
    before = earlier[["task_id", "round", "rate", "reward"]].rename(
        columns={"round": "before_round", "rate": "before_rate", "reward": "before_reward"}
    )
    j = now.merge(ever, on="task_id").merge(before, on="task_id", how="left")
    j["reward_rise"] = j["reward"] - j["before_reward"]
    is_partial = ~j["ever_solved"] & (j["reward"] >= p["min_reward"] - 1e-9)
    is_rise = (j["reward_rise"] >= p["min_rise"] - 1e-9) & (j["rate"].fillna(0) <= j["before_rate"].fillna(0))
    j["score"] = (
        pd.concat([j["reward"].where(is_partial), j["reward_rise"].where(is_rise)], axis=1).max(axis=1).round(12)
    )
    j["kind"] = np.where(is_partial & is_rise, "partial+rise", np.where(is_partial, "partial", "rise"))
    j["reward_rise"] = j["reward_rise"].round(12)
    j = j[is_partial | is_rise]
    return j[
        [
            "task_id",
            "score",
            "kind",
            "n",
            "rate",
            "reward",
            "progress",
            "format",
            "ever_solved",
            "before_round",
            "before_rate",
            "before_reward",
            "reward_rise",
            "failing_episode_id",
        ]
    ]


def pandas_signals(store_dir: str | Path, cfg: SignalsConfig, run_id: str, round_no: int) -> dict[str, pd.DataFrame]:
    """The reference: every signal of ``run_id`` at ``round``, per type, with the columns of
    the SQL queries, computed with vectorized pandas from the local store at ``store_dir``."""
    return {
        "forgetting": _forgetting(store_dir, cfg, run_id, round_no),
        "boundary": _boundary(store_dir, cfg, run_id, round_no),
        "rare": _rare(store_dir, cfg, run_id, round_no),
        "uncertainty": _uncertainty(store_dir, cfg, run_id, round_no),
        "reward_hacking": _reward_hacking(store_dir, cfg, run_id, round_no),
    }
