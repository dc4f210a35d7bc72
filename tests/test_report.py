"""`coevolve report`: PNGs and Markdown from hand-built stores (a plain run and an ablation),
with the plotted series read back from the figures; polars helpers of coevolve.sql."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import polars as pl
import pytest
from typer.testing import CliRunner

from coevolve.cli import app
from coevolve.report import write_report
from coevolve.report_data import ReportData, collect, feedback_overhead
from coevolve.report_plots import PLOTS
from coevolve.sql import query, scan
from coevolve.store import Store

runner = CliRunner()
PNGS = {"score", "signals", "validation", "pool", "turns", "stage_times"}


def _task(tid: str, origin: str, n_turns: int, round_no: int) -> dict:
    return {
        "task_id": tid,
        "env": "bfcl-v3",
        "split": "train",
        "origin": origin,
        "turns": ["do it"] * n_turns,
        "created_round": round_no,
        "content_hash": tid,
    }


def fake_run(
    store: Store,
    run_id: str,
    scores: list[float],
    signals: list[dict[str, int]],
    passed: list[tuple[int, int]],
    turns: list[list[int]],
) -> None:
    """A run with ``len(scores)`` rounds written as the stages would: pool versions (2 seeds,
    then the accepted tasks with the given turn counts), signals, candidates, rounds rows."""
    store.commit_pool(
        run_id=run_id,
        round_no=0,
        new_tasks=[_task(f"{run_id}-seed{i}", "seed", 2, 0) for i in range(2)],
        expected_parent=None,
    )
    for i, score in enumerate(scores):
        r = i + 1
        store.write(
            "signals",
            r,
            run_id,
            [
                {"run_id": run_id, "signal_id": f"{t}{k}", "signal_type": t, "score": 1.0}
                for t, n in signals[i].items()
                for k in range(n)
            ],
        )
        accepted, total = passed[i]
        store.write(
            "candidates",
            r,
            run_id,
            [
                {
                    "run_id": run_id,
                    "candidate_id": f"c{k}",
                    "verdict": "accepted" if k < accepted else "rejected",
                    "reason": "x",
                }
                for k in range(total)
            ],
        )
        latest = store.latest_pool()
        store.commit_pool(
            run_id=run_id,
            round_no=r,
            expected_parent=latest.version,
            new_tasks=[_task(f"{run_id}-r{r}-{k}", "explored", n, r) for k, n in enumerate(turns[i])],
        )
        store.write(
            "rounds",
            r,
            run_id,
            [
                {
                    "run_id": run_id,
                    "eval_score": score,
                    "eval_reward": score / 2 + 0.1,
                    "pool_size": len(store.latest_pool().task_ids),
                    **{f"signals_{t}": n for t, n in signals[i].items()},
                    "t_train": 8.0,
                    "t_signals": 0.5,
                    "t_explore": 0.5,
                    "t_abstract": 0.5,
                    "t_validate": 0.5,
                    "t_commit": 0.0,
                    "t_evaluate": 0.0,
                    "t_total": 10.0,
                }
            ],
        )


@pytest.fixture
def run_store(tmp_path) -> Store:
    store = Store(str(tmp_path / "store"))
    fake_run(
        store,
        "r1",
        scores=[0.25, 0.5],
        signals=[{"boundary": 3, "rare": 1}, {"boundary": 1, "rare": 2}],
        passed=[(3, 4), (1, 4)],
        turns=[[1, 2, 2], [3]],
    )
    return store


def _lines(fig, panel: int | None = None) -> dict[str, tuple[list, list]]:
    """label -> (x, y) of the figure's lines, of one panel (axes index) or of all."""
    axes = fig.axes if panel is None else [fig.axes[panel]]
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ax in axes for ln in ax.lines}


def test_report_of_one_run_writes_every_plot_with_its_series(run_store, tmp_path):
    rep = write_report(run_store, out=tmp_path / "rep")
    names = {p.stem for p in rep.files if p.suffix == ".png"}
    assert names == PNGS and not rep.notes
    for p in rep.files:
        if p.suffix == ".png":
            img = mpimg.imread(p)  # decodes, or raises
            assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    md = (tmp_path / "rep" / "report.md").read_text()
    for name in PNGS:
        assert f"]({name}.png)" in md
    assert "| r1 | 2 |" in md  # the rounds table

    assert _lines(rep.figures["score"], 0)["r1"] == ([1, 2], [0.25, 0.5])
    assert _lines(rep.figures["score"], 1)["r1"] == ([1, 2], [pytest.approx(0.225), pytest.approx(0.35)])
    assert [ax.get_ylabel() for ax in rep.figures["score"].axes] == [
        "held-out success rate",
        "held-out reward (partial credit)",
    ]
    sig = _lines(rep.figures["signals"])
    assert sig["boundary"] == ([1, 2], [3, 1]) and sig["rare"] == ([1, 2], [1, 2])
    assert _lines(rep.figures["validation"])["r1"][1] == [0.75, 0.25]
    assert _lines(rep.figures["pool"])["r1"] == ([0, 1, 2], [2, 5, 6])  # 2 seeds, +3, +1
    mix = rep.figures["pool"].axes[1]
    heights = {c.get_label(): [b.get_height() for b in c] for c in mix.containers}
    assert heights == {"explored": [0, 3, 4], "seed": [2, 2, 2]}
    turns = {c.get_label(): [round(b.get_height(), 3) for b in c] for c in rep.figures["turns"].axes[0].containers}
    assert turns == {"1 turn": [0.333, 0.0], "2 turns": [0.667, 0.0], "3 turns": [0.0, 1.0]}
    shares = {c.get_label(): [b.get_height() for b in c] for c in rep.figures["stage_times"].axes[0].containers}
    assert shares["train"] == pytest.approx([0.8, 0.8]) and shares["signals"] == pytest.approx([0.05, 0.05])
    assert "feedback overhead 20%" in rep.figures["stage_times"]._suptitle.get_text()


def test_ablation_report_plots_means_and_seed_bands(tmp_path):
    root = Store(str(tmp_path / "abl"))
    rows = []
    for cond, seed, scores in (
        ("static", 0, [0.2, 0.4]),
        ("static", 1, [0.4, 0.6]),
        ("signal-guided", 0, [0.3, 0.7]),
        ("signal-guided", 1, [0.5, 0.9]),
    ):
        rid = f"{cond}-s{seed}"
        sub = Store(f"{root.uri}/conditions/{rid}")
        fake_run(sub, rid, scores, [{"rare": 1}] * 2, [(1, 2)] * 2, [[2], [3]])
        rows += [
            {
                "round": r + 1,
                "run_id": rid,
                "condition": cond,
                "seed": seed,
                "store": sub.uri,
                "eval_score": s,
                "eval_reward": s + 0.05,
            }
            for r, s in enumerate(scores)
        ]
    for seed, score in ((0, 0.1), (1, 0.3)):
        rows.append(
            {
                "round": 0,
                "run_id": f"zero-shot-s{seed}",
                "condition": "zero-shot",
                "seed": seed,
                "eval_score": score,
                "eval_reward": score + 0.05,
            }
        )
    for row in rows:
        root.write("ablations", row["round"], row["run_id"], [row])

    rep = write_report(root, out=tmp_path / "rep")
    assert {p.stem for p in rep.files if p.suffix == ".png"} == PNGS
    score = rep.figures["score"].axes[0]
    lines = _lines(rep.figures["score"], 0)
    assert lines["static"][1] == pytest.approx([0.3, 0.5])
    assert lines["signal-guided"][1] == pytest.approx([0.4, 0.8])
    assert lines["zero-shot"] == ([0, 2], [pytest.approx(0.2), pytest.approx(0.2)])  # a level: round 0 only
    assert len(score.collections) == 2  # the seed bands of the two trained conditions
    reward = _lines(rep.figures["score"], 1)
    assert reward["signal-guided"][1] == pytest.approx([0.45, 0.85]) and reward["zero-shot"][1] == pytest.approx(
        [0.25] * 2
    )
    assert [t.get_text() for t in score.get_legend().get_texts()] == ["zero-shot", "static", "signal-guided"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "| zero-shot | 0 | 2 | 0.200 |" in md and "| signal-guided | 2 | 2 | 0.800 |" in md
    # one run of the ablation only
    data = collect(root, runs=["static-s1"])
    assert data.ablations["run_id"].unique().to_list() == ["static-s1"]
    assert data.rounds["eval_score"].to_list() == [0.4, 0.6]


def test_missing_columns_and_rows_skip_plots_with_a_note(tmp_path):
    empty = pl.DataFrame({"run_id": [], "condition": [], "seed": [], "round": []})
    data = ReportData(
        ablation=False, rounds=empty, signals=empty, validation=empty, pool=empty, turns=empty, ablations=empty
    )
    for name, fn in PLOTS.items():
        fig, note = fn(data)
        assert fig is None and note.startswith(name.split("_")[0]), (name, note)
    assert feedback_overhead(empty) == 0.0
    rep = write_report(Store(str(tmp_path / "nothing")), out=tmp_path / "rep")
    assert [p.name for p in rep.files] == ["report.md"] and len(rep.notes) == len(PLOTS)
    assert "## Not plotted" in (tmp_path / "rep" / "report.md").read_text()


def test_round_artifact_markdown(run_store, tmp_path):
    from coevolve.report import round_markdown

    md = round_markdown(run_store, "r1", 2, out=tmp_path / "round")
    assert md.startswith("# r1: round 2") and "| eval_score | 0.5 |" in md
    assert f"]({tmp_path / 'round' / 'score.png'})" in md and (tmp_path / "round" / "score.png").is_file()


def test_cli_report_and_polars_helpers(run_store, tmp_path):
    out = runner.invoke(app, ["report", "--store", run_store.uri, "--run", "r1", "--out", str(tmp_path / "o")])
    assert out.exit_code == 0, out.output
    # Rich wraps long paths at the console width (pytest-xdist's temp paths are long): compare unwrapped
    assert (tmp_path / "o" / "score.png").is_file() and "report.md" in "".join(out.output.split())
    bad = runner.invoke(app, ["report", "--store", str(tmp_path / "absent")])
    assert bad.exit_code != 0 and "no store" in bad.output
    df = query(run_store, "select round, eval_score from rounds where eval_score > $x order by round", x=0.3)
    assert df.to_dicts() == [{"round": 2, "eval_score": 0.5}]
    lazy = scan(run_store, "rounds").filter(pl.col("round") == 1).select("eval_score").collect()
    assert lazy["eval_score"].to_list() == [0.25]
    assert scan(run_store, "explorations").collect().height == 0
    with pytest.raises(ValueError, match="unknown table"):
        scan(run_store, "nope")
    assert Path(run_store.root, "report").exists() is False  # --out was honoured


def test_report_and_scan_over_s3(s3_endpoint, s3_bucket, tmp_path):
    store = Store(f"s3://{s3_bucket}/cv", endpoint_url=s3_endpoint)
    fake_run(store, "s3run", scores=[0.5], signals=[{"rare": 2}], passed=[(1, 1)], turns=[[2]])
    rep = write_report(store, out=tmp_path / "rep")
    assert {p.stem for p in rep.files if p.suffix == ".png"} == PNGS
    assert _lines(rep.figures["score"], 0)["s3run"][1] == [0.5]
    assert scan(store, "signals").select(pl.len()).collect().item() == 2
    from coevolve.report import round_markdown

    md = round_markdown(store, "s3run", 1)  # an artifact's pictures of an S3 store: the temp dir, not the cwd
    assert "| eval_score | 0.5 |" in md and "coevolve-report" in md and not Path("coevolve-report").exists()
