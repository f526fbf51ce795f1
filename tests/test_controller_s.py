"""DLFP-S (dlfp.controller_s): estimator, feasibility and TTFT guards on hand-built iterations.

Every expected cap below is worked out by hand in the comments from the
iteration-time law fed in (no timing is measured).
"""
from __future__ import annotations

import math

import pytest

from dlfp.config import PolicyConfig, build_policy
from dlfp.controller import Observation
from dlfp.controller_s import DEFAULT_OPTIONS, DLFPS, RLSEstimator, weighted_quantile

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
    pol = DLFPS(reference_iters=0)  # min_samples 8
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
    pol = DLFPS(reference_iters=0)
    Driver(pol, law(0.005, 5e-6, 0.0)).run(zip(PS[:8], DS[:8]))
    assert pol.decisions[-1].reason == "estimate"
    assert pol.prefill_cap(3) == 6144


def test_unreliable_estimate_falls_back_to_proportional():
    # Wildly noisy times (no linear law): relative error stays far above 0.15.
    times = [0.02, 0.30, 0.05, 0.01, 0.25, 0.04, 0.20, 0.015, 0.3, 0.02, 0.09, 0.01]
    pol = DLFPS(reference_iters=0)
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
def test_infeasible_estimate_stands_down():
    # infeasible_after=100 keeps the measured test out of the way: only the estimate decides.
    pol = DLFPS(reference_iters=0, infeasible_after=100)
    Driver(pol, HEAVY).run(zip(PS[:8], DS[:8]))
    # 8th sample: fit reliable, predicted T(1024, 6) = 0.010 + 0.2048 + 0.0006 = 0.2154 > 0.080
    assert reasons(pol)[:7] == ["proportional"] * 7
    assert reasons(pol)[7] == "stand_down_infeasible"
    assert pol.decisions[7].cap_after is None
    assert pol.prefill_cap(4) is None


def test_measured_infeasibility_without_estimator_then_reprobe_with_backoff():
    pol = DLFPS(reference_iters=0, use_estimator=False, reprobe_iters=5, infeasible_probe=False)
    drv = Driver(pol, HEAVY)
    # cycle 1 at cap 3072, p=3000: T=0.6109 -> cap 3072*0.08/0.6109 = 402 -> clamp 1024.
    # cycles 2,3,4 at min_cap 1024, p=2000 -> T = 0.2106 > 0.08: third overrun stands down.
    drv.run([(3000, 4)] + [(2000, 4)] * 3)
    assert reasons(pol) == ["proportional"] * 3 + ["stand_down_infeasible"]
    assert pol.prefill_cap(4) is None
    # Stood down: uncapped mixed iterations; the 5th decode-carrying one re-probes at min_cap.
    drv.run([(2000, 4)] * 5)
    assert reasons(pol)[4:] == ["stood_down"] * 4 + ["reprobe"]
    assert pol.prefill_cap(4) == 1024
    # The probe fails again -> second consecutive failure doubles the wait (backoff 2): 10 iterations.
    drv.run([(2000, 4)] * 3)
    assert reasons(pol)[-1] == "stand_down_infeasible"
    assert pol.backoff == 2.0
    drv.run([(2000, 4)] * 9)
    assert reasons(pol)[-1] == "stood_down"
    drv.step(2000, 4)
    assert reasons(pol)[-1] == "reprobe"


def test_still_infeasible_estimate_renews_stand_down_without_probing():
    pol = DLFPS(reference_iters=0, infeasible_after=100, reprobe_iters=3, infeasible_probe=False)
    drv = Driver(pol, HEAVY)
    drv.run(zip(PS[:8], DS[:8]))
    assert reasons(pol)[-1] == "stand_down_infeasible"
    drv.run([(2000, 4)] * 3)  # uncapped mixed iterations keep teaching the fit: still infeasible
    assert reasons(pol)[-3:] == ["stood_down", "stood_down", "stand_down_infeasible"]
    assert pol.prefill_cap(4) is None


def test_after_infeasible_stand_down_the_tail_decides_by_default():
    # infeasible_probe=True (default): the first infeasibility stands down at once, later probes
    # are not cut short by the target test; the decode-gap tail comparison decides.
    opts = dict(reference_iters=0, use_estimator=False, reprobe_iters=10, tail_min_samples=10, tail_check_every=5,
                tail_quantile=0.9)
    for stall_s, expect in ((0.860, "keeps"), (0.021, "stands_down")):
        pol = DLFPS(**opts)
        i = _feed(pol, 0, [(3000, 4, 0.611)] + [(2000, 4, 0.2106)] * 3)  # as above: infeasible at min_cap
        assert reasons(pol)[-1] == "stand_down_infeasible"
        # Stood down (uncapped): 7 decode-only 20 ms gaps and 3 uncapped stalls of stall_s.
        i = _feed(pol, i, [(0, 4, 0.020)] * 7 + [(8000, 4, stall_s)] * 3)
        assert reasons(pol)[-1] == "reprobe" and pol.prefill_cap(4) == 1024
        # Probe at min_cap: 10 capped samples, 7 x 20 ms and 3 chunks of 0.2106 s (over the target).
        i = _feed(pol, i, [(0, 4, 0.020)] * 7 + [(1024, 4, 0.2106)] * 3)
        # P90 (need 36 of 40 -> 9th sorted): capped 0.2106; uncapped 0.860 or 0.021.
        if expect == "keeps":
            assert pol.last_tail == (0.2106, 0.860)
            assert not reasons(pol)[-1].startswith("stand_down") and pol.prefill_cap(4) == 1024
        else:
            assert pol.last_tail == (0.2106, 0.021)
            assert reasons(pol)[-1] == "stand_down_tail" and pol.prefill_cap(4) is None


def _tail_policy(**kw) -> DLFPS:
    opts = dict(
        use_estimator=False,
        reference_iters=20,
        tail_quantile=0.9,
        tail_window=50,
        tail_min_samples=10,
        tail_check_every=5,
        reprobe_iters=20,
    )
    opts.update(kw)
    return DLFPS(**opts)


def _feed(pol: DLFPS, i0: int, items) -> int:
    """items: (prefill, decodes, device seconds); cap taken from the policy."""
    for p, d, t in items:
        cap = pol.prefill_cap(d)
        pol.observe(Observation(i0, i0 * 0.05, p if cap is None else min(p, cap), d, cap, device_time_s=t))
        i0 += 1
    return i0


def test_worse_tail_under_cap_stands_down_then_reprobes():
    pol = _tail_policy()
    assert pol.prefill_cap(2) is None  # reference phase: no cap
    # Reference (uncapped): 19 decode-only gaps of 20 ms and one 300 ms stall, 2 decodes each.
    # Token-weighted P90: 0.9*40 = 36 -> the 18th sorted sample -> 0.020 s.
    i = _feed(pol, 0, [(0, 2, 0.020)] * 19 + [(4000, 2, 0.300)])
    assert reasons(pol) == ["reference"] * 19 + ["reprobe"]
    assert pol.prefill_cap(2) == 3072
    # Capped: the one long prefill becomes three 90 ms chunks. With 7 decode-only gaps:
    # P90 of 10 samples (weight 2): need 18 -> sorted 7x0.020 (cum 14), 0.090 (16), 0.090 (18) -> 0.090.
    # 0.090 > 0.020 * 1.05 -> the cap made the tail worse -> stand down at the 10th capped sample.
    i = _feed(pol, i, [(0, 2, 0.020)] * 7 + [(3072, 2, 0.090)] * 3)
    assert reasons(pol)[-1] == "stand_down_tail"
    assert pol.last_tail == (0.090, 0.020)
    assert pol.prefill_cap(2) is None
    # Re-probe after reprobe_iters=20 decode-carrying iterations stood down.
    i = _feed(pol, i, [(0, 2, 0.020)] * 19)
    assert reasons(pol)[-1] == "stood_down"
    i = _feed(pol, i, [(0, 2, 0.020)])
    assert reasons(pol)[-1] == "reprobe"
    assert pol.prefill_cap(2) is not None


def test_better_tail_under_cap_keeps_capping():
    pol = _tail_policy()
    # Reference: 16 x 20 ms and 4 stalls of 300 ms -> P90 (need 36 of 40): 18th sample = 0.300 s.
    i = _feed(pol, 0, [(0, 2, 0.020)] * 16 + [(4000, 2, 0.300)] * 4)
    # Capped: same share of slow gaps, but 75 ms chunks -> P90 = 0.075 < 0.300: keep the cap.
    # First comparison at 10 capped samples: need 18 of 20 -> the 9th sorted sample = 0.075 s.
    i = _feed(pol, i, [(0, 2, 0.020)] * 8 + [(3072, 2, 0.075)] * 2)
    assert pol.last_tail == (0.075, 0.300)
    # 20 more decode-only gaps: at 30 samples the P90 (need 54 of 60, 27th sample) is 0.020 s.
    _feed(pol, i, [(0, 2, 0.020)] * 20)
    assert pol.last_tail == (0.020, 0.300)
    assert not any(r.startswith("stand_down") for r in reasons(pol))
    assert pol.prefill_cap(2) is not None


def test_feasibility_off_never_stands_down():
    pol = DLFPS(use_feasibility=False, infeasible_after=1)
    assert pol.prefill_cap(4) == 3072  # no reference phase without the feasibility part
    Driver(pol, HEAVY).run(zip(PS, DS))
    assert all(d.cap_after is not None for d in pol.decisions)
    assert pol.prefill_cap(4) == 1024  # the fit says infeasible; without the guard the cap pins at min_cap
    # Same data with the guard: stands down.
    on = DLFPS(reference_iters=0, infeasible_after=100)
    Driver(on, HEAVY).run(zip(PS, DS))
    assert on.prefill_cap(4) is None


# ---------------------------------------------------------------------------------------- TTFT guard
def test_ttft_guard_without_remaining_tokens():
    pol = DLFPS(reference_iters=0, ttft_slo_s=2.0, use_estimator=False)  # ttft_guard_frac 0.5
    assert pol.prefill_cap(4, oldest_waiting_s=0.5) == 3072  # 0.5 s < 0.5 * 2 s
    assert pol.prefill_cap(4, oldest_waiting_s=1.2) == 6144  # past half the SLO: max_cap
    assert pol.prefill_cap(4, oldest_waiting_s=2.5) == 3072  # already missed: no help
    assert pol.guard_grants == 1


def _trained(**kw) -> DLFPS:
    pol = DLFPS(reference_iters=0, ttft_slo_s=2.0, **kw)
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
    pol = DLFPS(reference_iters=0, ttft_slo_s=2.0, use_estimator=False)
    cap = pol.prefill_cap(4, oldest_waiting_s=1.5)
    assert cap == 6144
    pol.observe(Observation(0, 0.0, 6144, 4, cap, device_time_s=0.160))
    assert pol.decisions[-1].reason == "ttft_guard"
    assert pol.cap == 3072  # proportional law would have halved 6144 -> 3072 from 3072 -> 1536


def test_ttft_guard_off_or_without_slo_does_nothing():
    off = _trained(use_ttft_guard=False)
    assert off.prefill_cap(4, oldest_waiting_s=1.765, oldest_remaining_tokens=10_000) == 3456
    no_slo = DLFPS(reference_iters=0)
    assert no_slo.prefill_cap(4, oldest_waiting_s=100.0) == 3072


# ---------------------------------------------------------------------------------------- ablations
def test_estimator_off_stays_proportional():
    pol = DLFPS(reference_iters=0, use_estimator=False)
    Driver(pol, LINEAR).run(zip(PS, DS))
    assert set(reasons(pol)) == {"proportional"}
    assert pol.estimator.n == 0


def test_signal_choice_changes_the_interval_used():
    dev = DLFPS(reference_iters=0, use_estimator=False)
    host = DLFPS(reference_iters=0, use_estimator=False, signal="host_cadence")
    assert dev.signal == "device_completion"
    for pol in (dev, host):
        pol.observe(Observation(0, 0.0, 3072, 4, 3072, host_interval_s=0.160, device_time_s=0.040))
    assert dev.cap == 6144  # 3072 * 0.08 / 0.04 = 6144
    assert host.cap == 1536  # 3072 * 0.08 / 0.16 = 1536


def test_estimator_sample_selection():
    items = [(0, 3, 0.0103), (2000, 0, 0.05), (1000, 2, 0.0302)]  # decode-only, prefill-only, guarded
    counts = {}
    for mode in ("guarded", "prefill", "all"):
        pol = DLFPS(reference_iters=0, estimator_samples=mode)
        _feed(pol, 0, items)
        counts[mode] = pol.estimator.n
    assert counts == {"guarded": 1, "prefill": 2, "all": 3}


def test_reference_phase_runs_uncapped_then_caps():
    pol = DLFPS(reference_iters=3)
    _feed(pol, 0, [(0, 2, 0.02), (500, 0, 0.02), (0, 2, 0.02)])  # prefill-only does not count
    assert reasons(pol) == ["reference", "reference", "reference"]
    assert pol.prefill_cap(2) is None
    _feed(pol, 3, [(0, 2, 0.02)])
    assert reasons(pol)[-1] == "reprobe" and pol.prefill_cap(2) == 3072


# ---------------------------------------------------------------------------------------- plumbing
def test_weighted_quantile_hand_example():
    assert weighted_quantile([3.0, 1.0, 2.0], [1, 1, 2], 0.5) == 2.0  # cum 1 (1.0), 3 (2.0) >= 2
    assert weighted_quantile([3.0, 1.0, 2.0], [1, 1, 2], 0.25) == 1.0
    assert weighted_quantile([3.0, 1.0, 2.0], [1, 1, 2], 0.99) == 3.0
    with pytest.raises(ValueError):
        weighted_quantile([], [], 0.5)


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
        ({"reprobe_iters": 0}, "reprobe_iters"),
        ({"reprobe_backoff": 0.5}, "reprobe_backoff"),
    ],
)
def test_bad_options_are_named(opts, word):
    with pytest.raises(ValueError, match=word):
        DLFPS(**opts)


def test_guarded_iteration_without_signal_is_an_error():
    pol = DLFPS(reference_iters=0)
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
