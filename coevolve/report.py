"""``coevolve report``: PNG plots and a Markdown report of one or more runs, or of an ablation.

    report = write_report(store_at("/tmp/cv"), out="/tmp/cv-report")            # every run
    report = write_report(store, runs=["signal-guided-s0"], out=...)             # some runs
    report.files        # the PNGs and report.md
    report.figures      # name -> matplotlib Figure (lines and bars hold the plotted series)

What is read (``coevolve.report_data``): DuckDB SQL over the store (``sql/report/*.sql``),
aggregated with polars. A plain store holds runs side by side (one line per run); an
ablation store (``coevolve ablate``) lists its runs in ``ablations``, each with its own
sub-store, and is plotted (``coevolve.report_plots``) per condition with the mean over seeds
and a min-max seed band. This module writes the PNGs and the Markdown.

Plots (each skipped, with a note in the Markdown, when its columns or rows are missing):

- ``score.png``        held-out success and held-out reward per round (zero-shot as a dashed line with its band);
- ``signals.png``      signals mined per round, by type;
- ``validation.png``   validation pass rate per round (accepted / candidates) and the partial share
                        of the accepted (passed by failure with positive reward);
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

from coevolve.report_data import ReportData, collect, feedback_overhead
from coevolve.report_plots import PLOTS
from coevolve.store import Store


@dataclass
class Report:
    out: Path
    files: list[Path] = field(default_factory=list)  # PNGs, then report.md
    figures: dict = field(default_factory=dict)  # name -> Figure
    notes: list[str] = field(default_factory=list)  # plots skipped and why
    markdown: str = ""


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
                "signal_counts",
                "n_candidates",
                "n_accepted",
                "pass_rate",
                "partial_share",
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


def round_markdown(store: Store, run_id: str, round_no: int, out: str | Path | None = None) -> str:
    """Markdown of one finished round for a Prefect artifact: its ``rounds`` row and the run's
    report pictures so far (written to ``out``, default ``<store>/report/<run_id>``)."""
    out = Path(out) if out else _artifact_dir(store) / run_id
    report = write_report(store, runs=[run_id], out=out)
    data = collect(store, [run_id])
    row = data.rounds.filter(pl.col("round") == round_no).drop("condition", "seed")
    table = (
        _md_table(row.transpose(include_header=True, header_name="metric", column_names=["value"]))
        if row.height
        else "_(no rounds row yet)_"
    )
    pictures = "\n".join(f"![{p.stem}]({p})" for p in report.files if p.suffix == ".png")
    return f"# {run_id}: round {round_no}\n\n{table}\n\nReport: {out / 'report.md'}\n\n{pictures}\n"
