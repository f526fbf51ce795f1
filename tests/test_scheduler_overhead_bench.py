"""benchmarks/bench_scheduler_overhead.py: its statistics and its workload, on hand-computed samples.

The benchmark itself is never run here (it times things; timing is not a test).
"""
import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("scipy")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_scheduler_overhead.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_scheduler_overhead", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


# Student t with 2 degrees of freedom has the closed-form quantile t_p = (2p - 1) / sqrt(2 p (1 - p));
# p = 0.975 gives 0.95 / sqrt(0.04875) = 4.3026527...
T975_DF2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)


def test_t_interval_of_one_two_three(bench):
    # mean 2, sample sd 1, standard error 1 / sqrt(3)
    m, lo, hi = bench.t_interval([1.0, 2.0, 3.0])
    half = T975_DF2 / math.sqrt(3)
    assert m == 2.0
    assert (lo, hi) == pytest.approx((2.0 - half, 2.0 + half), rel=1e-9)
    assert hi == pytest.approx(4.4841377, abs=1e-6)


def test_paired_overhead_is_the_interval_of_the_per_repetition_ratios(bench):
    # per-repetition overheads 0.10, 0.20, 0.30: mean 0.20, sd 0.10
    m, lo, hi = bench.paired_overhead([110.0, 240.0, 390.0], [100.0, 200.0, 300.0])
    half = T975_DF2 * 0.1 / math.sqrt(3)
    assert m == pytest.approx(0.2)
    assert (lo, hi) == pytest.approx((0.2 - half, 0.2 + half), rel=1e-9)


def test_verdict_needs_the_whole_interval_at_or_below_the_target(bench):
    assert bench.TARGET == 0.02
    assert bench.verdict(0.02) == "met"
    assert bench.verdict(0.0201) == "missed"


def test_statistics_refuse_what_they_cannot_compute(bench):
    with pytest.raises(ValueError, match="at least 2"):
        bench.t_interval([1.0])
    with pytest.raises(ValueError, match="unpaired"):
        bench.paired_overhead([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="level"):
        bench.t_interval([1.0, 2.0], level=1.0)


def test_workload_is_the_same_list_for_every_arm(bench):
    reqs = bench.workload(decodes=2, prompt=10, every=3, steps=7)
    assert [(r.step, r.request_id, r.prompt_tokens, r.max_tokens, r.first_token) for r in reqs] == [
        (0, "d0", 64, 20000, 0), (0, "d1", 64, 20000, 1),
        (0, "p0", 10, 4, 0), (3, "p1", 10, 4, 7), (6, "p2", 10, 4, 14),
    ]
    assert reqs == bench.workload(decodes=2, prompt=10, every=3, steps=7)
    with pytest.raises(ValueError, match="every"):
        bench.workload(decodes=2, prompt=10, every=0, steps=7)


def test_call_order_gives_every_arm_every_step_once_in_step_order(bench):
    import random

    arms = ("stock", "nocap", "dlfp")
    for interleave in ("step", "run"):
        order = bench.call_order(arms, 4, random.Random(3), interleave)
        assert sorted(order) == sorted((a, k) for a in arms for k in range(4))
        assert all([k for b, k in order if b == a] == [0, 1, 2, 3] for a in arms)
    lockstep = bench.call_order(arms, 4, random.Random(3), "step")
    assert [k for _, k in lockstep] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    runs = bench.call_order(arms, 4, random.Random(3), "run")
    assert [a for a, _ in runs] == [a for a in dict.fromkeys(a for a, _ in runs) for _ in range(4)]
    assert bench.call_order(arms, 4, random.Random(3), "step") == lockstep  # the seed fixes the order
    with pytest.raises(ValueError, match="interleave"):
        bench.call_order(arms, 4, random.Random(3), "arm")


def test_summarise_takes_the_mean_or_the_median_per_repetition(bench):
    calls = {"sched": [1000, 2000, 6000], "upd": [1000, 1000, 1000],
             "sched_cpu": [500, 500, 2000], "upd_cpu": [0, 0, 0], "tokens": []}
    timed = [{a: calls for a in ("stock", "nocap", "dlfp")}]
    total = bench.summarise(timed, "total")["stock"]
    assert (total["sched"], total["iter"]) == ([3000.0], [4000.0])
    median = bench.summarise(timed, "median")["nocap"]
    assert (median["sched"], median["iter"]) == ([2000], [3000])
    assert bench.summarise(timed, "total", "_cpu")["dlfp"]["sched"] == [1000.0]
