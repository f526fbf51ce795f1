"""Speed benchmark of the simulator backend (issue 3). Not a test: prints figures, asserts nothing.

    .venv/bin/python benchmarks/bench_sim.py [experiment]   # default qwen3-0.6b-tp1

Measures, on one core: one paired trial (baseline + dlfp arms, one seed, workload built once per arm as
``run_trial`` does), a full 3-seed paired experiment, and peak memory (ru_maxrss of this process and the
tracemalloc peak of one paired trial). Targets: <= 1 s per paired trial, <= 5 s per 3-seed experiment,
< 500 MB. Also prints the paired P99 ITL change per seed (paper, qwen3-0.6b-tp1: mean -27.7 %).
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import resource
import sys
import time
import tracemalloc

from dlfp.analysis import metrics
from dlfp.config import load_experiment
from dlfp.backends.sim import runner as sim

TARGET_PAIR_S, TARGET_EXP_S, TARGET_MB = 1.0, 5.0, 500.0


def paired(cfg, seed):
    out = {}
    for arm in (cfg.baseline_arm, *[a for a in cfg.arms if a != cfg.baseline_arm]):
        out[arm] = sim.run_trial(cfg, arm, seed)
    return out


def main(name: str = "qwen3-0.6b-tp1") -> None:
    cfg = load_experiment(name)
    paired(cfg, cfg.seeds[0])  # warm imports and caches (workload quantile table, yaml)
    t0, c0 = time.perf_counter(), time.process_time()
    trials = paired(cfg, cfg.seeds[0])
    pair_s, pair_cpu = time.perf_counter() - t0, time.process_time() - c0
    iters = {a: len(t.iterations) for a, t in trials.items()}
    t0, c0 = time.perf_counter(), time.process_time()
    results = {s: paired(cfg, s) for s in cfg.seeds}
    exp_s, exp_cpu = time.perf_counter() - t0, time.process_time() - c0
    load = os.getloadavg()[0]
    tracemalloc.start()
    paired(cfg, cfg.seeds[0])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"experiment {name}: {cfg.workload.num_requests} measured + {cfg.workload.num_warmup} warm-up requests, "
          f"scheduling={cfg.scheduling}")
    print(f"iterations per arm (seed {cfg.seeds[0]}): {iters}")
    print(f"one paired trial:       {pair_s:.3f} s wall, {pair_cpu:.3f} s CPU   (target <= {TARGET_PAIR_S} s)")
    print(f"3-seed paired exp.:     {exp_s:.3f} s wall, {exp_cpu:.3f} s CPU   (target <= {TARGET_EXP_S} s)")
    print(f"1-min load average {load:.1f} on {os.cpu_count()} cores (wall times inflate when the machine is shared)")
    print(f"peak memory: ru_maxrss {rss_mb:.0f} MB, tracemalloc peak of one paired trial {peak / 2**20:.1f} MB "
          f"(target < {TARGET_MB} MB)")
    base = cfg.baseline_arm
    for arm in cfg.arms:
        if arm == base:
            continue
        ch = []
        for s, tr in results.items():
            b = metrics.percentile(metrics.itl_samples(tr[base]), 99)
            c = metrics.percentile(metrics.itl_samples(tr[arm]), 99)
            ch.append((c - b) / b * 100)
            print(f"seed {s}: P99 ITL {base} {b * 1e3:.2f} ms -> {arm} {c * 1e3:.2f} ms ({ch[-1]:+.1f} %)")
        print(f"mean P99 ITL change {arm} vs {base}: {sum(ch) / len(ch):+.1f} %")
    missed = pair_s > TARGET_PAIR_S or exp_s > TARGET_EXP_S or rss_mb > TARGET_MB
    if missed:
        pr = cProfile.Profile()
        pr.enable()
        paired(cfg, cfg.seeds[0])
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(8)
        print("TARGET MISSED; what dominates one paired trial (cProfile, by own time):")
        print("\n".join(s.getvalue().splitlines()[:30]))


if __name__ == "__main__":
    main(*sys.argv[1:])
