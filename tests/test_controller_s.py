"""DLFP-S (dlfp.policies.dlfps): estimator, feasibility and TTFT guards on hand-built iterations.

Every expected cap below is worked out by hand in the comments from the
iteration-time law fed in (no timing is measured).
"""
from __future__ import annotations

import math

import pytest

from dlfp.config import PolicyConfig, build_policy
from dlfp.policies.base import Observation
from dlfp.policies.dlfps import (
    DEFAULT_OPTIONS,
    DLFPS,
    TAIL_GRID,
    RLSEstimator,
    counterfactual_gaps,
    weighted_quantile,
    weighted_quantiles,
)

# A varied set of (prefill tokens, decodes) so the three-parameter fit is identifiable.
PS = [3072, 1500, 800, 2600, 3000, 1200, 2048, 512, 2900, 1750, 2300, 900]
DS = [4, 1, 7, 2, 9, 3, 5, 6, 2, 8, 4, 3]


def law(a: float, b: float, c: float):
    return lambda p, d: a + b * p + c * d


LINEAR = law(0.010, 2e-5, 1e-4)  # fits the 80 ms target
HEAVY = law(0.010, 2e-4, 1e-4)  # 0.010 + 2e-4 * 1024 = 0.2148 s > 0.080 s even at min_cap


class Driver:
    """Feeds a policy closed-loop: asks the cap, schedules min(wanted, cap) prefill, observes."""

    def __init__(self, pol: DLFPS, timing) -> None:
        self.pol, self.timing, self.i = pol, timing, 0

    def step(self, p: int, d: int, *, host: float | None = None) -> int | None:
        cap = self.pol.prefill_cap(d, now_s=self.i * 0.05)
        p_sched = p if cap is None else min(p, cap)
        t = self.timing(p_sched, d)
        self.pol.observe(
            Observation(self.i, self.i * 0.05, p_sched, d, cap, host_interval_s=host, device_time_s=t)
        )
        self.i += 1
        return cap

    def run(self, pairs) -> None:
        for p, d in pairs:
            self.step(p, d)


def reasons(pol: DLFPS) -> list[str]:
    return [d.reason for d in pol.decisions]


# ---------------------------------------------------------------------------------------- estimator
def test_rls_recovers_exact_linear_law():
    est = RLSEstimator(0.95)
    for p, d in zip(PS, DS):
        est.update(p, d, LINEAR(p, d))
    a, b, c = est.coef
    assert a == pytest.approx(0.010, rel=1e-2)
    assert b == pytest.approx(2e-5, rel=1e-3)
    assert c == pytest.approx(1e-4, rel=0.05)
    assert est.rel_error < 1e-3  # exact data: a-priori errors vanish once identified
    assert est.predict(1000, 10) == pytest.approx(0.010 + 0.020 + 0.001, rel=1e-3)


def test_estimate_jumps_to_largest_quantised_cap_meeting_target():
    pol = DLFPS(use_feasibility=False)  # min_samples 8
    drv = Driver(pol, LINEAR)
    # First guarded cycle runs at the initial cap 3072 with 4 decodes:
    # T = 0.010 + 2e-5*3072 + 1e-4*4 = 0.07184 s -> proportional 3072*0.08/0.07184 = 3420.9 -> Q128 = 3456.
    drv.step(PS[0], DS[0])
    assert pol.decisions[0].reason == "proportional" and pol.cap == 3456
    drv.run(zip(PS[1:8], DS[1:8]))
    assert reasons(pol) == ["proportional"] * 7 + ["estimate"]
    # Largest multiple of 128 with 0.010 + 2e-5*C + 1e-4*d <= 0.080:
    # d=4:  C <= (0.080-0.010-0.0004)/2e-5 = 3480 -> 27*128 = 3456
    # d=20: C <= (0.080-0.010-0.0020)/2e-5 = 3400 -> 26*128 = 3328
    # d=0 -> no cap (isolated prefill is unconstrained)
    assert pol.prefill_cap(4) == 3456
    assert pol.prefill_cap(20) == 3328
    assert pol.prefill_cap(0) is None
    assert pol.decisions[-1].cap_after == 3328 + 128  # last observed iteration had 6 decodes: 3440 -> 3456
    assert pol.params()["use_estimator"] is True and pol.params()["name"] == "dlfps"


def test_estimate_clamps_to_max_cap():
    # T = 0.005 + 5e-6*p: 0.080 allows (0.075)/5e-6 = 15000 tokens -> clamp to max_cap 6144.
    pol = DLFPS(use_feasibility=False)
    Driver(pol, law(0.005, 5e-6, 0.0)).run(zip(PS[:8], DS[:8]))
    assert pol.decisions[-1].reason == "estimate"
    assert pol.prefill_cap(3) == 6144


def test_unreliable_estimate_falls_back_to_proportional():
    # Wildly noisy times (no linear law): relative error stays far above 0.15.
    times = [0.02, 0.30, 0.05, 0.01, 0.25, 0.04, 0.20, 0.015, 0.3, 0.02, 0.09, 0.01]
    pol = DLFPS(use_feasibility=False)
    cap = pol.cap
    for i, (p, d, t) in enumerate(zip(PS, DS, times)):
        c = pol.prefill_cap(d)
        p = min(p, c)
        pol.observe(Observation(i, i * 0.05, p, d, c, device_time_s=t))
        expect = min(6144, max(1024, int(math.floor(cap * 0.080 / t / 128 + 0.5)) * 128))
        assert pol.cap == expect
        cap = expect
    assert not pol.estimate_reliable
    assert set(reasons(pol)) == {"proportional"}


# ---------------------------------------------------------------------------------------- feasibility


def _feed(pol: DLFPS, i0: int, items) -> int:
    """items: (prefill, decodes, device seconds); cap taken from the policy."""
    for p, d, t in items:
        cap = pol.prefill_cap(d)
        pol.observe(Observation(i0, i0 * 0.05, p if cap is None else min(p, cap), d, cap, device_time_s=t))
        i0 += 1
    return i0


# ---------------------------------------------------------------------------------------- feasibility
def test_counterfactual_gaps_hand_example():
    # decode-only: t = 0.01, 0.01, 0.03, 0.01 -> t0 = median = 0.01 (weights 2, 2, 2, 1)
    # run 1 = iterations 3-4: P = 8000, E = 0.20 + 0.20 = 0.40, D = 4, k = 2
    # run 2 = iteration 6:    P = 1000, E = 0.05, D = 3, k = 1
    w = [(0, 2, 0.01), (0, 2, 0.01), (0, 2, 0.03), (4000, 2, 0.21), (4000, 2, 0.21), (0, 1, 0.01), (1000, 3, 0.06)]
    v, wt = counterfactual_gaps(w, 8000)  # run 1 merges into n = 1: 0.01 + 0.40 = 0.41, weight 1 * 4 / 2 = 2
    assert list(v) == pytest.approx([0.01, 0.01, 0.03, 0.01, 0.41, 0.06])
    assert list(wt) == pytest.approx([2, 2, 2, 1, 2, 3])
    v, wt = counterfactual_gaps(w, 2000)  # run 1: n = 4 of 0.01 + 0.1 = 0.11, weight 4 * 2 = 8
    assert list(v[4:]) == pytest.approx([0.11, 0.06]) and list(wt[4:]) == pytest.approx([8, 3])
    assert counterfactual_gaps([(500, 0, 0.1)], 100)[0].size == 0  # no decodes, no gaps
    with pytest.raises(ValueError, match="limit"):
        counterfactual_gaps(w, 0)


def test_tail_quantiles_span_the_band():
    pol = DLFPS(tail_quantile=0.9)  # tail mass 0.1, band 2: 0.2 .. 0.05
    qs = pol.tail_quantiles()
    assert len(qs) == TAIL_GRID and qs[0] == pytest.approx(0.8) and qs[-1] == pytest.approx(0.95)
    assert qs[TAIL_GRID // 2] == 0.9 and list(qs) == sorted(qs)
    assert DLFPS(tail_quantile=0.9, tail_band=1.0).tail_quantiles() == (0.9,)


# Two workloads, fed uncapped, each 100 gaps. A decode-only step takes 10 ms; a stall is one mixed
# iteration of 8,000 prefill tokens with 3 decodes taking 410 ms. The first such iteration teaches the
# proportional law: cap 3072 -> 8000 * 0.08 / 0.41 = 1561 -> 1536 (12 x 128). Rebuilt under 1536:
# n = ceil(8000 / 1536) = 6 iterations of 0.01 + 0.40 / 6 = 0.0767 s, weight 6 * 3 = 18 per stall.
DEC, STALL = (0, 1, 0.01), (8000, 3, 0.41)
FREQUENT = [DEC] * 7 + [STALL]  # x 10: stall mass 30/100; capped 180/250 -> all band quantiles 0.41 vs 0.0767
RARE = [DEC] * 48 + [STALL] + [DEC] * 49  # stall mass 3/100: uncapped P90 = 0.01; capped 18/115 = 16 % -> P90 0.0767


def _tail_pol(**kw) -> DLFPS:
    return DLFPS(tail_quantile=0.9, tail_min_samples=100, tail_check_every=100, use_estimator=False, **kw)


def test_tail_check_caps_when_stalls_are_frequent():
    pol = _tail_pol()
    assert pol.prefill_cap(3) is None  # reference phase: uncapped
    _feed(pol, 0, FREQUENT * 10)
    assert reasons(pol) == ["reference"] * 79 + ["resume"]
    assert pol.prefill_cap(3) == 1536
    t = pol.last_tail
    assert t["limit"] == 1536 and t["no_cap_limit"] == 8000
    assert t["uncapped"] == [0.41] * TAIL_GRID and t["capped"] == pytest.approx([0.01 + 0.40 / 6] * TAIL_GRID)


def test_tail_check_stands_down_when_stalls_are_rare_then_resumes():
    pol = _tail_pol()
    i = _feed(pol, 0, RARE)
    assert reasons(pol)[-1] == "stand_down_tail" and pol.prefill_cap(3) is None
    t = pol.last_tail
    assert t["uncapped"][TAIL_GRID // 2] == 0.01 and t["capped"][TAIL_GRID // 2] == pytest.approx(0.01 + 0.40 / 6)
    # The check keeps running while stood down (every 100 gaps). After RARE + 10 x FREQUENT the uncapped
    # stall mass is 33/200 = 16.5 % < 20 %: P80 = 0.01 < capped P80 (198/365 at 0.0767): still no. After
    # RARE + 20 x FREQUENT it is 63/300 = 21 %: P80..P95 all 0.41, capped (378/615) all 0.0767: resume.
    i = _feed(pol, i, FREQUENT * 10)
    assert reasons(pol)[-1] == "stood_down" and pol.num_checks == 2
    _feed(pol, i, FREQUENT * 10)
    assert reasons(pol)[-1] == "resume" and pol.num_checks == 3
    assert pol.prefill_cap(3) == 1536


def test_single_quantile_check_misses_the_knife_edge():
    # tail_band = 1 compares P90 only. Window: 87 decode-only + one stall of 4 decodes (mass 4/91 = 4.4 %,
    # uncapped P90 = 0.01) ... with a second stall the mass is 8/95 = 8.4 %, still under 10 %: stand down.
    # With 3 stalls the uncapped mass is 12/99 = 12.1 % -> P90 = 0.41, capped P90 = 0.0767: the single
    # quantile says cap, though uncapped P80 = 0.01 < capped P80 = 0.0767: the band (default) says no.
    stall = (8000, 4, 0.41)
    items = [DEC] * 29 + [stall] + [DEC] * 29 + [stall] + [DEC] * 29 + [stall]
    single = DLFPS(tail_quantile=0.9, tail_band=1.0, tail_min_samples=99, use_estimator=False)
    _feed(single, 0, items)
    assert reasons(single)[-1] == "resume"
    band = DLFPS(tail_quantile=0.9, tail_min_samples=99, use_estimator=False)
    _feed(band, 0, items)
    assert reasons(band)[-1] == "stand_down_tail"
    assert band.last_tail["uncapped"][0] == 0.01 and band.last_tail["capped"][0] == pytest.approx(0.01 + 0.4 / 6)


def test_infeasible_stand_down_option():
    # 8 prefill-only iterations teach HEAVY exactly: T(1024, 1) = 0.010 + 0.2048 + 0.0001 > 0.080.
    items = [(p, 0, HEAVY(p, 0)) for p in PS[:8]] + [(0, 1, HEAVY(0, 1))] * 7 + [(8000, 3, HEAVY(8000, 3))]
    on = DLFPS(tail_quantile=0.9, tail_min_samples=10, infeasible_stand_down=True)
    _feed(on, 0, items)
    assert on.estimate_reliable and on.estimate_cap(1) is None
    assert reasons(on)[-1] == "stand_down_infeasible" and on.prefill_cap(3) is None
    # Default: infeasibility only pins the cap at min_cap and the tail check decides. Uncapped: 7 gaps of
    # 0.0101 s and 3 of 1.6103 s (stall mass 30 %: P80..P95 = 1.6103); at 1024: ceil(8000/1024) = 8 iterations
    # of 0.0101 + 1.6002/8 = 0.2101 s, weight 24 of 31: P80..P95 = 0.2101, lower everywhere: cap at 1024.
    off = DLFPS(tail_quantile=0.9, tail_min_samples=10)
    _feed(off, 0, items)
    assert off._target_cap(3) == 1024
    assert reasons(off)[-1] == "resume" and off.prefill_cap(3) == 1024
    assert off.last_tail["capped"] == pytest.approx([0.0101 + 1.6002 / 8] * TAIL_GRID, rel=1e-6)


def test_feasibility_off_never_stands_down():
    pol = DLFPS(use_feasibility=False, use_estimator=False, tail_quantile=0.9)
    assert pol.prefill_cap(4) == 3072  # no reference phase without the feasibility part
    _feed(pol, 0, RARE)
    assert all(d.cap_after is not None for d in pol.decisions) and pol.num_checks == 0
    fit = DLFPS(use_feasibility=False)
    Driver(fit, HEAVY).run(zip(PS, DS))
    assert fit.prefill_cap(4) == 1024  # the fit says infeasible: the cap pins at min_cap


def test_ttft_guard_without_remaining_tokens():
    pol = DLFPS(use_feasibility=False, ttft_slo_s=2.0, use_estimator=False)  # ttft_guard_frac 0.5
    assert pol.prefill_cap(4, oldest_waiting_s=0.5) == 3072  # 0.5 s < 0.5 * 2 s
    assert pol.prefill_cap(4, oldest_waiting_s=1.2) == 6144  # past half the SLO: max_cap
    assert pol.prefill_cap(4, oldest_waiting_s=2.5) == 3072  # already missed: no help
    assert pol.guard_grants == 1


def _trained(**kw) -> DLFPS:
    pol = DLFPS(use_feasibility=False, ttft_slo_s=2.0, **kw)
    Driver(pol, LINEAR).run(zip(PS[:8], DS[:8]))
    assert pol.estimate_reliable
    return pol


def test_ttft_guard_with_remaining_tokens_uses_learned_cost():
    pol = _trained()
    # Base cap for 4 decodes: 3456 (see the estimator test). R = 10,000 remaining tokens.
    # need(C) = ceil(10000 / C) * (0.010 + 2e-5*C + 0.0004):
    #   need(3456) = 3 * 0.07952 = 0.23856 s; chunks 3584..4992 still need 3 iterations (worse);
    #   need(5120) = 2 * 0.1128 = 0.2256 s; need(>=5248) grows again until 10,000 > max_cap.
    assert pol.prefill_cap(4, oldest_waiting_s=1.76, oldest_remaining_tokens=10_000) == 3456  # slack 0.240
    assert pol.prefill_cap(4, oldest_waiting_s=1.765, oldest_remaining_tokens=10_000) == 5120  # slack 0.235
    assert pol.prefill_cap(4, oldest_waiting_s=1.8, oldest_remaining_tokens=10_000) is None  # slack 0.2: no chunk fits
    assert pol.prefill_cap(4, oldest_waiting_s=2.1, oldest_remaining_tokens=10_000) == 3456  # missed already


def test_ttft_guarded_cycle_does_not_move_proportional_cap():
    pol = DLFPS(use_feasibility=False, ttft_slo_s=2.0, use_estimator=False)
    cap = pol.prefill_cap(4, oldest_waiting_s=1.5)
    assert cap == 6144
    pol.observe(Observation(0, 0.0, 6144, 4, cap, device_time_s=0.160))
    assert pol.decisions[-1].reason == "ttft_guard"
    assert pol.cap == 3072  # proportional law would have halved 6144 -> 3072 from 3072 -> 1536


def test_ttft_guard_off_or_without_slo_does_nothing():
    off = _trained(use_ttft_guard=False)
    assert off.prefill_cap(4, oldest_waiting_s=1.765, oldest_remaining_tokens=10_000) == 3456
    no_slo = DLFPS(use_feasibility=False)
    assert no_slo.prefill_cap(4, oldest_waiting_s=100.0) == 3072


# ---------------------------------------------------------------------------------------- ablations
def test_estimator_off_stays_proportional():
    pol = DLFPS(use_feasibility=False, use_estimator=False)
    Driver(pol, LINEAR).run(zip(PS, DS))
    assert set(reasons(pol)) == {"proportional"}
    assert pol.estimator.n == 0


def test_signal_choice_changes_the_interval_used():
    dev = DLFPS(use_feasibility=False, use_estimator=False)
    host = DLFPS(use_feasibility=False, use_estimator=False, signal="host_cadence")
    assert dev.signal == "device_completion"
    for pol in (dev, host):
        pol.observe(Observation(0, 0.0, 3072, 4, 3072, host_interval_s=0.160, device_time_s=0.040))
    assert dev.cap == 6144  # 3072 * 0.08 / 0.04 = 6144
    assert host.cap == 1536  # 3072 * 0.08 / 0.16 = 1536


def test_estimator_sample_selection():
    items = [(0, 3, 0.0103), (2000, 0, 0.05), (1000, 2, 0.0302)]  # decode-only, prefill-only, guarded
    counts = {}
    for mode in ("guarded", "prefill", "all"):
        pol = DLFPS(use_feasibility=False, estimator_samples=mode)
        _feed(pol, 0, items)
        counts[mode] = pol.estimator.n
    assert counts == {"guarded": 1, "prefill": 2, "all": 3}



# ---------------------------------------------------------------------------------------- plumbing
def test_weighted_quantile_hand_example():
    assert weighted_quantile([3.0, 1.0, 2.0], [1, 1, 2], 0.5) == 2.0  # cum 1 (1.0), 3 (2.0) >= 2
    assert weighted_quantile([3.0, 1.0, 2.0], [1, 1, 2], 0.25) == 1.0
    assert weighted_quantile([3.0, 1.0, 2.0], [1, 1, 2], 0.99) == 3.0
    with pytest.raises(ValueError):
        weighted_quantile([], [], 0.5)
    # the vectorised version agrees at every q
    assert weighted_quantiles([3.0, 1.0, 2.0], [1, 1, 2], [0.25, 0.5, 0.99]) == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError):
        weighted_quantiles([], [], [0.5])


@pytest.mark.parametrize(
    "opts,word",
    [
        ({"bogus": 1}, "bogus"),
        ({"forgetting": 0.0}, "forgetting"),
        ({"forgetting": 1.5}, "forgetting"),
        ({"use_estimator": "yes"}, "use_estimator"),
        ({"min_samples": 2}, "min_samples"),
        ({"estimator_samples": "some"}, "estimator_samples"),
        ({"ttft_slo_s": -1}, "ttft_slo_s"),
        ({"tail_quantile": 1.0}, "tail_quantile"),
        ({"tail_min_samples": 10, "tail_window": 5}, "tail_min_samples"),
        ({"tail_band": 0.5}, "tail_band"),
        ({"tail_quantile": 0.9, "tail_band": 20}, "tail_band"),
        ({"tail_margin": 1.0}, "tail_margin"),
        ({"infeasible_stand_down": 1}, "infeasible_stand_down"),
    ],
)
def test_bad_options_are_named(opts, word):
    with pytest.raises(ValueError, match=word):
        DLFPS(**opts)


def test_guarded_iteration_without_signal_is_an_error():
    pol = DLFPS(use_feasibility=False)
    with pytest.raises(ValueError, match="device_completion"):
        pol.observe(Observation(0, 0.0, 1000, 2, 3072, host_interval_s=0.05))


def test_build_policy_passes_options_and_params_list_them():
    pc = PolicyConfig(policy="dlfps", signal="device_completion", options={"ttft_slo_s": 2.0, "forgetting": 0.9})
    pol = build_policy(pc)
    assert isinstance(pol, DLFPS)
    params = pol.params()
    assert params["ttft_slo_s"] == 2.0 and params["forgetting"] == 0.9
    assert set(DEFAULT_OPTIONS) <= set(params)
    with pytest.raises(ValueError, match="nope"):
        PolicyConfig(policy="dlfps", options={"nope": 1})


def test_bad_option_message_is_one_line():
    with pytest.raises(ValueError) as ei:
        DLFPS(forgetting=0.0)
    assert str(ei.value) == "dlfps option forgetting: Input should be greater than 0"
    with pytest.raises(ValueError) as ei:
        DLFPS(bogus=1)
    assert str(ei.value) == f"dlfps option bogus: unknown option; known: {', '.join(DEFAULT_OPTIONS)}"
    with pytest.raises(ValueError) as ei:
        DLFPS(tail_min_samples=10, tail_window=5)
    assert str(ei.value) == "dlfps options: tail_min_samples=10 is larger than tail_window=5"
