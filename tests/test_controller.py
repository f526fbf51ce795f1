"""DLFP controller and baseline policies: trajectories computed by hand from the paper's law.

Law (paper defaults: target 80 ms, initial cap 3072, clamp [1024, 6144], quantum 128, gain 1):
    cap <- clamp(Q(cap * (1 + gain * (target / observed - 1))))
"""

import numpy as np
import pytest

from dlfp.policies.base import SIGNALS, Observation, Policy, decisions_frame, quantize
from dlfp.policies.baselines import FixedCap, NoCap
from dlfp.policies.dlfp import DLFP


def guarded(i, interval, cap, *, prefill=512, decodes=4, device=None):
    return Observation(iteration=i, time_s=float(i), prefill_tokens=prefill, num_decodes=decodes, cap=cap,
                       host_interval_s=interval, device_time_s=device)


def run(policy, intervals):
    """Feed guarded cycles with the given host intervals; return the cap after each."""
    caps = []
    for i, iv in enumerate(intervals):
        cap = policy.prefill_cap(4)
        policy.observe(guarded(i, iv, cap))
        caps.append(policy.cap)
    return caps


def test_paper_defaults():
    c = DLFP()
    assert (c.target_s, c.initial_cap, c.min_cap, c.max_cap, c.quantum, c.gain) == (0.080, 3072, 1024, 6144, 128, 1.0)
    assert c.prefill_cap(1) == 3072
    assert isinstance(c, Policy)


def test_trajectory_hand_computed():
    # 3072 * 0.08/0.16 = 1536 (exact multiple of 128)
    # 1536 * 0.08/0.04 = 3072
    # 3072 * 0.08/0.04 = 6144 (= max)
    # 6144 * 0.08/0.04 = 12288 -> clamped to 6144
    # 6144 * 0.08/0.09 = 5461.33 -> 5461.33/128 = 42.67 -> 43*128 = 5504
    # 5504 * 0.08/0.5 = 880.64 -> 7*128 = 896 -> clamped to 1024
    # 1024 * 0.08/0.1 = 819.2 -> 6*128 = 768 -> clamped to 1024
    # 1024 * 0.08/0.08 = 1024 (on target: unchanged)
    assert run(DLFP(), [0.16, 0.04, 0.04, 0.04, 0.09, 0.5, 0.1, 0.08]) == [
        1536, 3072, 6144, 6144, 5504, 1024, 1024, 1024]


def test_quantisation_to_nearest_128():
    # 3072 * 0.08/0.09 = 2730.67 -> 21.33 quanta -> 21 * 128 = 2688
    assert run(DLFP(), [0.09]) == [2688]
    # 3072 * 0.08/0.1 = 2457.6 -> 19.2 quanta -> 19 * 128 = 2432
    assert run(DLFP(), [0.1]) == [2432]
    # 3072 * 0.08/0.07 = 3510.86 -> 27.43 quanta -> 27 * 128 = 3456
    assert run(DLFP(), [0.07]) == [3456]
    # The rounding itself: halves round up.
    assert quantize(2496, 128) == 2560  # 19.5 quanta -> 20
    assert quantize(2495.9, 128) == 2432
    assert quantize(63.9, 128) == 0


def test_gain_half():
    # gain 0.5: 3072 * (1 + 0.5*(0.08/0.16 - 1)) = 3072 * 0.75 = 2304
    # then 2304 * (1 + 0.5*(0.08/0.04 - 1)) = 2304 * 1.5 = 3456
    assert run(DLFP(gain=0.5), [0.16, 0.04]) == [2304, 3456]


def test_custom_clamp_and_target():
    c = DLFP(target_s=0.05, initial_cap=2048, min_cap=512, max_cap=4096)
    # 2048 * 0.05/0.2 = 512 (= min); 512 * 0.05/0.01 = 2560; 2560 * 5 = 12800 -> 4096
    assert run(c, [0.2, 0.01, 0.01]) == [512, 2560, 4096]


def test_no_cap_without_decodes():
    c = DLFP()
    assert c.prefill_cap(0) is None
    assert c.prefill_cap(1) == 3072
    run(c, [0.16])
    assert c.prefill_cap(0) is None
    assert c.prefill_cap(7) == 1536


@pytest.mark.parametrize(
    "obs",
    [
        Observation(0, 0.0, prefill_tokens=2048, num_decodes=3, cap=None, host_interval_s=0.5),  # no cap
        Observation(0, 0.0, prefill_tokens=0, num_decodes=3, cap=3072, host_interval_s=0.5),  # no prefill
        Observation(0, 0.0, prefill_tokens=2048, num_decodes=0, cap=3072, host_interval_s=0.5),  # no decode
        Observation(0, 0.0, prefill_tokens=0, num_decodes=0, cap=None, host_interval_s=None),  # idle
        Observation(0, 0.0, prefill_tokens=4096, num_decodes=0, cap=None, host_interval_s=float("nan")),
    ],
)
def test_unguarded_cycles_never_move_the_cap(obs):
    c = DLFP()
    assert obs.guarded is False
    c.observe(obs)
    assert c.cap == 3072
    d = c.decisions[-1]
    assert (d.cap_before, d.cap_after, d.guarded, d.reason) == (3072, 3072, False, "unguarded")


def test_unguarded_between_guarded():
    c = DLFP()
    c.observe(guarded(0, 0.16, 3072))  # -> 1536
    c.observe(Observation(1, 1.0, prefill_tokens=0, num_decodes=5, cap=1536, host_interval_s=0.01))
    c.observe(Observation(2, 2.0, prefill_tokens=4000, num_decodes=0, cap=None, host_interval_s=0.9))
    assert c.cap == 1536
    c.observe(guarded(3, 0.04, 1536))  # -> 3072
    assert [d.cap_after for d in c.decisions] == [1536, 1536, 1536, 3072]
    assert [d.guarded for d in c.decisions] == [True, False, False, True]


def test_decision_log_records_everything():
    c = DLFP()
    c.observe(guarded(5, 0.16, 3072, prefill=1000, decodes=3, device=0.07))
    d = c.decisions[0]
    assert (d.iteration, d.time_s, d.cap_before, d.cap_after) == (5, 5.0, 3072, 1536)
    assert (d.interval_s, d.source, d.prefill_tokens, d.num_decodes) == (0.16, "host_cadence", 1000, 3)
    df = decisions_frame(c)
    assert df.loc[0, "cap_after"] == 1536 and len(df) == 1


def test_device_completion_signal_uses_device_time():
    c = DLFP(signal="device_completion")
    # host 0.04 would double the cap; device 0.16 halves it.
    c.observe(guarded(0, 0.04, 3072, device=0.16))
    assert c.cap == 1536
    assert c.decisions[0].interval_s == 0.16 and c.decisions[0].source == "device_completion"
    with pytest.raises(ValueError, match="device_completion"):
        c.observe(guarded(1, 0.04, 1536, device=None))


@pytest.mark.parametrize("bad", [float("nan"), 0.0, -0.05, float("inf")])
def test_bad_interval_raises_naming_value(bad):
    c = DLFP()
    with pytest.raises(ValueError, match="observed interval"):
        c.observe(guarded(0, bad, 3072))
    assert c.cap == 3072
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(").replace(")", r"\)")):
        c.next_cap(3072, bad)


def test_missing_interval_on_guarded_cycle():
    with pytest.raises(ValueError, match="host_cadence"):
        DLFP().observe(guarded(0, None, 3072))


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(min_cap=4096, max_cap=2048, initial_cap=3072), "min_cap=4096 is larger than max_cap=2048"),
        (dict(initial_cap=3000), "initial_cap=3000 is not a multiple of the quantum 128"),
        (dict(min_cap=1000), "min_cap=1000 is not a multiple"),
        (dict(max_cap=6100), "max_cap=6100 is not a multiple"),
        (dict(initial_cap=7168), "initial_cap=7168 is outside"),
        (dict(target_s=0.0), "target_s"),
        (dict(target_s=float("nan")), "target_s"),
        (dict(gain=0.0), "gain"),
        (dict(quantum=0), "quantum"),
        (dict(signal="gpu"), "unknown signal 'gpu'"),
    ],
)
def test_constructor_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        DLFP(**kw)


def test_numpy_integers_accepted():
    # Backends often count with numpy; np.int64 is an integer.
    c = DLFP(initial_cap=np.int64(2048))
    assert c.prefill_cap(np.int64(2)) == 2048
    assert FixedCap(np.int64(512)).prefill_cap(np.int64(1)) == 512


def test_negative_num_decoding_rejected():
    for p in (DLFP(), NoCap(), FixedCap(1024)):
        with pytest.raises(ValueError, match="num_decoding"):
            p.prefill_cap(-1)


def test_nocap():
    p = NoCap()
    assert p.prefill_cap(0) is None and p.prefill_cap(10) is None
    p.observe(guarded(0, 0.5, None))
    assert p.decisions[0].cap_after is None and p.decisions[0].reason == "nocap"


def test_fixedcap():
    p = FixedCap(2048)
    assert p.prefill_cap(0) is None
    assert p.prefill_cap(3) == 2048
    p.observe(guarded(0, 0.5, 2048))
    assert p.prefill_cap(3) == 2048
    assert (p.decisions[0].cap_before, p.decisions[0].cap_after) == (2048, 2048)
    for bad in (0, -128, 1.5, True):
        with pytest.raises(ValueError, match="fixed cap"):
            FixedCap(bad)


def test_signals_and_interval_lookup():
    o = guarded(0, 0.1, 3072, device=0.05)
    assert SIGNALS == ("host_cadence", "device_completion")
    assert o.interval("host_cadence") == 0.1 and o.interval("device_completion") == 0.05
    with pytest.raises(ValueError, match="unknown signal"):
        o.interval("wallclock")
