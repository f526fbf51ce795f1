"""Fresh simulator matrix: every arm (fixed-cap frontier arms included) of every experiment, every seed.

    .venv/bin/python benchmarks/bench_matrix.py [--jobs 2] [--experiments NAME ...]

Runs the matrix exactly as ``dlfp run-all --backend sim`` runs its trials (``dlfp.pipeline.verify.verify_trials``
over one process pool), into an empty temporary traces directory, so every trial is simulated and written
(Parquet + metadata) from scratch and nothing in ``data/`` is touched. Prints the wall time against the target
(at most 90 s on 2 cores), the trial count, and the slowest experiments by summed trial CPU time. A benchmark,
not a test: it never fails on time.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 90.0


def main(argv: list[str] | None = None) -> None:
    from dlfp.pipeline.plan import check_backend_config, default_matrix, prepare_config, select_arms, select_seeds
    from dlfp.pipeline.verify import verify_trials

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPU count)")
    ap.add_argument("--experiments", nargs="+", help="subset (default: the simulator's matrix)")
    args = ap.parse_args(argv)
    names = args.experiments or default_matrix("sim")
    plans = []
    for n in names:
        cfg = prepare_config(n, "sim", frontier=None)
        check_backend_config(cfg, "sim")
        plans.append((cfg, select_arms(cfg, None), select_seeds(cfg, None)))
    trials = sum(len(a) * len(s) for _, a, s in plans)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dlfp-bench-matrix-") as tmp:
        t0, c0 = time.perf_counter(), os.times()
        ver = verify_trials(plans, "sim", Path(tmp), args.jobs, progress=False)
        wall, c1 = time.perf_counter() - t0, os.times()
    cpu = (c1.children_user + c1.children_system) - (c0.children_user + c0.children_system)
    status = "met" if wall <= TARGET_S else "missed"
    print(f"fresh simulator matrix: {trials} trials of {len(names)} experiments ({ver.added} written) on "
          f"{args.jobs} worker processes")
    print(f"  wall {wall:.1f} s (target <= {TARGET_S:.0f} s on 2 cores: {status}); worker CPU {cpu:.1f} s, "
          f"{cpu / max(trials, 1):.3f} s per trial")
    print(f"target | fresh simulator matrix, {trials} trials, {args.jobs} workers | {wall:.1f} s | "
          f"<= {TARGET_S:.0f} s | {status}")
    print(f"  1-min load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
          f"on {os.cpu_count()} cores (wall times inflate when the machine is shared)")


if __name__ == "__main__":
    main(sys.argv[1:])
