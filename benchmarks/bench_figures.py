"""Benchmark: `dlfp figures` from cached traces (target: at most 15 s on this machine).

Times the real command (papermill + kernel start-up included) as a subprocess, in a scratch copy of the
repository's data (``notebooks/``, ``data/traces``, ``data/paper``, ``data/results`` with its render stamp) under
``$DLFP_ROOT``, so the committed ``data/results/`` is not touched:

1. a first run, which renders when the copied outputs are not fresh (no stamp, or a stamp of other code or
   traces) and writes the stamp;
2. the cached run: outputs fresh, nothing rendered again. Its time is the target figure (``make figures`` on a
   checkout whose results are those of its traces);
3. a forced full render (``dlfp figures --force``; the per-trial digest cache warm), for information
   (``--no-full`` skips it).

With ``--breakdown`` the stages are also timed in-process (load + summaries, tables, each figure), the figures
one after another in this one process. A benchmark, not a test: it prints numbers and never fails on time.

Usage::

    python benchmarks/bench_figures.py [--repeat 1] [--no-full] [--breakdown]
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

from common import REPO, cached_runs, report_target, scratch_copy

TARGET_S = 15.0  # the artifact's time budget: `make figures` from cache in at most 15 s


def _trial_count(traces: Path) -> int:
    from dlfp.traces.format import find_trials

    return len(find_trials(traces))


def _du_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def timed_figures(exe: str, root: Path, *extra: str) -> tuple[float, int, str]:
    """``dlfp figures`` under ``$DLFP_ROOT=root``: (wall seconds, exit status, its last line)."""
    t = time.perf_counter()
    r = subprocess.run([exe, "figures", *extra], capture_output=True, text=True, cwd=root,
                       env=dict(os.environ, DLFP_ROOT=str(root)))
    dt = time.perf_counter() - t
    lines = (r.stdout.strip() if r.returncode == 0 else r.stderr.strip()).splitlines()
    return dt, r.returncode, lines[-1] if lines else f"exit {r.returncode}"


def breakdown(traces: Path, results: Path) -> None:
    """Time each stage of figures.ipynb in this process (no kernel, no worker processes)."""
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
    ap.add_argument("--repeat", type=int, default=1, help="cached runs to time (best is reported)")
    ap.add_argument("--no-full", action="store_true", help="skip the forced full render")
    ap.add_argument("--breakdown", action="store_true", help="also time each stage in-process")
    args = ap.parse_args()

    traces = REPO / "data" / "traces"
    if not traces.is_dir() or _trial_count(traces) == 0:
        print(f"bench_figures: no cached traces under {traces}; run `dlfp run-all` (or `make run-all`) first",
              file=sys.stderr)
        return 2
    exe = shutil.which("dlfp") or str(Path(sys.executable).with_name("dlfp"))
    tmp = Path(tempfile.mkdtemp(prefix="bench-figures-"))
    root = scratch_copy(tmp / "repo")
    print(f"traces: {traces} ({_trial_count(traces)} trials, {_du_mb(traces):.1f} MB); cores: {os.cpu_count()}; "
          f"load average: {os.getloadavg()[0]:.2f}")
    try:
        rc, times = cached_runs(lambda: timed_figures(exe, root), args.repeat, "dlfp figures",
                                "renders when the copied outputs are not fresh")
        if rc != 0:
            return rc
        best = min(times)
        print(f"dlfp figures from cache: best {best:.1f} s of {len(times)} (target <= {TARGET_S:.0f} s: "
              f"{'met' if best <= TARGET_S else 'NOT met'}); load average {os.getloadavg()[0]:.2f}")
        report_target("dlfp figures, outputs fresh (s)", f"{best:.1f}", f"<= {TARGET_S:.0f}", best <= TARGET_S)
        if not args.no_full:
            dt, rc, last = timed_figures(exe, root, "--force")
            print(f"forced full render (digest cache warm): dlfp figures --force {dt:.1f} s; results "
                  f"{_du_mb(root / 'data' / 'results'):.1f} MB; load average {os.getloadavg()[0]:.2f}")
        if args.breakdown:
            print("in-process breakdown:")
            breakdown(traces, tmp / "breakdown")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
