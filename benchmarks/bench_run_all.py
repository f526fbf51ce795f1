"""Benchmark: `dlfp run-all` with every trial cached and fresh (target: at most 30 s on this machine).

Times the real command (``dlfp run-all --backend auto``, the simulator without a GPU) as a subprocess, in a
scratch copy of the repository's data (``notebooks/``, ``data/traces``, ``data/paper``, ``data/results``, with
their verification record and render stamps) under ``$DLFP_ROOT``, so the checkout is not touched:

1. a first run, which reruns and re-renders whatever is not fresh in the copy (every trial, about 6 minutes,
   when the committed verification record is not of this code) and writes the record and the stamps;
2. the cached run: every trial verified by this code and every output fresh. Its time is the target figure.

``--in-place`` times ``dlfp run-all`` in the checkout itself instead (what ``make run-all`` does; it writes the
record and stamps there when they are stale). A benchmark, not a test: it prints numbers and never fails on time.

Usage::

    python benchmarks/bench_run_all.py [--repeat 1] [--in-place] [--keep]
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

TARGET_S = 30.0  # `make run-all` with every trial cached and fresh in at most 30 s


def timed_run(exe: str, root: Path | None) -> tuple[float, int, str]:
    """``dlfp run-all --backend auto --no-progress`` under ``root`` (``None``: the checkout); (s, status, last line)."""
    env = dict(os.environ)
    if root is not None:
        env["DLFP_ROOT"] = str(root)
    t = time.perf_counter()
    r = subprocess.run([exe, "run-all", "--backend", "auto", "--no-progress"], capture_output=True, text=True,
                       env=env, cwd=root or REPO)
    dt = time.perf_counter() - t
    lines = (r.stdout.strip() or r.stderr.strip()).splitlines()
    notes = [ln for ln in r.stderr.splitlines() if ln.startswith("dlfp run-all:")]
    for ln in notes:
        print(f"    {ln}")
    return dt, r.returncode, lines[-1] if lines else f"exit {r.returncode}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="cached runs to time (best is reported)")
    ap.add_argument("--in-place", action="store_true", help="time run-all in the checkout, not in a scratch copy")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    args = ap.parse_args()
    exe = shutil.which("dlfp") or str(Path(sys.executable).with_name("dlfp"))
    tmp = None if args.in_place else Path(tempfile.mkdtemp(prefix="bench-run-all-"))
    root = None if tmp is None else scratch_copy(tmp / "repo")
    print(f"run-all in {'the checkout' if root is None else root}; cores: {os.cpu_count()}; "
          f"load average: {os.getloadavg()[0]:.2f}")
    try:
        rc, times = cached_runs(lambda: timed_run(exe, root), args.repeat, "dlfp run-all",
                                "reruns and renders what is not fresh")
        if rc != 0:
            return rc
        best = min(times)
        print(f"dlfp run-all, every trial cached and fresh: best {best:.1f} s of {len(times)} (target <= "
              f"{TARGET_S:.0f} s: {'met' if best <= TARGET_S else 'NOT met'}); load average "
              f"{os.getloadavg()[0]:.2f}")
        report_target("dlfp run-all, cached and fresh (s)", f"{best:.1f}", f"<= {TARGET_S:.0f}", best <= TARGET_S)
    finally:
        if tmp is not None and not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp is not None:
            print(f"scratch copy kept: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
