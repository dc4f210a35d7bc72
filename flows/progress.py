"""What a round shows in the Prefect UI while it works: stage logs, progress artifacts, summaries.

    with StageProgress(cfg, round, stage):    # inside a Prefect task
        run_stage(...)

``StageProgress`` listens to the stage events (``coevolve.events``) for one stage and turns them into
readable log lines and a progress artifact (0-100 %). Training reports no events of its own,
so while the ``train`` stage runs a thread reads the round's ``train_steps`` rows from the
store every few seconds (any trainer that logs its steps there is covered) and reports
"step k of N". ``describe`` writes a stage summary as a sentence (plus a small table where
one helps) instead of a Python dict; ``round_summary_markdown`` is the first-look table a
round publishes when it ends.
"""

from __future__ import annotations

import contextvars
import threading
from typing import Any, Callable

import pyarrow.dataset as ds
from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact

from coevolve.config import RunConfig
from coevolve.events import add_listener
from coevolve.round import signal_counts_of
from coevolve.store import Store
from flows.artifacts import artifact_key

TRAIN_POLL_S = 5.0  # how often the train stage's progress reads the store


class StageProgress:
    """Logs and a progress artifact for one running stage (a context manager)."""

    def __init__(self, store: Store, cfg: RunConfig, round_no: int, stage: str, poll_s: float = TRAIN_POLL_S):
        self.store, self.cfg, self.round, self.stage, self.poll_s = store, cfg, round_no, stage, poll_s
        self.log = get_run_logger()
        self.artifact_id: Any = None
        self.last_done = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._remove: Callable[[], None] | None = None

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> "StageProgress":
        self._remove = add_listener(self._on_event)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._remove:
            self._remove()

    # ------------------------------------------------------------------ events
    def _on_event(self, event: str, round_no: int, stage: str, info: dict) -> None:
        if (round_no, stage) != (self.round, self.stage):
            return
        if event == "skip":
            self.log.info(
                "round %d %s: already done, skipped (%s)", round_no, stage, describe(stage, info).splitlines()[0]
            )
        elif event == "start":
            self.log.info("round %d %s: started", round_no, stage)
            self.artifact_id = create_progress_artifact(
                progress=0.0,
                key=artifact_key("progress", self.cfg.run_name, "round", round_no, stage),
                description=f"{self.cfg.run_name}: round {round_no} {stage}",
            )
            if stage == "train":
                self._watch_training()
        elif event == "progress":
            self._progress(info["done"], info["total"], info.get("note", ""))
        elif event == "done":
            self._stop.set()
            if self.artifact_id is not None:
                update_progress_artifact(self.artifact_id, progress=100.0)
            self.log.info(
                "round %d %s: done in %.1f s. %s", round_no, stage, info.get("seconds", 0.0), describe(stage, info)
            )

    def _progress(self, done: int, total: int, note: str) -> None:
        if done == self.last_done or total <= 0:
            return
        self.last_done = done
        pct = 100.0 * min(done, total) / total
        self.log.info("round %d %s: %d of %d%s", self.round, self.stage, done, total, f" ({note})" if note else "")
        if self.artifact_id is not None:
            update_progress_artifact(self.artifact_id, progress=pct)

    # ------------------------------------------------------------------ training
    def _watch_training(self) -> None:
        """Poll ``train_steps`` in a thread (with this task's Prefect context) until done."""
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(
            target=ctx.run, args=(self._poll_train,), daemon=True, name=f"train-progress-{self.round}"
        )
        self._thread.start()

    def _poll_train(self) -> None:
        total = self.cfg.train.steps
        while not self._stop.wait(self.poll_s):
            try:
                rows = self.store.read(
                    "train_steps",
                    filter=(ds.field("run_id") == self.cfg.run_name) & (ds.field("round") == self.round),
                    columns=["step", "loss", "reward_mean"],
                ).to_pylist()
            except Exception as exc:  # progress is a view: never fail the stage over it
                self.log.debug("train progress: %s", exc)
                continue
            if not rows:
                continue
            last = max(rows, key=lambda r: r["step"])
            note = f"reward {_num(last.get('reward_mean'))}, loss {_num(last.get('loss'))}"
            self._progress(int(last["step"]), total, f"GRPO steps; last: {note}")


def _by_type(counts: dict[str, int]) -> str:
    """``{"forgetting": 1, "rare": 0}`` as "1 forgetting, 0 rare" (every type, in the stage's order)."""
    return ", ".join(f"{n} {t}" for t, n in counts.items()) or "no signal files"


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)


# ----------------------------------------------------------------------------- sentences
def _table(rows: list[tuple[str, Any]], head: tuple[str, str]) -> str:
    lines = [f"| {head[0]} | {head[1]} |", "|---|---:|"]
    lines += [f"| {k} | {_num(v)} |" for k, v in rows]
    return "\n".join(lines)


def describe(stage: str, s: dict) -> str:
    """A stage summary (its marker) as a sentence, with a small Markdown table where useful."""
    g = s.get
    if stage == "train":
        return (
            f"Trained on {g('n_rollouts')} rollouts: mean reward {_num(g('train_reward'))}, "
            f"success rate {_num(g('train_success'))}; checkpoint {g('checkpoint')}."
        )
    if stage == "signals":
        counts = signal_counts_of(s)
        return f"Mined {sum(counts.values())} signals ({_by_type(counts)})."
    if stage == "explore":
        return f"Explored {g('n_explorations')} environment steps."
    if stage == "abstract":
        return f"Abstracted {g('n_candidates')} candidate tasks."
    if stage == "validate":
        text = f"Accepted {g('accepted')} of {g('candidates')} candidates (pass rate {_num(g('pass_rate'))})."
        rejections = g("rejections") or {}
        if rejections:
            text += "\n\n" + _table(list(rejections.items()), ("rejected because", "candidates"))
        return text
    if stage == "commit":
        return f"Committed pool v{g('pool_version')}: {g('added')} new tasks, {g('pool_size')} training tasks in all."
    if stage == "evaluate":
        text = (
            f"Held-out score {_num(g('eval_score'))} (mean reward {_num(g('eval_reward'))}) "
            f"over {g('n_eval')} episodes."
        )
        if g("n_synth"):
            text += (
                f" Held-out synthesized split: {_num(g('synth_score'))} "
                f"(mean reward {_num(g('synth_reward'))}) over {g('n_synth')} tasks."
            )
        per = g("per_category") or {}
        if per:
            text += "\n\n" + _table(
                [(k, v.get("accuracy") if isinstance(v, dict) else v) for k, v in per.items()], ("category", "accuracy")
            )
        return text
    return "; ".join(f"{k} {_num(v)}" for k, v in s.items() if not isinstance(v, (dict, list)))


# ----------------------------------------------------------------------------- the round
FIRST_LOOK = [
    ("held-out score", "eval_score"),
    ("signals", None),
    ("candidates", "n_candidates"),
    ("accepted", "n_accepted"),
    ("pass rate", "pass_rate"),
    ("pool size", "pool_size"),
    ("seconds", "t_total"),
]


def round_summary_markdown(row: dict) -> str:
    """The first-look table of a finished round's ``rounds`` row, and a sentence."""
    counts = signal_counts_of(row)
    signals = sum(counts.values())
    cells = [_num(signals) if key is None else _num(row.get(key)) for _, key in FIRST_LOOK]
    table = (
        "| "
        + " | ".join(h for h, _ in FIRST_LOOK)
        + " |\n"
        + "|---:" * len(FIRST_LOOK)
        + "|\n"
        + "| "
        + " | ".join(cells)
        + " |"
    )
    r = row.get("round")
    if r == 0:
        sentence = (
            f"Round 0 synthesized the seed pool: {row.get('n_accepted')} of {row.get('n_candidates')} "
            f"candidates accepted, pool size {row.get('pool_size')}."
        )
    else:
        sentence = (
            f"Round {r} scored {_num(row.get('eval_score'))} on the held-out set, mined {signals} signals "
            f"({_by_type(counts)}), accepted {row.get('n_accepted')} of "
            f"{row.get('n_candidates')} candidates; the pool has {row.get('pool_size')} tasks."
        )
    return f"{sentence}\n\n{table}\n"
