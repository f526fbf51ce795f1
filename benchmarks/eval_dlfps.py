"""Run DLFP-S, its ablations, paper-DLFP, the baseline and the fixed-cap frontier on the simulator and
print DLFP-S's target table (``dlfp.analysis.evaluation.target_table``) and the ablation table. Not a test.

    .venv/bin/python benchmarks/eval_dlfps.py [--out results.csv] [--exp NAME ...] [--no-frontier]

Every experiment with a ``dlfps`` arm, every arm of its config plus one ``fixed-<C>`` arm per cap in
``backend_options.frontier_caps`` (added by override, same seeds and workload), all seeds. Trials are
simulated in memory (nothing is written under data/traces/); ``--out`` saves the summary frame as CSV,
and ``--from CSV`` re-prints the tables from a saved one without simulating.
"""
from __future__ import annotations

import argparse
import sys
import time

import pandas as pd

from dlfp.analysis import metrics
from dlfp.config import list_experiments, load_experiment
from dlfp.analysis.evaluation import ablation_table, target_table
from dlfp.backends import run_trial

ABLATIONS = ["dlfp", "dlfps", "dlfps-no-estimator", "dlfps-no-feasibility", "dlfps-no-ttft-guard", "dlfps-host-cadence"]


def run(names, frontier: bool = True) -> pd.DataFrame:
    rows = []
    for name in names:
        cfg = load_experiment(name)
        if frontier:
            cfg = cfg.with_overrides({f"arms.fixed-{c}": {"policy": "fixed", "cap": int(c)}
                                      for c in cfg.backend_options.get("frontier_caps", [])})
        t0 = time.perf_counter()
        for seed in cfg.seeds:
            for arm in cfg.arms:
                rows.append(metrics.summarize(run_trial(cfg, arm, seed, backend="sim")))
        print(f"{name}: {len(cfg.arms)} arms x {len(cfg.seeds)} seeds in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exp", nargs="*", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--from", dest="src", default=None)
    ap.add_argument("--no-frontier", action="store_true")
    a = ap.parse_args()
    if a.src:
        df = pd.read_csv(a.src)
    else:
        names = a.exp or [n for n in list_experiments() if "dlfps" in load_experiment(n).arms]
        df = run(names, frontier=not a.no_frontier)
        if a.out:
            df.to_csv(a.out, index=False)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 200)
    pd.set_option("display.max_rows", 500)
    tt = target_table(df)
    print("# DLFP-S targets (DLFP-S vs baseline; simulator)")
    print(tt[["target", "experiment", "reached", "detail"]].to_string(index=False))
    ab = ablation_table(df, ABLATIONS)
    for c in ("itl_change", "itl_ci_low", "itl_ci_high", "ttft_change"):
        ab[c] = (100 * ab[c]).round(1)
    print("\n# Ablation (percent; change negative = lower than the baseline)")
    print(ab.to_string(index=False))


if __name__ == "__main__":
    main()
