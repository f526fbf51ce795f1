"""Speed of the simulator backend on one core. Not a test: prints figures with their targets, asserts nothing.

    .venv/bin/python benchmarks/bench_sim.py [--repeats 5] [--quick] [--no-scale]

Every figure is process CPU time of ``dlfp.backends.sim.runner.run_trial`` (workload generation, engine loop, trace
frames; not the Parquet write), with this process pinned to one core where the OS allows it:

1. **One arm-trial** of ``qwen3-0.6b-tp1`` (seed 801, about 8k iterations and 100 s of serving), for EVERY arm of
   the experiment (the fixed-cap frontier arms included), best of ``--repeats``. Target: at most 0.05 s each,
   i.e. at least 2,000x real time (serving span / CPU time).
2. **Per-iteration cost** across every experiment of the simulator's matrix, every arm, seed 801, best of 3:
   the median over arms of CPU time per executed iteration. Target: at most 6 us.
3. **Runtime by scale** (``--no-scale`` skips it): the baseline arm of ``qwen3-0.6b-tp1`` with 100, 1,000 and
   10,000 measured requests at the experiment's rate, and with the request rate raised so that more requests
   decode at once; prints CPU time, iterations, us per iteration, mean decodes per iteration, and the growth
   order (least-squares slope of log time on log requests, and of us per iteration on mean decodes).

``--quick`` uses one repeat and three experiments (a smoke run of this script).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

from common import report_target

TARGET_TRIAL_S = 0.05
TARGET_ITER_US = 6.0
SCALE_REQUESTS = (100, 1_000, 10_000)
SCALE_RATES = (0.5, 1.0, 2.0, 4.0, 8.0)


def pin_one_core() -> str:
    """Pin this process to one CPU (Linux); returns a description of what was done."""
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    return "not pinned (no sched_setaffinity on this OS)"


def best_trial(cfg, arm: str, seed: int, repeats: int):
    """``(best CPU seconds, trial)`` of ``repeats`` runs of one arm-trial (one untimed warm-up run first)."""
    from dlfp.backends.sim import runner as sim

    trial = sim.run_trial(cfg, arm, seed)
    best = math.inf
    for _ in range(repeats):
        c0 = time.process_time()
        trial = sim.run_trial(cfg, arm, seed)
        best = min(best, time.process_time() - c0)
    return best, trial


def serving_span_s(trial) -> float:
    """Seconds from the first arrival to the last token of a trial (the simulated serving time)."""
    return float(trial.tokens["time_s"].max() - trial.requests["arrival_s"].min())


def arm_trials(repeats: int) -> None:
    from dlfp.pipeline.plan import prepare_config

    cfg = prepare_config("qwen3-0.6b-tp1", "sim", frontier=None)
    print(f"1. one arm-trial of {cfg.name} (seed 801, best of {repeats}; target <= {TARGET_TRIAL_S} s, "
          f">= {1 / TARGET_TRIAL_S * 100:.0f}x real time per 100 s)")
    worst = 0.0
    for arm in cfg.arms:
        s, tr = best_trial(cfg, arm, 801, repeats)
        worst = max(worst, s)
        n = len(tr.iterations)
        print(f"   {arm:22s} {s:6.3f} s  {n:5d} iterations  {s / n * 1e6:6.1f} us/iteration  "
              f"{serving_span_s(tr) / s:7.0f}x real time  {'met' if s <= TARGET_TRIAL_S else 'missed'}")
    report_target("sim, one arm-trial of qwen3-0.6b-tp1, slowest arm (one core, best of "
                  f"{repeats})", f"{worst:.3f} s", f"<= {TARGET_TRIAL_S} s", worst <= TARGET_TRIAL_S)


def per_iteration(repeats: int, experiments: list[str]) -> None:
    from dlfp.pipeline.plan import prepare_config

    print(f"2. per-iteration cost, every arm of {len(experiments)} experiments (seed 801, best of {repeats}; "
          f"target: median <= {TARGET_ITER_US} us)")
    all_us = []
    for name in experiments:
        cfg = prepare_config(name, "sim", frontier=None)
        seed = cfg.seeds[0]
        us = []
        for arm in cfg.arms:
            s, tr = best_trial(cfg, arm, seed, repeats)
            us.append(s / max(len(tr.iterations), 1) * 1e6)
        all_us += us
        print(f"   {name:32s} {len(us):2d} arms  median {statistics.median(us):6.1f} us  "
              f"min {min(us):6.1f}  max {max(us):6.1f}")
    med = statistics.median(all_us)
    report_target(f"sim, per-iteration cost, median over {len(all_us)} arm-trials of {len(experiments)} experiments",
                  f"{med:.1f} us", f"<= {TARGET_ITER_US} us", med <= TARGET_ITER_US)


def _slope(xs, ys) -> float:
    """Least-squares slope of ys on xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def scale() -> None:
    from dlfp.pipeline.plan import prepare_config

    print("3. runtime by scale, baseline arm of qwen3-0.6b-tp1 (one run each)")
    rows = []
    for n in SCALE_REQUESTS:
        cfg = prepare_config("qwen3-0.6b-tp1", "sim", overrides={"workload.num_requests": n})
        s, tr = best_trial(cfg, cfg.baseline_arm, 801, 1)
        it = tr.iterations
        rows.append((n, s, len(it)))
        print(f"   {n:6d} requests: {s:7.2f} s CPU  {len(it):7d} iterations  {s / len(it) * 1e6:5.1f} us/iteration"
              f"  mean decodes/iteration {it['num_decodes'].mean():5.1f}")
    k = _slope([math.log(n) for n, _, _ in rows], [math.log(s) for _, s, _ in rows])
    print(f"   growth: CPU time ~ requests^{k:.2f} (1.00 = linear)")
    pts = []
    for rate in SCALE_RATES:
        cfg = prepare_config("qwen3-0.6b-tp1", "sim", overrides={"workload.rate": rate})
        s, tr = best_trial(cfg, cfg.baseline_arm, 801, 1)
        it = tr.iterations
        d, us = float(it["num_decodes"].mean()), s / len(it) * 1e6
        pts.append((d, us))
        print(f"   rate {rate:4.1f} req/s: mean decodes/iteration {d:6.1f}  {len(it):6d} iterations  "
              f"{us:5.1f} us/iteration")
    b = _slope([d for d, _ in pts], [u for _, u in pts])
    print(f"   growth: us per iteration ~ {pts[0][1] - b * pts[0][0]:.1f} + {b:.3f} x decodes (least squares; the "
          f"scheduler visits every running request each iteration; at high rates few iterations carry the fixed "
          f"per-trial cost of building the trace frames, about 25 ms)")


def main(argv: list[str] | None = None) -> None:
    from dlfp.pipeline.plan import default_matrix

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one repeat, three experiments")
    ap.add_argument("--no-scale", action="store_true", help="skip the runtime-by-scale part")
    args = ap.parse_args(argv)
    print(f"simulator speed, {pin_one_core()}; 1-min load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores (CPU times inflate a little when the machine is shared)")
    reps = 1 if args.quick else args.repeats
    arm_trials(reps)
    names = default_matrix("sim")
    per_iteration(1 if args.quick else 3, names[:3] if args.quick else names)
    if not args.no_scale:
        scale()
    print(f"1-min load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
