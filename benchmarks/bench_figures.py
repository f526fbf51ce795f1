"""Benchmark: `dlfp figures` from cached traces (target: at most 60 s on this machine).

Times the real command (papermill + kernel start-up included) as a subprocess,
then, with ``--breakdown``, the stages in-process (load + summaries, tables,
each figure). Writes into a temporary results directory unless ``--results``
is given, so the committed ``data/results/`` is not touched. A benchmark, not a
test: it prints numbers and never fails on time.

Usage::

    python benchmarks/bench_figures.py [--traces data/traces] [--results DIR] [--repeat 1] [--breakdown]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 60.0  # the artifact's time budget: `make figures` from cache in at most 60 s


def _trial_count(traces: Path) -> int:
    from dlfp.traces.format import find_trials

    return len(find_trials(traces))


def _du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def breakdown(traces: Path, results: Path) -> None:
    """Time each stage of figures.ipynb in this process (no kernel)."""
    import matplotlib

    matplotlib.use("Agg")
    from dlfp.analysis import figures, tables
    from dlfp import pipeline

    def timed(label, fn):
        t = time.perf_counter()
        out = fn()
        print(f"  {label:38s} {time.perf_counter() - t:7.2f} s")
        return out

    ts = timed("load + per-trial summaries", lambda: tables.load_traces(traces))
    timed("headline tables", lambda: (tables.headline_per_seed(ts), tables.headline(ts)))
    if pipeline.default_published_csv().exists():
        timed("published vs reproduced", lambda: tables.published_vs_reproduced(ts, pipeline.default_published_csv()))
    timed("figure: ITL CDF", lambda: figures.save(figures.itl_cdf_figure(ts), results, "itl_cdf"))
    timed(f"figures: cap trajectory x {len(ts.groups())}",
          lambda: [figures.save(figures.cap_trajectory_figure(ts, b, e), results, f"cap_trajectory_{b}_{e}")
                   for b, e in ts.groups()])
    timed("root cause (table + figure)", lambda: (tables.root_cause(ts),
                                                  figures.save(figures.root_cause_figure(ts), results, "root_cause")))
    timed("figure: trade-off", lambda: figures.save(figures.tradeoff_figure(ts), results, "tradeoff"))
    timed("figure: frontier", lambda: figures.save(figures.frontier_figure(ts), results, "frontier"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default=None, help="traces root (default data/traces)")
    ap.add_argument("--results", default=None, help="results directory (default: a temporary directory)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--breakdown", action="store_true", help="also time each stage in-process")
    args = ap.parse_args()

    from dlfp import pipeline

    traces = Path(args.traces) if args.traces else pipeline.default_traces_dir()
    if not traces.is_dir() or _trial_count(traces) == 0:
        print(f"bench_figures: no cached traces under {traces}; run `dlfp run-all` (or `make run-all`) first",
              file=sys.stderr)
        return 2
    tmp = None
    if args.results:
        results = Path(args.results)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="bench-figures-"))
        results = tmp / "results"
    exe = shutil.which("dlfp") or str(Path(sys.executable).with_name("dlfp"))
    print(f"traces: {traces} ({_trial_count(traces)} trials, {_du_mb(traces):.1f} MB); cores: {os.cpu_count()}; "
          f"load average: {os.getloadavg()[0]:.2f}")
    times = []
    try:
        for i in range(args.repeat):
            t = time.perf_counter()
            r = subprocess.run([exe, "figures", "--traces", str(traces), "--out", str(results)],
                               capture_output=True, text=True)
            dt = time.perf_counter() - t
            if r.returncode != 0:
                print(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}",
                      file=sys.stderr)
                return r.returncode
            times.append(dt)
            print(f"run {i + 1}: dlfp figures {dt:.1f} s")
        best = min(times)
        print(f"dlfp figures from cache: best {best:.1f} s of {len(times)} (target <= {TARGET_S:.0f} s: "
              f"{'met' if best <= TARGET_S else 'NOT met'}); results {_du_mb(results):.1f} MB")
        if args.breakdown:
            print("in-process breakdown:")
            breakdown(traces, results)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
