"""The fixed-cap frontier (dlfp.analysis.frontier) on hand-worked (P99 TTFT, P99 ITL) points, in seconds."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from dlfp.analysis.frontier import FRONTIER_COLUMNS, frontier_comparison, frontier_itl_at, lower_envelope

# Fixed caps as (TTFT s, ITL s); fixed-768 at (3.0, 0.060) is dominated by fixed-1024 at (2.0, 0.050).
FIXED = {"fixed-512": (4.0, 0.030), "fixed-1024": (2.0, 0.050), "fixed-768": (3.0, 0.060),
         "fixed-2048": (1.0, 0.100)}
# Envelope: (1.0, 0.100), (2.0, 0.050), (4.0, 0.030). At 3.0 s: 0.050 + (3 - 2)/(4 - 2) * (0.030 - 0.050) = 0.040.
ENV_T, ENV_I = np.array([1.0, 2.0, 4.0]), np.array([0.100, 0.050, 0.030])


def _rows(exp, seed, fixed, cand, itl_shift=0.0, candidate="dlfps"):
    rows = [dict(experiment=exp, arm=a, seed=seed, itl_p99_s=i + itl_shift, ttft_p99_s=t, slo_passes=1.0)
            for a, (t, i) in fixed.items()]
    if cand is not None:
        rows.append(dict(experiment=exp, arm=candidate, seed=seed, itl_p99_s=cand[1], ttft_p99_s=cand[0],
                         slo_passes=1.0))
    return rows


def _one(out, exp):
    r = out[out["experiment"] == exp]
    assert len(r) == 1, exp
    return r.iloc[0]


def test_lower_envelope_drops_dominated_and_sorts():
    t, i = lower_envelope([v[0] for v in FIXED.values()], [v[1] for v in FIXED.values()])
    np.testing.assert_allclose(t, ENV_T)
    np.testing.assert_allclose(i, ENV_I)
    assert np.all(np.diff(t) > 0) and np.all(np.diff(i) < 0)


def test_lower_envelope_ties_and_duplicates():
    # (2.0, 0.06) has the same TTFT as (2.0, 0.05) and a higher ITL: dropped; (3.0, 0.05) same ITL, later: dropped;
    # the duplicate (1.0, 0.1) is kept once.
    t, i = lower_envelope([1.0, 1.0, 2.0, 2.0, 3.0], [0.1, 0.1, 0.06, 0.05, 0.05])
    np.testing.assert_allclose(t, [1.0, 2.0])
    np.testing.assert_allclose(i, [0.1, 0.05])
    t, i = lower_envelope([], [])
    assert t.size == 0 and i.size == 0


def test_lower_envelope_errors():
    with pytest.raises(ValueError, match="finite"):
        lower_envelope([1.0, float("nan")], [0.1, 0.2])
    with pytest.raises(ValueError, match="points"):
        lower_envelope([1.0, 2.0], [0.1])


def test_frontier_itl_at_hand_values():
    assert frontier_itl_at(3.0, ENV_T, ENV_I) == pytest.approx(0.040)
    assert frontier_itl_at(1.5, ENV_T, ENV_I) == pytest.approx(0.075)  # 0.100 + 0.5 * (0.050 - 0.100)
    assert frontier_itl_at(2.0, ENV_T, ENV_I) == pytest.approx(0.050)  # on a cap
    assert frontier_itl_at(1.0, ENV_T, ENV_I) == pytest.approx(0.100)  # the smallest TTFT itself is reached
    assert frontier_itl_at(0.5, ENV_T, ENV_I) == math.inf  # no fixed cap reaches 0.5 s
    assert frontier_itl_at(4.0, ENV_T, ENV_I) == pytest.approx(0.030)
    assert frontier_itl_at(5.0, ENV_T, ENV_I) == pytest.approx(0.030)  # beyond the last cap: its ITL
    assert frontier_itl_at(1.0, [], []) == math.inf
    with pytest.raises(ValueError, match="NaN"):
        frontier_itl_at(float("nan"), ENV_T, ENV_I)


def test_one_seed_below_and_above():
    df = pd.DataFrame(_rows("below", 801, FIXED, (3.0, 0.035)) + _rows("above", 801, FIXED, (3.0, 0.045)))
    out = frontier_comparison(df, "dlfps")
    assert list(out.columns) == FRONTIER_COLUMNS
    assert list(out["experiment"]) == ["above", "below"]
    b = _one(out, "below")  # gap 0.035 - 0.040 = -0.005
    assert b["n_seeds"] == 1
    assert b["frontier_itl_p99_s"] == pytest.approx(0.040)
    assert b["gap_s_mean"] == pytest.approx(-0.005)
    assert math.isnan(b["gap_s_ci_low"]) and math.isnan(b["gap_s_ci_high"])
    assert b["on_or_below"]
    assert b["best_fixed_arm"] == "fixed-1024"  # TTFT <= 3.0: fixed-2048 0.100, fixed-1024 0.050, fixed-768 0.060
    assert "P99 ITL 35.0 ms at P99 TTFT 3,000 ms" in b["detail"]
    assert "frontier 40.0 ms there (between fixed-1024 and fixed-512)" in b["detail"]
    assert "gap -5.0 ms (one seed, no CI)" in b["detail"]
    a = _one(out, "above")  # gap 0.045 - 0.040 = +0.005
    assert a["gap_s_mean"] == pytest.approx(0.005)
    assert not a["on_or_below"]


def test_three_seeds_each_against_its_own_fixed_points():
    # 801: frontier at 3.0 = 0.040, candidate 0.036 -> gap -0.004
    # 802: fixed ITLs +0.010, frontier at 3.0 = 0.050, candidate 0.049 -> gap -0.001
    # 803: frontier at 2.5 = 0.050 + 0.25 * (0.030 - 0.050) = 0.045, candidate 0.047 -> gap +0.002
    # mean -0.001; sd = sqrt((0.003**2 + 0 + 0.003**2) / 2) = 0.003; half = t(0.975, 2) * 0.003 / sqrt(3)
    df = pd.DataFrame(_rows("e", 801, FIXED, (3.0, 0.036)) + _rows("e", 802, FIXED, (3.0, 0.049), 0.010)
                      + _rows("e", 803, FIXED, (2.5, 0.047)))
    r = _one(frontier_comparison(df, "dlfps"), "e")
    half = sps.t.ppf(0.975, 2) * 0.003 / math.sqrt(3)
    assert r["n_seeds"] == 3
    assert r["candidate_itl_p99_s"] == pytest.approx((0.036 + 0.049 + 0.047) / 3)
    assert r["candidate_ttft_p99_s"] == pytest.approx((3.0 + 3.0 + 2.5) / 3)
    assert r["frontier_itl_p99_s"] == pytest.approx((0.040 + 0.050 + 0.045) / 3)
    assert r["gap_s_mean"] == pytest.approx(-0.001)
    assert r["gap_s_ci_low"] == pytest.approx(-0.001 - half)
    assert r["gap_s_ci_high"] == pytest.approx(-0.001 + half)
    assert r["on_or_below"]
    assert "95 % CI" in r["detail"]


def test_three_seeds_significantly_above():
    # gaps +0.004, +0.005, +0.006 against the 0.040 frontier at 3.0 s: mean 0.005, sd 0.001,
    # ci_low = 0.005 - t(0.975, 2) * 0.001 / sqrt(3) = 0.005 - 0.00248 > 0
    df = pd.DataFrame(sum((_rows("e", s, FIXED, (3.0, 0.040 + g)) for s, g in
                           ((801, 0.004), (802, 0.005), (803, 0.006))), []))
    r = _one(frontier_comparison(df, "dlfps"), "e")
    assert r["gap_s_ci_low"] == pytest.approx(0.005 - sps.t.ppf(0.975, 2) * 0.001 / math.sqrt(3))
    assert not r["on_or_below"]


def test_infinite_gap_ci_over_finite_seeds():
    # 801: candidate TTFT 0.5 s < 1.0 s (smallest fixed TTFT): frontier +inf, gap -inf
    # 802, 803: gaps -0.004, +0.002 at 3.0 s; finite mean -0.001, sd = sqrt(0.003**2 + 0.003**2) = 0.003 * sqrt(2),
    # half = t(0.975, 1) * 0.003 * sqrt(2) / sqrt(2) = t(0.975, 1) * 0.003
    df = pd.DataFrame(_rows("e", 801, FIXED, (0.5, 0.200)) + _rows("e", 802, FIXED, (3.0, 0.036))
                      + _rows("e", 803, FIXED, (3.0, 0.042)))
    r = _one(frontier_comparison(df, "dlfps"), "e")
    half = sps.t.ppf(0.975, 1) * 0.003
    assert r["frontier_itl_p99_s"] == math.inf
    assert r["gap_s_mean"] == -math.inf
    assert r["gap_s_ci_low"] == pytest.approx(-0.001 - half)
    assert r["gap_s_ci_high"] == pytest.approx(-0.001 + half)
    assert r["on_or_below"]
    assert "gap -inf in 1 of 3 seeds" in r["detail"] and "over the 2 finite seeds" in r["detail"]


def test_infinite_gap_with_fewer_than_two_finite_counts_as_below():
    # one seed at 0.5 s: gap -inf, no fixed arm has TTFT <= 0.5 s
    r = _one(frontier_comparison(pd.DataFrame(_rows("e", 801, FIXED, (0.5, 0.5))), "dlfps"), "e")
    assert r["gap_s_mean"] == -math.inf and r["frontier_itl_p99_s"] == math.inf
    assert math.isnan(r["gap_s_ci_low"]) and math.isnan(r["gap_s_ci_high"])
    assert r["on_or_below"]
    assert r["best_fixed_arm"] == ""
    assert "below every fixed cap's TTFT" in r["detail"]
    # one -inf seed and one finite seed above the frontier (+0.005): the mean is -inf, counted as below
    df = pd.DataFrame(_rows("e", 801, FIXED, (0.5, 0.5)) + _rows("e", 802, FIXED, (3.0, 0.045)))
    r = _one(frontier_comparison(df, "dlfps"), "e")
    assert r["gap_s_mean"] == -math.inf and math.isnan(r["gap_s_ci_low"])
    assert r["on_or_below"]


def test_seed_missing_a_fixed_arm_is_skipped():
    df = pd.DataFrame(_rows("e", 801, FIXED, (3.0, 0.035)) + _rows("e", 802, FIXED, (3.0, 0.035))
                      + _rows("e", 803, {k: FIXED[k] for k in ("fixed-1024", "fixed-512")}, (3.0, 0.5)))
    r = _one(frontier_comparison(df, "dlfps"), "e")
    assert r["n_seeds"] == 2
    assert r["gap_s_mean"] == pytest.approx(-0.005)
    assert r["gap_s_ci_low"] == pytest.approx(-0.005) and r["gap_s_ci_high"] == pytest.approx(-0.005)  # sd 0
    assert "seed 803 skipped" in r["detail"]


def test_experiments_without_fixed_arms_or_candidate_are_skipped():
    df = pd.DataFrame(_rows("keep", 801, FIXED, (3.0, 0.035))
                      + _rows("no-fixed", 801, {"baseline": (1.0, 0.1)}, (3.0, 0.035))
                      + _rows("one-fixed", 801, {"fixed-512": (4.0, 0.03)}, (3.0, 0.035))
                      + _rows("no-candidate", 801, FIXED, None))
    out = frontier_comparison(df, "dlfps")
    assert list(out["experiment"]) == ["keep"]
    empty = frontier_comparison(df, "absent")
    assert empty.empty and list(empty.columns) == FRONTIER_COLUMNS


def test_custom_prefix():
    fixed = {k.replace("fixed-", "cap"): v for k, v in FIXED.items()}
    r = _one(frontier_comparison(pd.DataFrame(_rows("e", 801, fixed, (3.0, 0.035))), "dlfps", "cap"), "e")
    assert r["best_fixed_arm"] == "cap1024" and r["gap_s_mean"] == pytest.approx(-0.005)


def test_errors():
    df = pd.DataFrame(_rows("e", 801, FIXED, (3.0, 0.035)))
    with pytest.raises(ValueError, match="ttft_p99_s"):
        frontier_comparison(df.drop(columns=["ttft_p99_s"]), "dlfps")
    with pytest.raises(ValueError, match="more than one row"):
        frontier_comparison(pd.concat([df, df.tail(1)]), "dlfps")
    bad = df.copy()
    bad.loc[0, "itl_p99_s"] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        frontier_comparison(bad, "dlfps")
