"""The ladder's statistics on planted numbers: paired differences per seed, their bootstrap
interval, the sign test, and the verdicts in words."""

from __future__ import annotations

import math

import pytest

from coevolve.ablate_stats import MIN_SEEDS, bootstrap_ci, compare, sign_test, verdicts


def _rows(values: dict[str, list[float]], rounds: int = 1, metric: str = "eval_reward") -> list[dict]:
    """ablations rows: values[condition] = one value per seed (trained rungs get it at every round)."""
    rows = []
    for cond, per_seed in values.items():
        for seed, v in enumerate(per_seed):
            for rnd in [0] if cond == "zero-shot" else range(1, rounds + 1):
                rows.append({"condition": cond, "seed": seed, "round": rnd, metric: v, "eval_score": 0.0})
    return rows


def test_sign_test_exact_values():
    assert sign_test(5, 0) == pytest.approx(2 / 32)  # two-sided: 2 x (1/2)^5
    assert sign_test(4, 1) == pytest.approx(2 * 6 / 32)
    assert sign_test(3, 3) == 1.0 and sign_test(0, 0) == 1.0
    assert sign_test(10, 0) == pytest.approx(2 / 1024)


def test_bootstrap_interval_brackets_the_mean_and_collapses_on_constants():
    lo, hi = bootstrap_ci([0.2] * 6)
    assert lo == hi == pytest.approx(0.2)
    diffs = [0.10, 0.12, 0.08, 0.11, 0.09]
    lo, hi = bootstrap_ci(diffs, resamples=5000)
    assert 0.08 <= lo < sum(diffs) / 5 < hi <= 0.12
    wide_lo, wide_hi = bootstrap_ci([-0.3, 0.4, -0.2, 0.5, 0.0])
    assert wide_lo < 0 < wide_hi
    assert bootstrap_ci(diffs, seed=3) == bootstrap_ci(diffs, seed=3)  # seeded: reproducible
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_compare_pairs_by_seed_and_judges_each_neighbouring_pair():
    rows = _rows(
        {
            "zero-shot": [0.10, 0.11, 0.09, 0.10, 0.12],
            "static": [0.20, 0.22, 0.19, 0.21, 0.20],  # clearly above zero-shot on every seed
            "random": [0.21, 0.18, 0.23, 0.19, 0.22],  # about static: mixed signs
            "signal-guided": [0.15, 0.12, 0.16, 0.14, 0.13],  # clearly below random
        },
        rounds=2,
    )
    comps = {(c.upper, c.round): c for c in compare(rows, metrics=("eval_reward",))}
    assert set(comps) == {(u, r) for u in ("static", "random", "signal-guided") for r in (1, 2)}
    static = comps[("static", 2)]
    assert static.lower == "zero-shot" and static.seeds == (0, 1, 2, 3, 4)
    # zero-shot's single round-0 evaluation is the baseline of every trained round
    assert static.diffs == pytest.approx((0.10, 0.11, 0.10, 0.11, 0.08))
    assert static.verdict == "above" and static.wins == 5 and static.sign_p == pytest.approx(0.0625)
    assert comps[("random", 2)].verdict == "not separated"
    assert comps[("signal-guided", 2)].verdict == "below" and comps[("signal-guided", 2)].mean < 0

    text = verdicts(list(comps.values()))
    assert any("static beats zero-shot beyond noise" in t for t in text)
    assert any("random and static are not separated" in t for t in text)
    assert any("signal-guided is below random beyond noise" in t for t in text)
    assert text[-1].endswith("does not hold beyond noise.")
    assert all("round 2" in t for t in text)  # the last trained round only


def test_an_order_that_holds_says_so_and_few_seeds_give_no_verdict():
    up = {
        "zero-shot": [0.1, 0.1, 0.1],
        "static": [0.2, 0.21, 0.2],
        "random": [0.3, 0.31, 0.32],
        "signal-guided": [0.4, 0.42, 0.41],
    }
    assert verdicts(compare(_rows(up), metrics=("eval_reward",)))[-1].endswith("holds beyond noise.")
    two = {k: v[: MIN_SEEDS - 1] for k, v in up.items()}
    comps = compare(_rows(two), metrics=("eval_reward",))
    assert comps and {c.verdict for c in comps} == {"too few seeds"}
    assert verdicts(compare([], metrics=("eval_reward",)))[0].startswith("No paired seeds")


def test_a_seed_missing_from_one_rung_is_left_out_of_that_pair_only():
    rows = _rows({"static": [0.2, 0.3, 0.4], "random": [0.25, 0.35, 0.45]})
    rows = [r for r in rows if not (r["condition"] == "random" and r["seed"] == 1)]
    rows.append({"condition": "static", "seed": 1, "round": 1, "eval_reward": None})  # a null never pairs
    (comp,) = compare(rows, metrics=("eval_reward",))
    assert comp.seeds == (0, 2) and comp.diffs == pytest.approx((0.05, 0.05))
    assert not math.isnan(comp.lo)
