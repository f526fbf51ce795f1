"""The workload maps' wall time on this machine: every map of ``dlfp.studies.map.MAPS``, against the target of
all five maps in at most 10 minutes on 2 cores.

Two ways, both reported with their method:

* default, **sampled**: ``--sample`` tasks of each map, spread evenly over its task list (cell, seed and arm
  order, so every axis is covered), each run once on this process (``summarize_task``: one simulator trial, nothing
  written); the map's wall time on ``--jobs`` cores is estimated as mean seconds per task x tasks / jobs. An
  estimate: it assumes the workers scale perfectly and that the sample's mean is the map's.
* ``--full``: the maps really run (``run_map`` into a temporary folder, ``--jobs`` local processes) and the wall
  time is measured. All five maps took about 100 minutes on 2 idle cores of this 2-core machine at the last full
  run, so this is for a quiet machine with time to spare.

A benchmark, not a test: it exits 0 whether the target is met or not.

    .venv/bin/python benchmarks/bench_map.py [--sample 24] [--jobs 2] [--full] [MAP ...]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import report_target  # noqa: E402

#: The target of the compiled simulator core: all five workload maps in at most 10 minutes on 2 cores.
TARGET_S = 600.0


def sampled(spec, sample: int) -> tuple[int, float, int]:
    """Run ``sample`` tasks of ``spec`` spread evenly over its tasks; returns (tasks in the map, mean seconds per
    sampled task, tasks sampled)."""
    from dlfp.studies.map import summarize_task

    tasks = spec.tasks()
    n = min(max(1, sample), len(tasks))
    picked = [tasks[round(i * (len(tasks) - 1) / max(1, n - 1))] for i in range(n)] if n > 1 else tasks[:1]
    t0 = time.perf_counter()
    for task in picked:
        summarize_task(spec, task)
    return len(tasks), (time.perf_counter() - t0) / len(picked), len(picked)


def full(spec, jobs: int) -> tuple[int, float]:
    """Run the whole map into a temporary folder on ``jobs`` processes; returns (tasks, wall seconds)."""
    from dlfp.studies.map import run_map

    with tempfile.TemporaryDirectory(prefix="dlfp-bench-map-") as out:
        t0 = time.perf_counter()
        run_map(spec, out, jobs=jobs, progress=False)
        return len(spec.tasks()), time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    from dlfp.studies.map import MAPS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("maps", nargs="*", help=f"maps (default all: {', '.join(MAPS)})")
    ap.add_argument("--sample", type=int, default=24, help="tasks timed per map (sampled mode)")
    ap.add_argument("--jobs", type=int, default=2, help="cores the estimate (or the full run) uses")
    ap.add_argument("--full", action="store_true", help="run every map whole and measure its wall time")
    args = ap.parse_args(argv)
    names = args.maps or list(MAPS)
    unknown = [m for m in names if m not in MAPS]
    if unknown:
        print(f"bench_map: unknown map {unknown[0]!r}; maps: {', '.join(MAPS)}", file=sys.stderr)
        return 2
    total = 0.0
    for name in names:
        if args.full:
            n, wall = full(MAPS[name], args.jobs)
            print(f"{name}: {n} tasks, {wall:.0f} s wall on {args.jobs} processes (measured)")
        else:
            n, per, k = sampled(MAPS[name], args.sample)
            wall = per * n / args.jobs
            print(f"{name}: {n} tasks, {per * 1000:.0f} ms per task over {k} sampled, "
                  f"about {wall:.0f} s on {args.jobs} cores (estimated)")
        total += wall
    how = "measured" if args.full else f"estimated from {args.sample} tasks per map"
    scope = "all five workload maps" if len(names) == len(MAPS) else f"workload maps {', '.join(names)}"
    report_target(f"{scope}, {args.jobs} cores ({how})", f"{total / 60:.1f} min", f"<= {TARGET_S / 60:.0f} min",
                  total <= TARGET_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
