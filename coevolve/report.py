"""``coevolve report``: PNG plots and a Markdown report of one or more runs, or of an ablation.

    report = write_report(store_at("/tmp/cv"), out="/tmp/cv-report")            # every run
    report = write_report(store, runs=["signal-guided-s0"], out=...)             # some runs
    report.files        # the PNGs and report.md
    report.figures      # name -> matplotlib Figure (lines and bars hold the plotted series)

What is read: everything goes through DuckDB SQL over the store (``sql/report/*.sql``) and
is aggregated with polars. A plain store holds runs side by side (one line per run); an
ablation store (``coevolve ablate``) lists its runs in ``ablations``, each with its own
sub-store, and plots per condition with the mean over seeds and a min-max seed band.

Plots (each skipped, with a note in the Markdown, when its columns or rows are missing):

- ``score.png``        held-out success and held-out reward per round (zero-shot as a dashed line with its band);
- ``signals.png``      signals mined per round, by type;
- ``validation.png``   validation pass rate per round (accepted / candidates);
- ``pool.png``         pool size per round, and its origin mix;
- ``turns.png``        turn-count distribution of synthesized tasks per round (paper, fig. 7);
- ``stage_times.png``  share of round time per stage; feedback overhead = signals + explore
                       + abstract + validate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from coevolve.store import Store
from coevolve.store_open import store_at

STAGE_COLUMNS = ("t_train", "t_signals", "t_explore", "t_abstract", "t_validate", "t_commit", "t_evaluate")
FEEDBACK_COLUMNS = ("t_signals", "t_explore", "t_abstract", "t_validate")
LABELS = ("run_id", "condition", "seed")


@dataclass
class ReportData:
    """Every frame carries run_id, condition and seed (plain runs: condition = run_id, seed 0)."""

    ablation: bool
    rounds: pl.DataFrame
    signals: pl.DataFrame
    validation: pl.DataFrame
    pool: pl.DataFrame
    turns: pl.DataFrame
    ablations: pl.DataFrame  # the `ablations` rows (empty for a plain store)


@dataclass
class Report:
    out: Path
    files: list[Path] = field(default_factory=list)  # PNGs, then report.md
    figures: dict = field(default_factory=dict)  # name -> Figure
    notes: list[str] = field(default_factory=list)  # plots skipped and why
    markdown: str = ""


# ----------------------------------------------------------------------------- reading
def _frames(store: Store, runs: list[str], labels: dict[str, tuple[str, int]] | None) -> dict[str, pl.DataFrame]:
    from coevolve.sql import connect, query_file

    con = connect(store)
    out = {
        "rounds": query_file(con, "report/rounds.sql", runs=runs),
        "signals": query_file(con, "report/signals.sql", runs=runs),
        "validation": query_file(con, "report/validation.sql", runs=runs),
        "pool": query_file(con, "report/pool_origins.sql", runs=runs),
        "turns": query_file(con, "report/task_turns.sql"),
    }
    for name, df in out.items():
        if name == "turns":  # store-wide: one run per sub-store in an ablation
            rid = runs[0] if len(runs) == 1 else "all"
            df = df.with_columns(pl.lit(rid).alias("run_id"))
        mapping = labels or {}
        df = df.with_columns(
            pl.col("run_id")
            .replace_strict({k: v[0] for k, v in mapping.items()}, default=pl.col("run_id"), return_dtype=pl.String)
            .alias("condition"),
            pl.col("run_id")
            .replace_strict({k: v[1] for k, v in mapping.items()}, default=0, return_dtype=pl.Int64)
            .alias("seed"),
        )
        out[name] = df
    return out


def collect(store: Store, runs: list[str] | None = None, s3: Any = None) -> ReportData:
    """Read the report's frames from ``store`` (and, for an ablation, from its runs' sub-stores,
    opened with ``s3``: the ablation config's ``S3Config``; None: see ``_sub_store``)."""
    from coevolve.sql import query

    runs = list(runs or [])
    ablations = query(store, "select * from ablations")
    if runs:
        ablations = ablations.filter(pl.col("run_id").is_in(runs))
    parts: list[dict[str, pl.DataFrame]] = []
    if ablations.height:
        subs = ablations.select("run_id", "condition", "seed", "store").unique().sort("run_id")
        for row in subs.filter(pl.col("store").is_not_null()).iter_rows(named=True):
            sub = _sub_store(store, row["store"], s3)
            parts.append(_frames(sub, [row["run_id"]], {row["run_id"]: (row["condition"], row["seed"])}))
    else:
        parts.append(_frames(store, runs, None))
    if not parts:  # an ablation whose rows name no sub-store: its own table is all there is
        parts.append(_frames(store, ["-"], None))
    merged = {k: pl.concat([p[k] for p in parts], how="diagonal_relaxed") for k in parts[0]}
    return ReportData(ablation=bool(ablations.height), ablations=ablations, **merged)


def _sub_store(store: Store, uri: str, s3: Any) -> Store:
    """An ablation run's sub-store: with the S3 settings ``s3``, else with the endpoint and region
    ``store`` was opened with (and the default retries and timeouts)."""
    if s3 is None:
        from coevolve.config import S3Config

        s3 = S3Config(**{k: v for k, v in store.s3_settings.items() if k in ("endpoint_url", "region")})
    return store_at(uri, s3)


# ----------------------------------------------------------------------------- plots
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
                if s["seeds"].max() > 1:
                    ax.fill_between(x, s["lo"].to_list(), s["hi"].to_list(), color=line.get_color(), alpha=0.15)
        ax.set_xticks(rounds)
        ax.set_ylim(0, max(0.05, float(stats["hi"].max()) * 1.15))
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
    fig, (ax,) = _new_figure("Validation pass rate per round (accepted / candidates)", "round", "pass rate")
    for cond in _conditions(stats):
        s = stats.filter(pl.col("condition") == cond)
        ax.plot(s["round"].to_list(), s["mean"].to_list(), marker="o", label=cond)
    ax.set_xticks(sorted(stats["round"].unique().to_list()))
    ax.set_ylim(0, 1.05)
    ax.legend(title="condition" if data.ablation else "run")
    return fig, None


def _bar_groups(df: pl.DataFrame, category: str, value: str) -> tuple[list[str], list[str], dict[str, list[float]]]:
    """Stacked-bar inputs: x labels ("<condition> r<round>" or "r<round>"), categories, heights."""
    multi = df["condition"].n_unique() > 1
    keys = df.select("condition", "round").unique()
    keys = sorted(keys.iter_rows(), key=lambda k: (_conditions(df).index(k[0]), k[1]))
    cats = sorted(df[category].unique().to_list(), key=str)
    heights = {c: [] for c in cats}
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


def feedback_overhead(rounds: pl.DataFrame) -> float:
    """signals + explore + abstract + validate seconds over all stage seconds (0 if none)."""
    cols = [c for c in STAGE_COLUMNS if c in rounds.columns]
    if not cols or not rounds.height:
        return 0.0
    total = sum(float(rounds[c].fill_null(0).sum()) for c in cols)
    feedback = sum(float(rounds[c].fill_null(0).sum()) for c in FEEDBACK_COLUMNS if c in rounds.columns)
    return feedback / total if total else 0.0


PLOTS = {
    "score": plot_score,
    "signals": plot_signals,
    "validation": plot_validation,
    "pool": plot_pool,
    "turns": plot_turns,
    "stage_times": plot_stage_times,
}


# ----------------------------------------------------------------------------- the report
def _md_table(df: pl.DataFrame, digits: int = 3) -> str:
    if not df.height:
        return "_(no rows)_"
    head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns) + "\n"
    lines = []
    for row in df.iter_rows():
        cells = ["-" if v is None else f"{v:.{digits}f}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines)


def write_report(store: Store, runs: list[str] | None = None, out: str | Path | None = None, s3: Any = None) -> Report:
    """Write the PNGs and ``report.md`` into ``out`` (default: ``<store>/report`` for a local
    store, ``./coevolve-report`` for S3); returns what was written. ``s3``: the S3 settings of
    an ablation's sub-stores (``collect``)."""
    out = Path(out) if out else (Path(store.root) / "report" if not store.is_s3 else Path("coevolve-report"))
    out.mkdir(parents=True, exist_ok=True)
    data = collect(store, runs, s3)
    report = Report(out=out)
    for name, fn in PLOTS.items():
        fig, note = fn(data)
        if fig is None:
            report.notes.append(note)
            continue
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        report.figures[name] = fig
        report.files.append(path)
    report.markdown = _markdown(store, data, report)
    md = out / "report.md"
    md.write_text(report.markdown)
    report.files.append(md)
    return report


def _markdown(store: Store, data: ReportData, report: Report, image_prefix: str = "") -> str:
    runs = sorted(data.rounds["run_id"].unique().to_list()) if data.rounds.height else []
    lines = [f"# coevolve report: {store.uri}", ""]
    if data.ablation:
        from coevolve.ablate import summary

        from coevolve.ablate_stats import compare, comparison_rows, verdicts

        lines += ["## Ablation: held-out score per condition and round (over seeds)", "", _md_table(summary(store)), ""]
        comps = compare(data.ablations.to_dicts())
        if comps:
            lines += [
                "## Neighbouring rungs: paired differences over seeds (95% bootstrap CI, sign test)",
                "",
                _md_table(pl.DataFrame(comparison_rows(comps))),
                "",
            ]
        lines += [f"- {line}" for line in verdicts(comps)] + [""]
    lines += [
        f"Runs: {', '.join(runs) or '-'}. Feedback overhead (signals + explore + abstract + validate "
        f"over all stage time): {feedback_overhead(data.rounds):.1%}.",
        "",
    ]
    captions = {
        "score": "Held-out score per round",
        "signals": "Signals mined per round, by type",
        "validation": "Validation pass rate per round",
        "pool": "Pool size and origin mix per round",
        "turns": "Turn-count distribution of synthesized tasks per round",
        "stage_times": "Share of round time per stage",
    }
    for name, fig in report.figures.items():
        lines += [f"## {captions[name]}", "", f"![{captions[name]}]({image_prefix}{name}.png)", ""]
    if data.rounds.height:
        keep = [
            c
            for c in (
                "run_id",
                "round",
                "pool_size",
                "signals_forgetting",
                "signals_boundary",
                "signals_rare",
                "n_candidates",
                "n_accepted",
                "pass_rate",
                "eval_score",
                "eval_reward",
                "synth_score",
                "synth_reward",
                "t_total",
            )
            if c in data.rounds.columns
        ]
        lines += ["## Rounds", "", _md_table(data.rounds.select(keep).sort("run_id", "round")), ""]
    if report.notes:
        lines += ["## Not plotted", ""] + [f"- {n}" for n in report.notes] + [""]
    return "\n".join(lines)


def _artifact_dir(store: Store) -> Path:
    """Where artifacts' pictures go: ``<store>/report`` locally; for S3 a folder under the
    system temp dir named after the store (never the working directory)."""
    if not store.is_s3:
        return Path(store.root) / "report"
    import re
    import tempfile

    return Path(tempfile.gettempdir()) / "coevolve-report" / re.sub(r"[^A-Za-z0-9_.-]+", "-", store.root)


def ablation_markdown(
    store: Store, df: pl.DataFrame | None = None, out: str | Path | None = None, s3: Any = None
) -> str:
    """Markdown of an ablation for a Prefect artifact: the summary table, then the report
    (its pictures written to ``out``, linked by path; ``s3``: the sub-stores' S3 settings)."""
    from coevolve.ablate import summary

    report = write_report(store, out=out or _artifact_dir(store), s3=s3)
    table = _md_table(df if df is not None else summary(store))
    pictures = "\n".join(f"![{p.stem}]({p})" for p in report.files if p.suffix == ".png")
    return f"# Ablation {store.uri}\n\n{table}\n\nReport: {report.out / 'report.md'}\n\n{pictures}\n"


def round_markdown(store: Store, run_id: str, round: int, out: str | Path | None = None) -> str:
    """Markdown of one finished round for a Prefect artifact: its ``rounds`` row and the run's
    report pictures so far (written to ``out``, default ``<store>/report/<run_id>``)."""
    out = Path(out) if out else _artifact_dir(store) / run_id
    report = write_report(store, runs=[run_id], out=out)
    data = collect(store, [run_id])
    row = data.rounds.filter(pl.col("round") == round).drop("condition", "seed")
    table = (
        _md_table(row.transpose(include_header=True, header_name="metric", column_names=["value"]))
        if row.height
        else "_(no rounds row yet)_"
    )
    pictures = "\n".join(f"![{p.stem}]({p})" for p in report.files if p.suffix == ".png")
    return f"# {run_id}: round {round}\n\n{table}\n\nReport: {out / 'report.md'}\n\n{pictures}\n"
