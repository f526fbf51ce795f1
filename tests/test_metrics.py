"""Serving metrics on a hand-computed trace (vLLM `bench serve` definitions).

All times below are dyadic fractions so every difference is exact in binary floating point.

Trace (arrival -> token times, seconds):
  w0 (warm-up)  0.0 -> 0.5, 0.75                    excluded everywhere except energy
  r1            1.0 -> 1.25, 1.3125, 1.4375, 1.5    TTFT 0.25, gaps .0625 .125 .0625,
                                                   E2EL 0.5, TPOT (0.5-0.25)/3 = 0.083333
  r2            2.0 -> 2.5, 2.53125, 2.90625        TTFT 0.5, gaps .03125 .375,
                                                   E2EL 0.90625, TPOT (0.90625-0.5)/2 = 0.203125
  r3            3.0 -> 3.125 (not finished)         failed: out of percentiles, fails SLO
  r4            3.5 -> 3.625 (1 token)              TTFT 0.125, E2EL 0.125, TPOT undefined
"""
import math

import numpy as np
import pandas as pd
import pytest

from dlfp.analysis import metrics as m
from dlfp.config import SLO
from dlfp.traces.format import ITERATION_COLUMNS, REQUEST_COLUMNS, TOKEN_COLUMNS, Trial, coerce, empty_frame

REQS = [
    # id, arrival, output_tokens, warmup, finished, token times
    ("w0", 0.0, 2, True, True, [0.5, 0.75]),
    ("r1", 1.0, 4, False, True, [1.25, 1.3125, 1.4375, 1.5]),
    ("r2", 2.0, 3, False, True, [2.5, 2.53125, 2.90625]),
    ("r3", 3.0, 4, False, False, [3.125]),
    ("r4", 3.5, 1, False, True, [3.625]),
]


def make_trial(energy=None, iterations=None, slo=None) -> Trial:
    rq = pd.DataFrame(
        {
            "request_id": [r[0] for r in REQS],
            "arrival_s": [r[1] for r in REQS],
            "prompt_tokens": [100] * len(REQS),
            "output_tokens": [r[2] for r in REQS],
            "warmup": [r[3] for r in REQS],
            "finished": [r[4] for r in REQS],
            "fingerprint": ["abc"] * len(REQS),
        }
    )
    rows = []
    # Interleave requests' tokens in global time order, as a backend would emit them.
    for rid, _, _, _, _, times in REQS:
        rows += [(rid, i, 1000 + i, t) for i, t in enumerate(times)]
    rows.sort(key=lambda r: r[3])
    tk = pd.DataFrame(rows, columns=list(TOKEN_COLUMNS))
    it = empty_frame(ITERATION_COLUMNS) if iterations is None else coerce(iterations, ITERATION_COLUMNS)
    md = {"experiment": "toy", "arm": "baseline", "seed": 801, "backend": "sim", "energy": energy}
    if slo is not None:
        md["config"] = {"slo": slo}
    return Trial(coerce(rq, REQUEST_COLUMNS), coerce(tk, TOKEN_COLUMNS), it, md)


def test_request_metrics_per_request():
    rm = m.request_metrics(make_trial(), SLO(ttft_s=0.3, itl_s=0.2)).set_index("request_id")
    assert list(rm.index) == ["r1", "r2", "r3", "r4"]  # warm-up excluded
    assert rm["completed"].tolist() == [True, True, False, True]
    assert rm["n_tokens"].tolist() == [4, 3, 1, 1]
    assert rm.loc["r1", "ttft_s"] == 0.25
    assert rm.loc["r2", "ttft_s"] == 0.5
    assert rm.loc["r4", "ttft_s"] == 0.125
    assert rm.loc["r1", "e2el_s"] == 0.5
    assert rm.loc["r2", "e2el_s"] == 0.90625
    assert math.isnan(rm.loc["r3", "e2el_s"])  # unfinished: no E2EL
    assert rm.loc["r1", "tpot_s"] == pytest.approx(0.25 / 3)
    assert rm.loc["r2", "tpot_s"] == pytest.approx(0.203125)
    assert math.isnan(rm.loc["r4", "tpot_s"])  # one token: TPOT undefined
    assert rm.loc["r1", "itl_max_s"] == 0.125
    assert rm.loc["r2", "itl_max_s"] == 0.375
    assert math.isnan(rm.loc["r4", "itl_max_s"])
    # SLO TTFT <= 0.3, worst gap <= 0.2: r1 passes, r2 fails TTFT (and ITL), r3 unfinished, r4 passes.
    assert rm["slo_pass"].tolist() == [True, False, False, True]


def test_itl_samples_pooled_over_completed_measured_requests():
    gaps = np.sort(m.itl_samples(make_trial()))
    # r1: .0625 .125 .0625; r2: .03125 .375; r3 (unfinished) and w0 (warm-up) excluded.
    assert gaps.tolist() == [0.03125, 0.0625, 0.0625, 0.125, 0.375]


def test_summarize_hand_computed_percentiles():
    s = m.summarize(make_trial(), SLO(ttft_s=0.3, itl_s=0.2))
    assert (s["measured"], s["completed"], s["failed"]) == (4, 3, 1)
    # TTFT sample (completed) sorted [0.125, 0.25, 0.5]; linear: rank = p/100 * (n-1).
    assert s["ttft_p50_s"] == pytest.approx(0.25)
    assert s["ttft_p90_s"] == pytest.approx(0.25 + 0.8 * 0.25)  # rank 1.8 -> 0.45
    assert s["ttft_p99_s"] == pytest.approx(0.25 + 0.98 * 0.25)  # rank 1.98 -> 0.495
    assert s["ttft_mean_s"] == pytest.approx(0.875 / 3)
    # ITL sorted [.03125, .0625, .0625, .125, .375]; rank p/100*4.
    assert s["itl_p50_s"] == pytest.approx(0.0625)
    assert s["itl_p90_s"] == pytest.approx(0.125 + 0.6 * 0.25)  # rank 3.6 -> 0.275
    assert s["itl_p99_s"] == pytest.approx(0.125 + 0.96 * 0.25)  # rank 3.96 -> 0.365
    # TPOT [0.083333, 0.203125] (r4 has none).
    lo, hi = 0.25 / 3, 0.203125
    assert s["tpot_p50_s"] == pytest.approx((lo + hi) / 2)
    assert s["tpot_p90_s"] == pytest.approx(lo + 0.9 * (hi - lo))
    assert s["tpot_p99_s"] == pytest.approx(lo + 0.99 * (hi - lo))
    # E2EL sorted [0.125, 0.5, 0.90625].
    assert s["e2el_p50_s"] == pytest.approx(0.5)
    assert s["e2el_p90_s"] == pytest.approx(0.5 + 0.8 * 0.40625)  # 0.825
    assert s["e2el_p99_s"] == pytest.approx(0.5 + 0.98 * 0.40625)  # 0.898125
    # SLO: r1 and r4 pass -> 2 of 4 measured.
    assert s["slo_passes"] == 2
    assert s["slo_fraction"] == pytest.approx(0.5)
    # Duration: first measured arrival 1.0 -> last measured token 3.625 = 2.625 s.
    assert s["duration_s"] == pytest.approx(2.625)
    assert s["goodput_rps"] == pytest.approx(2 / 2.625)
    assert s["output_tokens"] == 9  # 4 + 3 + 1 + 1, warm-up excluded
    assert (s["experiment"], s["arm"], s["seed"], s["backend"]) == ("toy", "baseline", 801, "sim")


def test_percentiles_match_numpy_linear_and_vllm_style():
    # Independent check of the definition on a sample with 101 values 0..100: P99 = 99.
    assert m.percentile(np.arange(101.0), 99) == pytest.approx(99.0)
    assert math.isnan(m.percentile([], 50))
    with pytest.raises(ValueError, match="percentile q"):
        m.percentile([1.0], 101)


def test_slo_itl_quantile():
    t = make_trial()
    # Per-request median gap: r1 (.0625,.0625,.125) -> .0625; r2 (.03125,.375) -> .203125.
    med = m.request_metrics(t, SLO(ttft_s=1.0, itl_s=0.25, itl_quantile=0.5)).set_index("request_id")
    assert med.loc["r2", "itl_slo_s"] == pytest.approx(0.203125)
    assert med["slo_pass"].tolist() == [True, True, False, True]
    worst = m.request_metrics(t, SLO(ttft_s=1.0, itl_s=0.25, itl_quantile=1.0))
    assert worst["slo_pass"].tolist() == [True, False, False, True]  # r2's worst gap .375 > .25
    # A limit exactly equal to the value passes (<=): r1 TTFT is 0.25.
    eq = m.request_metrics(t, SLO(ttft_s=0.25, itl_s=0.125)).set_index("request_id")
    assert bool(eq.loc["r1", "slo_pass"]) is True


def test_slo_from_trial_config_and_missing_slo():
    t = make_trial(slo={"ttft_s": 0.3, "itl_s": 0.2})
    assert m.summarize(t)["slo_passes"] == 2
    bare = make_trial()
    assert m.request_metrics(bare)["slo_pass"].isna().all()
    with pytest.raises(ValueError, match="no SLO"):
        m.summarize(bare)


def test_energy_per_token_from_metadata_and_iterations():
    # 11 output tokens in the whole trial (2 + 4 + 3 + 1 + 1).
    s = m.summarize(make_trial(energy={"source": "nvml", "joules": 22.0}), SLO(ttft_s=1, itl_s=1))
    assert s["energy_per_token_j"] == pytest.approx(2.0)
    assert s["energy_j"] == pytest.approx(22.0)
    assert s["energy_reason"] == ""
    it = pd.DataFrame(
        {
            "iteration": [0, 1],
            "schedule_s": [0.0, 1.0],
            "prefill_tokens": [100, 0],
            "num_prefills": [1, 0],
            "num_decodes": [0, 1],
            "cap": pd.array([None, 3072], dtype="Int64"),
            "cap_after": pd.array([None, 3072], dtype="Int64"),
            "guarded": [False, False],
            "signal": ["host_cadence"] * 2,
            "observed_interval_s": [np.nan, 0.1],
            "host_interval_s": [1.0, np.nan],
            "device_time_s": [0.05, 0.02],
            "issue_s": [0.0, 1.0],
            "device_start_s": [0.0, 1.0],
            "device_end_s": [0.05, 1.02],
            "energy_j": [4.0, 7.0],
        }
    )
    ept, reason, joules = m.energy_per_token(make_trial(energy={"source": "model", "joules": None}, iterations=it))
    assert (ept, reason, joules) == (pytest.approx(1.0), "", pytest.approx(11.0))


def test_energy_without_meter_is_nan_with_reason():
    s = m.summarize(make_trial(energy={"source": "none", "joules": None, "reason": "no NVML on this host"}),
                    SLO(ttft_s=1, itl_s=1))
    assert math.isnan(s["energy_per_token_j"])
    assert s["energy_reason"] == "no NVML on this host"
    ept, reason, _ = m.energy_per_token(make_trial(energy=None))
    assert math.isnan(ept) and "no energy meter" in reason


def test_to_ms_and_summary_to_ms():
    assert m.to_ms(0.0625) == 62.5
    assert m.to_ms(np.array([0.5, 1.0])).tolist() == [500.0, 1000.0]
    s = m.summary_to_ms(m.summarize(make_trial(), SLO(ttft_s=0.3, itl_s=0.2)))
    assert s["ttft_p50_ms"] == pytest.approx(250.0)
    assert s["itl_p99_ms"] == pytest.approx(365.0)
    assert s["duration_s"] == pytest.approx(2.625)  # durations and rates keep their units
    assert "ttft_p50_s" not in s


def test_all_failed_trial():
    t = make_trial()
    t.requests["finished"] = False
    s = m.summarize(t, SLO(ttft_s=1, itl_s=1))
    assert (s["completed"], s["failed"], s["slo_passes"]) == (0, 4, 0)
    assert math.isnan(s["itl_p99_s"]) and math.isnan(s["ttft_p50_s"])
    assert s["goodput_rps"] == 0.0
