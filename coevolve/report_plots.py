"""The report's plots: one function per PNG, each a bare matplotlib ``Figure`` (no pyplot, so
safe in Prefect's worker threads) or ``(None, note)`` when its columns or rows are missing.

    fig, note = PLOTS["score"](collect(store))     # coevolve.report_data.collect

Ablation stores plot per condition: the mean over seeds and a min-max seed band.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from coevolve.report_data import LABELS, STAGE_COLUMNS, ReportData, feedback_overhead


def _missing(df: pl.DataFrame, columns: tuple[str, ...] | list[str]) -> list[str]:
    return [c for c in columns if c not in df.columns]


def _mean_band(df: pl.DataFrame, value: str, by: list[str]) -> pl.DataFrame:
    """mean, min and max of ``value`` over seeds, per ``by`` (+ round), sorted by round."""
    return (
        df.filter(pl.col(value).is_not_null())
        .group_by([*by, "round"])
        .agg(
            pl.col(value).mean().alias("mean"),
            pl.col(value).min().alias("lo"),
            pl.col(value).max().alias("hi"),
            pl.col("seed").n_unique().alias("seeds"),
        )
        .sort([*by, "round"])
    )


def _conditions(df: pl.DataFrame) -> list[str]:
    from coevolve.ablate import CONDITION_ORDER

    return sorted(df["condition"].unique().to_list(), key=lambda c: (CONDITION_ORDER.get(c, 99), c))


def _new_figure(title: str, xlabel: str, ylabel: str, ncols: int = 1, width: float = 7.0):
    # a bare Figure (no pyplot): no global state, safe in Prefect's worker threads, no display needed
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, 4.2))
    axes = fig.subplots(1, ncols, squeeze=False)
    fig.suptitle(title)
    for ax in axes[0]:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    return fig, list(axes[0])


SCORE_PANELS = (
    ("eval_score", "held-out success rate"),
    ("eval_reward", "held-out reward (partial credit)"),
    ("synth_score", "held-out synthesized split: success"),
    ("synth_reward", "held-out synthesized split: reward"),
)


def plot_score(data: ReportData):
    """Held-out success per round and, where evaluation recorded it, held-out reward (the training
    reward's partial credit on the same episodes): at CPU scale success is often 0 in every
    condition while the reward still moves."""
    df = data.ablations if data.ablation else data.rounds
    if miss := _missing(df, ("eval_score", "round")):
        return None, f"score: no column {', '.join(miss)}"
    panels = [
        (value, label, stats)
        for value, label in SCORE_PANELS
        if value in df.columns and (stats := _mean_band(df, value, ["condition"])).height
    ]
    if not panels or panels[0][0] != "eval_score":
        return None, "score: no evaluated round yet"
    fig, axes = _new_figure(
        "Held-out score per round" + (" (mean over seeds, band = min..max)" if data.ablation else ""),
        "round",
        "",
        ncols=len(panels),
    )
    rounds = sorted(df["round"].unique().to_list())
    for ax, (_, label, stats) in zip(axes, panels, strict=True):
        ax.set_ylabel(label)
        for cond in _conditions(stats):
            s = stats.filter(pl.col("condition") == cond)
            x, y = s["round"].to_list(), s["mean"].to_list()
            if x == [0] and len(rounds) > 1:  # evaluated once (zero-shot): a level across the rounds
                line = ax.plot([min(rounds), max(rounds)], [y[0], y[0]], linestyle="--", label=cond)[0]
                ax.axhspan(s["lo"][0], s["hi"][0], color=line.get_color(), alpha=0.12)
            else:
                line = ax.plot(x, y, marker="o", label=cond)[0]
                if max(s["seeds"].to_list(), default=0) > 1:
                    ax.fill_between(x, s["lo"].to_list(), s["hi"].to_list(), color=line.get_color(), alpha=0.15)
        ax.set_xticks(rounds)
        ax.set_ylim(0, max(0.05, max(stats["hi"].to_list(), default=0.0) * 1.15))
        ax.legend(title="condition" if data.ablation else "run")
    return fig, None


def plot_signals(data: ReportData):
    df = data.signals
    if not df.height:
        # fall back to the rounds' counters (signals_<type> columns)
        cols = [c for c in data.rounds.columns if c.startswith("signals_")]
        if not cols or not data.rounds.height:
            return None, "signals: no signals mined in these runs"
        df = data.rounds.unpivot(index=[*LABELS, "round"], on=cols, variable_name="signal_type", value_name="n")
        df = df.with_columns(pl.col("signal_type").str.strip_prefix("signals_"))
    stats = _mean_band(df, "n", ["condition", "signal_type"])
    fig, (ax,) = _new_figure(
        "Signals mined per round, by type" + (" (mean over seeds)" if data.ablation else ""), "round", "signals"
    )
    styles = ["-", "--", ":", "-."]
    for i, cond in enumerate(_conditions(stats)):
        for stype in sorted(stats.filter(pl.col("condition") == cond)["signal_type"].unique().to_list()):
            s = stats.filter((pl.col("condition") == cond) & (pl.col("signal_type") == stype))
            ax.plot(
                s["round"].to_list(),
                s["mean"].to_list(),
                marker="o",
                linestyle=styles[i % len(styles)],
                label=f"{cond}: {stype}" if len(_conditions(stats)) > 1 else stype,
            )
    ax.set_xticks(sorted(stats["round"].unique().to_list()))
    ax.set_ylim(bottom=0)
    if not data.ablation:  # counts of one run: whole-number ticks (an ablation's means may be halves)
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.get_legend_handles_labels()[0]:  # no series yet (no signals): no empty legend
        ax.legend(title="signal type")
    return fig, None


def plot_validation(data: ReportData):
    df = data.validation
    if not df.height or _missing(df, ("pass_rate",)):
        return None, "validation: no candidates were validated in these runs"
    stats = _mean_band(df, "pass_rate", ["condition"])
    fig, (ax,) = _new_figure(
        "Validation pass rate per round (accepted / candidates); dashed: partial share of the accepted",
        "round",
        "share",
    )
    partial = (
        _mean_band(df.filter(pl.col("partial_share").is_not_null()), "partial_share", ["condition"])
        if "partial_share" in df.columns and df["partial_share"].is_not_null().any()
        else None
    )
    for cond in _conditions(stats):
        s = stats.filter(pl.col("condition") == cond)
        (line,) = ax.plot(s["round"].to_list(), s["mean"].to_list(), marker="o", label=cond)
        if partial is not None:  # passed by failure with positive reward (the auditable validator)
            p = partial.filter(pl.col("condition") == cond)
            ax.plot(
                p["round"].to_list(),
                p["mean"].to_list(),
                linestyle="--",
                marker="x",
                color=line.get_color(),
                label=f"{cond} partial",
            )
    ax.set_xticks(sorted(stats["round"].unique().to_list()))
    ax.set_ylim(0, 1.05)
    ax.legend(title="condition" if data.ablation else "run")
    return fig, None


def _bar_groups(df: pl.DataFrame, category: str, value: str) -> tuple[list[str], list[str], dict[str, list[float]]]:
    """Stacked-bar inputs: x labels ("<condition> r<round>" or "r<round>"), categories, heights."""
    multi = df["condition"].n_unique() > 1
    keys = sorted(
        df.select("condition", "round").unique().iter_rows(), key=lambda k: (_conditions(df).index(k[0]), k[1])
    )
    cats = sorted(df[category].unique().to_list(), key=str)
    heights: dict[Any, list[float]] = {c: [] for c in cats}
    for cond, rnd in keys:
        sub = df.filter((pl.col("condition") == cond) & (pl.col("round") == rnd))
        n_seeds = max(sub["seed"].n_unique(), 1)
        for c in cats:
            heights[c].append(float(sub.filter(pl.col(category) == c)[value].sum()) / n_seeds)
    labels = [f"{c} r{r}" if multi else f"r{r}" for c, r in keys]
    return labels, [str(c) for c in cats], {str(k): v for k, v in heights.items()}


def _stacked(ax, labels: list[str], heights: dict[str, list[float]], legend: str) -> None:
    bottom = [0.0] * len(labels)
    for name, h in heights.items():
        ax.bar(labels, h, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, h)]
    ax.legend(title=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    if len(labels) > 4:
        ax.tick_params(axis="x", labelrotation=45)


def plot_pool(data: ReportData):
    df = data.pool
    if not df.height:
        return None, "pool: no pool version committed"
    sizes = df.group_by([*LABELS, "round"]).agg(pl.col("n").sum())
    stats = _mean_band(sizes, "n", ["condition"])
    fig, (ax_size, ax_mix) = _new_figure("Training pool per round", "round", "train tasks", ncols=2, width=6.0)
    ax_size.set_title("pool size")
    for cond in _conditions(stats):
        s = stats.filter(pl.col("condition") == cond)
        ax_size.plot(s["round"].to_list(), s["mean"].to_list(), marker="o", label=cond)
    ax_size.set_xticks(sorted(stats["round"].unique().to_list()))
    ax_size.legend(title="condition" if data.ablation else "run")
    ax_mix.set_title("origin mix")
    labels, _, heights = _bar_groups(df, "origin", "n")
    _stacked(ax_mix, labels, heights, "origin")
    ax_mix.set_xlabel("condition, round" if df["condition"].n_unique() > 1 else "round")
    return fig, None


def plot_turns(data: ReportData):
    df = data.turns
    if not df.height:
        return None, "turns: no synthesized task in the pool"
    totals = df.group_by("condition", "round", "seed").agg(pl.col("n").sum().alias("total"))
    share = df.join(totals, on=["condition", "round", "seed"]).with_columns(
        (pl.col("n") / pl.col("total")).alias("share")
    )
    fig, (ax,) = _new_figure(
        "Turn-count distribution of synthesized tasks per round",
        "round" if df["condition"].n_unique() == 1 else "condition, round",
        "share of tasks",
    )
    labels, _, heights = _bar_groups(share, "n_turns", "share")
    _stacked(ax, labels, {f"{k} turn{'s' if k != '1' else ''}": v for k, v in heights.items()}, "turns")
    ax.set_ylim(0, 1.05)
    return fig, None


def plot_stage_times(data: ReportData):
    df = data.rounds
    cols = [c for c in STAGE_COLUMNS if c in df.columns]
    if not df.height or not cols:
        return None, "stage times: no rounds with stage timings"
    long = df.unpivot(index=[*LABELS, "round"], on=cols, variable_name="stage", value_name="seconds").with_columns(
        pl.col("seconds").fill_null(0.0)
    )
    totals = long.group_by([*LABELS, "round"]).agg(pl.col("seconds").sum().alias("total"))
    long = long.join(totals, on=[*LABELS, "round"]).with_columns(
        pl.when(pl.col("total") > 0).then(pl.col("seconds") / pl.col("total")).otherwise(0.0).alias("share"),
        pl.col("stage").str.strip_prefix("t_"),
    )
    overhead = feedback_overhead(df)
    fig, (ax,) = _new_figure(
        f"Share of round time per stage (feedback overhead {overhead:.0%})",
        "round" if df["condition"].n_unique() == 1 else "condition, round",
        "share of round time",
    )
    labels, _, heights = _bar_groups(long, "stage", "share")
    order = [c.removeprefix("t_") for c in cols]
    _stacked(ax, labels, {k: heights[k] for k in order if k in heights}, "stage")
    ax.set_ylim(0, 1.05)
    return fig, None


PLOTS = {
    "score": plot_score,
    "signals": plot_signals,
    "validation": plot_validation,
    "pool": plot_pool,
    "turns": plot_turns,
    "stage_times": plot_stage_times,
}
