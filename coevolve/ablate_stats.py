"""Is the ladder's order real? Paired differences of neighbouring rungs, over seeds.

The ablation's claim is an ordering: zero-shot < static < random < signal-guided. Every
condition runs the same seeds (``coevolve.ablate.plan``), so for each pair of neighbouring
rungs and each round the difference *per seed* (upper minus lower) is what varies with the
condition alone; its mean gets a percentile-bootstrap confidence interval and an exact sign
test. A pair is *separated* when the interval excludes 0 (with at least ``MIN_SEEDS`` seeds),
and *not separated* otherwise: a difference smaller than the seeds' spread says nothing.

    comps = compare(rows)              # rows: the ``ablations`` table as dicts
    for line in verdicts(comps): print(line)

Zero-shot is evaluated once (round 0): each trained rung's round r is compared with it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

RUNGS = ("zero-shot", "static", "random", "signal-guided")
METRICS = {
    "eval_score": "held-out success",
    "eval_reward": "held-out reward",
    "synth_score": "synthesized-split success",
    "synth_reward": "synthesized-split reward",
}
MIN_SEEDS = 3  # fewer paired seeds than this give no verdict


@dataclass(frozen=True)
class Comparison:
    lower: str
    upper: str
    round: int
    metric: str
    seeds: tuple[int, ...]
    diffs: tuple[float, ...]  # upper - lower, one per seed (same order as ``seeds``)
    lo: float  # bootstrap confidence interval of the mean difference
    hi: float
    sign_p: float  # two-sided exact sign test (ties dropped)

    @property
    def mean(self) -> float:
        return sum(self.diffs) / len(self.diffs)

    @property
    def wins(self) -> int:
        return sum(d > 0 for d in self.diffs)

    @property
    def losses(self) -> int:
        return sum(d < 0 for d in self.diffs)

    @property
    def verdict(self) -> str:
        """'above' (upper beats lower beyond noise), 'below', 'not separated' or 'too few seeds'."""
        if len(self.diffs) < MIN_SEEDS:
            return "too few seeds"
        if self.lo > 0:
            return "above"
        if self.hi < 0:
            return "below"
        return "not separated"


def bootstrap_ci(
    diffs: list[float], level: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of ``diffs`` (resampled with replacement)."""
    if not diffs:
        raise ValueError("bootstrap_ci: no differences")
    if not 0 < level < 1:
        raise ValueError(f"bootstrap_ci: level must be in (0, 1), not {level}")
    rng = random.Random(seed)
    n = len(diffs)
    means = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    return means[int(math.floor(tail * (resamples - 1)))], means[int(math.ceil((1 - tail) * (resamples - 1)))]


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact binomial test of wins vs losses at p = 1/2 (1.0 when there are none)."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def compare(
    rows: list[dict[str, Any]], metrics: tuple[str, ...] = tuple(METRICS), level: float = 0.95, resamples: int = 10_000
) -> list[Comparison]:
    """Every neighbouring pair of rungs x trained round x metric that has paired seeds.

    ``rows`` are ``ablations`` rows (condition, seed, round and the metric columns); a seed
    counts for a pair when both rungs have a non-null value for it."""
    value: dict[tuple[str, int, int, str], float] = {}
    for r in rows:
        for m in metrics:
            if r.get(m) is not None:
                value[(r["condition"], int(r["round"]), int(r["seed"]), m)] = float(r[m])
    trained_rounds = sorted({rnd for (c, rnd, _, _) in value if c != "zero-shot" and rnd > 0})
    seeds = sorted({s for (_, _, s, _) in value})
    out = []
    for lower, upper in zip(RUNGS, RUNGS[1:]):
        for rnd in trained_rounds:
            lower_round = 0 if lower == "zero-shot" else rnd
            for m in metrics:
                paired = [
                    (s, value[(upper, rnd, s, m)] - value[(lower, lower_round, s, m)])
                    for s in seeds
                    if (upper, rnd, s, m) in value and (lower, lower_round, s, m) in value
                ]
                if not paired:
                    continue
                diffs = [d for _, d in paired]
                lo, hi = bootstrap_ci(diffs, level, resamples, seed=rnd)
                wins, losses = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
                out.append(
                    Comparison(
                        lower, upper, rnd, m, tuple(s for s, _ in paired), tuple(diffs), lo, hi, sign_test(wins, losses)
                    )
                )
    return out


def comparison_rows(comps: list[Comparison]) -> list[dict[str, Any]]:
    """One flat dict per comparison (for a table or a DataFrame)."""
    return [
        {
            "pair": f"{c.upper} vs {c.lower}",
            "round": c.round,
            "metric": c.metric,
            "seeds": len(c.diffs),
            "mean_diff": c.mean,
            "ci_lo": c.lo,
            "ci_hi": c.hi,
            "up": c.wins,
            "down": c.losses,
            "sign_p": c.sign_p,
            "verdict": c.verdict,
        }
        for c in comps
    ]


def verdicts(comps: list[Comparison], level: float = 0.95) -> list[str]:
    """Sentences for the last trained round: one per neighbouring pair and metric, then one
    saying whether the whole order holds beyond noise on each metric."""
    if not comps:
        return ["No paired seeds to compare: run every condition with the same seeds (coevolve ablate)."]
    last = max(c.round for c in comps)
    final = [c for c in comps if c.round == last]
    pct = f"{level:.0%}"
    lines = []
    for c in final:
        what = {
            "above": f"{c.upper} beats {c.lower} beyond noise",
            "below": f"{c.upper} is below {c.lower} beyond noise",
            "not separated": f"{c.upper} and {c.lower} are not separated",
            "too few seeds": f"{c.upper} vs {c.lower}: too few seeds for a verdict (need {MIN_SEEDS})",
        }[c.verdict]
        lines.append(
            f"round {c.round}, {METRICS.get(c.metric, c.metric)}: {what} "
            f"(mean difference {c.mean:+.3f}, {pct} CI [{c.lo:+.3f}, {c.hi:+.3f}], "
            f"{c.wins} up / {c.losses} down of {len(c.diffs)} seeds, sign test p={c.sign_p:.2f})"
        )
    for m in dict.fromkeys(c.metric for c in final):
        pairs = [c for c in final if c.metric == m]
        holds = len(pairs) == len(RUNGS) - 1 and all(c.verdict == "above" for c in pairs)
        lines.append(
            f"round {last}, {METRICS.get(m, m)}: the order {' < '.join(RUNGS)} "
            + ("holds beyond noise." if holds else "does not hold beyond noise.")
        )
    return lines
