"""Per-iteration cost of the simulator's engine loop (not a test: prints figures, asserts nothing).

    .venv/bin/python benchmarks/bench_engine.py [--repeats 7]

Times ``SimEngine.run`` alone (workload and device model built once) on qwen3-0.6b-tp1 seed 801 with the
per-part roofline device model, so that the loop itself is compared across versions of the code (the script
also runs against the layout before the package was reorganised: ``PYTHONPATH=<old checkout>/artifact``).
Reports process CPU time per iteration, best of ``--repeats`` runs, for the baseline and DLFP arms, and the
number of Python function calls per iteration (cProfile: deterministic, independent of machine load).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

from dlfp.config import build_policy, load_experiment

try:
    from dlfp.backends.sim import SimEngine
    from dlfp.backends.sim import runner as sim
    from dlfp.devices import roofline as cm
except ImportError:  # the layout before the reorganisation
    from dlfp import cost_model as cm
    from dlfp.runners import sim
    from dlfp.sim import SimEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    cfg = load_experiment("qwen3-0.6b-tp1")
    model, gpu, dm, host, blocks = sim.build_engine_parts(cfg)
    try:
        dm = cm.DeviceModel(model, gpu, 1, cm.DeviceAssumptions(device_model="roofline"))
    except TypeError:  # before the kernel-level model existed: the roofline was the only model
        pass
    reqs = sim._workload(cfg, 801).requests

    def engine(arm):
        return SimEngine(dm, build_policy(cfg.arms[arm]), scheduling=cfg.scheduling,
                         max_num_batched_tokens=cfg.max_num_batched_tokens, max_num_seqs=cfg.max_num_seqs,
                         block_size=cfg.block_size, num_gpu_blocks=blocks, max_model_len=cfg.max_model_len, host=host)

    for arm in ("baseline", "dlfp"):
        best, n = float("inf"), 0
        for _ in range(args.repeats):
            eng = engine(arm)
            c0 = time.process_time()
            r = eng.run(reqs)
            best, n = min(best, time.process_time() - c0), len(r.iterations)
        prof = cProfile.Profile()
        eng = engine(arm)
        prof.enable()
        eng.run(reqs)
        prof.disable()
        calls = pstats.Stats(prof).total_calls / n
        print(f"{arm}: {best / n * 1e6:.2f} us CPU per iteration (best of {args.repeats}, {n} iterations), "
              f"{calls:.1f} Python calls per iteration")
    print(f"1-min load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
