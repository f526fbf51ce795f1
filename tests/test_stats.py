"""Paired statistics: the paper's published numbers and the edge cases."""
import math

import pandas as pd
import pytest

from dlfp.analysis.stats import paired_change, paired_from_frame, relative_change, summarize_changes


def test_paper_p99_itl_changes_mean_and_interval():
    # Paper (A100, 0.6B, seeds 801/802/803): P99 ITL drops 24.8, 30.1, 28.2 %, i.e. changes of
    # -24.8, -30.1, -28.2 %; published mean -27.7 %, 95 % CI -34.3..-21.0 %.
    # By hand: mean -83.1/3 = -27.70; deviations 2.9, -2.4, -0.5; sd = sqrt(14.42/2) = 2.6851;
    # t_{0.975,2} = 4.3027; half width = 4.3027*2.6851/sqrt(3) = 6.670 -> -34.37..-21.03.
    r = summarize_changes([-24.8, -30.1, -28.2])
    assert r.n == 3
    assert r.mean == pytest.approx(-27.70, abs=0.005)
    assert r.ci_low == pytest.approx(-34.37, abs=0.005)
    assert r.ci_high == pytest.approx(-21.03, abs=0.005)
    assert r.crosses_zero is False
    assert r.per_seed == pytest.approx((-24.8, -30.1, -28.2))


def test_paper_values_through_paired_change_fractions():
    # Baseline P99 ITL 100 ms each seed; candidate reduced by the published fractions.
    base = [0.100, 0.100, 0.100]
    cand = [0.100 * (1 - 0.248), 0.100 * (1 - 0.301), 0.100 * (1 - 0.282)]
    r = paired_change(base, cand)
    assert r.per_seed == pytest.approx((-0.248, -0.301, -0.282))
    assert r.mean == pytest.approx(-0.2770, abs=5e-5)
    assert r.ci_low == pytest.approx(-0.3437, abs=5e-5)
    assert r.ci_high == pytest.approx(-0.2103, abs=5e-5)
    pct = r.as_percent()
    assert pct.mean == pytest.approx(-27.70, abs=0.005) and pct.ci_low == pytest.approx(-34.37, abs=0.005)


def test_two_gpu_changes_interval_crosses_zero():
    # Paper TP=2: P99 ITL changes -5.3, -8.2, -24.7 %. By hand: mean -12.73, sd 10.46,
    # half width 4.3027*10.46/sqrt(3) = 25.99 -> -38.7..13.3, which contains 0.
    r = summarize_changes([-5.3, -8.2, -24.7])
    assert r.mean == pytest.approx(-12.733, abs=0.01)
    assert r.ci_low == pytest.approx(-38.73, abs=0.05)
    assert r.ci_high == pytest.approx(13.26, abs=0.05)
    assert r.ci_low < 0 < r.ci_high
    assert r.crosses_zero is True


def test_sign_convention_negative_is_lower():
    assert relative_change(2.0, 1.5) == pytest.approx(-0.25)  # candidate lower -> -25 %
    assert relative_change(2.0, 3.0) == pytest.approx(0.5)  # candidate higher -> +50 %
    # 8B at 0.10 req/s: P99 ITL 19 ms -> 281 ms is a change of (281-19)/19 = +13.79.
    assert relative_change(0.019, 0.281) == pytest.approx(13.789, abs=1e-3)


def test_single_seed_has_no_interval():
    r = paired_change([1.0], [0.8])
    assert r.n == 1
    assert r.mean == pytest.approx(-0.2)
    assert math.isnan(r.ci_low) and math.isnan(r.ci_high)
    assert r.crosses_zero is True
    assert "n=1" in r.note


def test_identical_changes_give_zero_width_interval():
    r = summarize_changes([0.1, 0.1, 0.1])
    assert r.ci_low == pytest.approx(0.1) and r.ci_high == pytest.approx(0.1)
    assert r.crosses_zero is False


def test_other_confidence_level():
    # 90 %: t_{0.95,2} = 2.9200; half = 2.92*2.6851/sqrt(3) = 4.527.
    r = summarize_changes([24.8, 30.1, 28.2], confidence=0.90)
    assert r.ci_high - r.mean == pytest.approx(4.527, abs=0.01)


def test_zero_baseline_is_named():
    with pytest.raises(ValueError, match=r"baseline\[1\] is zero"):
        paired_change([1.0, 0.0, 2.0], [1.0, 1.0, 1.0])


@pytest.mark.parametrize(
    "base, cand, msg",
    [
        ([1.0, 2.0], [1.0], "paired"),
        ([], [], "empty"),
        ([1.0, float("nan")], [1.0, 1.0], r"baseline\[1\]"),
        ([1.0, 1.0], [1.0, float("inf")], r"candidate\[1\]"),
    ],
)
def test_bad_inputs(base, cand, msg):
    with pytest.raises(ValueError, match=msg):
        paired_change(base, cand)


def test_bad_confidence():
    with pytest.raises(ValueError, match="confidence"):
        summarize_changes([0.1, 0.2], confidence=95)


def test_paired_from_frame_pairs_by_seed():
    df = pd.DataFrame(
        {
            "arm": ["baseline", "dlfp", "baseline", "dlfp", "dlfp"],
            "seed": [801, 802, 802, 801, 803],  # 803 has no baseline: dropped
            "itl_p99_s": [0.200, 0.150, 0.100, 0.100, 9.9],
        }
    )
    r = paired_from_frame(df, "itl_p99_s", "dlfp")
    # seed 801: (0.1-0.2)/0.2 = -0.5; seed 802: (0.15-0.1)/0.1 = 0.5
    assert r.per_seed == pytest.approx((-0.5, 0.5))
    assert r.mean == pytest.approx(0.0)
    with pytest.raises(ValueError, match="'nope'"):
        paired_from_frame(df, "itl_p99_s", "nope")
    with pytest.raises(ValueError, match="'ttft'"):
        paired_from_frame(df, "ttft", "dlfp")
