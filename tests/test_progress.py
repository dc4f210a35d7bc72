"""What a round shows in Prefect while it works (issue 15): stage progress as log lines and a
progress artifact (training read from the store's train_steps), summaries as sentences."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone


def test_stage_summaries_read_as_sentences():
    from flows.progress import describe, round_summary_markdown

    text = describe(
        "validate",
        {
            "candidates": 8,
            "accepted": 3,
            "pass_rate": 0.375,
            "rejections": {"pass 1 replay": 4, "duplicate": 1},
            "seconds": 2.0,
        },
    )
    assert text.startswith("Accepted 3 of 8 candidates (pass rate 0.375).")
    assert "| pass 1 replay | 4 |" in text and "{" not in text
    text = describe(
        "evaluate",
        {
            "eval_score": 0.25,
            "eval_reward": 0.5,
            "n_eval": 4,
            "per_category": {"multi_turn_base": {"n": 2, "accuracy": 0.5}},
        },
    )
    assert "Held-out score 0.25" in text and "| multi_turn_base | 0.5 |" in text
    md = round_summary_markdown(
        {
            "round": 2,
            "eval_score": 0.3,
            "signals_forgetting": 1,
            "signals_boundary": 2,
            "signals_rare": 0,
            "n_candidates": 5,
            "n_accepted": 2,
            "pass_rate": 0.4,
            "pool_size": 60,
            "t_total": 321.5,
        }
    )
    assert md.startswith("Round 2 scored 0.3 on the held-out set, mined 3 signals")
    head, _, values = md.strip().splitlines()[-3:]
    assert head.split("|")[1].strip() == "held-out score" and values.split("|")[1].strip() == "0.3"


def test_every_signal_type_is_counted_not_only_the_papers_three():
    """A round's signals are every file's (signal_counts: built-in and user types), not only the
    paper's three columns; older rows without signal_counts fall back to those columns."""
    import json

    from types import SimpleNamespace

    from coevolve.ablate import ablation_rows
    from coevolve.round import signal_counts_of
    from flows.progress import describe, round_summary_markdown

    counts = {"forgetting": 0, "boundary": 1, "rare": 0, "uncertainty": 2, "cut_short": 4}
    row = {"round": 1, "signals_forgetting": 0, "signals_boundary": 1, "signals_rare": 0}
    assert signal_counts_of(row) == {"forgetting": 0, "boundary": 1, "rare": 0}
    row["signal_counts"] = json.dumps(counts)
    assert signal_counts_of(row) == counts
    md = round_summary_markdown(row)
    assert "mined 7 signals (0 forgetting, 1 boundary, 0 rare, 2 uncertainty, 4 cut_short)" in md
    assert md.strip().splitlines()[-1].split("|")[2].strip() == "7"
    assert describe("signals", {"signals_boundary": 1, "signal_counts": counts}).startswith("Mined 7 signals (")

    run = SimpleNamespace(
        run_id="signals-s0", seed=0, condition=SimpleNamespace(name="signals"), cfg=SimpleNamespace(store="/tmp/x")
    )
    assert ablation_rows(run, [row])[0]["n_signals"] == 7


def test_training_progress_reaches_logs_and_a_progress_artifact(prefect_harness, tmp_path):
    import anyio
    from prefect import flow, get_client, task
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterType, LogFilter, LogFilterTimestamp
    from prefect.client.schemas.sorting import LogSort

    from coevolve.config import load_config
    from coevolve.events import emit

    started = datetime.now(timezone.utc)
    from coevolve.store import Store
    from flows.progress import StageProgress

    cfg = load_config(None, {"store": str(tmp_path / "store"), "run_name": "watched", "train.steps": 2})
    store = Store(cfg.store)

    class Logged:
        """The stage's run logger, also telling the test which "<step> of 2" lines it logged."""

        def __init__(self, log):
            self.log = log
            self.steps = {1: threading.Event(), 2: threading.Event()}

        def __getattr__(self, name):
            return getattr(self.log, name)

        def info(self, msg, *args, **kwargs):
            self.log.info(msg, *args, **kwargs)
            for step, seen in self.steps.items():
                if (msg % args).startswith(f"round 1 train: {step} of 2"):
                    seen.set()

    @task
    def fake_training() -> None:
        with StageProgress(store, cfg, 1, "train", poll_s=0.2) as progress:
            progress.log = logged = Logged(progress.log)
            emit("start", 1, "train", {})
            for step in (1, 2):  # what a trainer writes after each GRPO step
                store.write(
                    "train_steps",
                    1,
                    f"watched-train-s{step:04d}",
                    [{"run_id": "watched", "step": step, "loss": 0.5 / step, "reward_mean": 0.1 * step}],
                )
                # the poll thread saw this step before the trainer writes the next one
                assert logged.steps[step].wait(30), f"step {step} never reached the logs"
            emit(
                "done",
                1,
                "train",
                {"n_rollouts": 16, "train_reward": 0.15, "train_success": 0.0, "checkpoint": "ckpt", "seconds": 1.6},
            )

    @flow
    def watched() -> None:
        fake_training()

    watched()

    async def read():
        async with get_client() as client:
            arts = await client.read_artifacts(
                artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress"]))
            )
            # the harness is shared by the session: this test's logs, newest first
            recent = LogFilter(timestamp=LogFilterTimestamp(after_=started))
            logs = [log.message for log in await client.read_logs(log_filter=recent, sort=LogSort.TIMESTAMP_DESC)]
            return arts, logs

    deadline = time.time() + 20  # logs reach the API in batches
    while True:
        arts, logs = anyio.run(read)
        if any("Trained on 16 rollouts" in m for m in logs) or time.time() > deadline:
            break
        time.sleep(0.5)
    mine = [a for a in arts if a.description == "watched: round 1 train"]
    assert mine and mine[0].data == 100.0 and mine[0].key == "progress-watched-round-1-train"
    assert any(m.startswith("round 1 train: 1 of 2 (GRPO steps; last: reward 0.1, loss 0.5)") for m in logs), logs
    assert any(m.startswith("round 1 train: 2 of 2") for m in logs), logs
    assert any("Trained on 16 rollouts: mean reward 0.15" in m for m in logs), logs


def test_a_run_logged_to_a_file_prints_a_line_per_stage_event():
    from flows.cli.run import StageStatus

    lines: list[str] = []
    status = StageStatus(log=lines.append, log_every_s=3600)
    status("start", 1, "train", {})
    status("progress", 1, "train", {"done": 1, "total": 4, "note": "step 1"})  # within log_every_s: table only
    status.log_every_s = 0
    status("progress", 1, "train", {"done": 2, "total": 4, "note": "step 2"})
    status("end", 1, "train", {"seconds": 12.5, "steps": 4})
    status("skip", 2, "signals", {"n": 3})

    assert lines == [
        "round 1 train: running",
        "round 1 train: running 2/4 step 2",
        "round 1 train: done 12.5s steps=4",
        "round 2 signals: skipped (done) n=3",
    ]
    assert status.rows[(1, "train")] == ("done 12.5s", "steps=4")


def test_one_artifact_key_for_every_flow():
    from flows.artifacts import artifact_key

    assert artifact_key("coevolve", "tiny", "round", 1) == "coevolve-tiny-round-1"
    assert artifact_key("progress", "My.Run_2", "round", 0, "train") == "progress-my-run-2-round-0-train"
    assert artifact_key("ablation", "/tmp/abl") == "ablation-tmp-abl"
    assert artifact_key("ablation", "s3://bucket/abl/") == "ablation-s3-bucket-abl"
    assert len(artifact_key("x", "y" * 200)) == 100
