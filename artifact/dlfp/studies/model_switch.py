"""What the device model changes: the paper experiments on the simulator under the per-part roofline and under
the kernel-level model (``dlfp.devices.kernel_model``), side by side.

For each paper experiment and device model it runs baseline, DLFP and two fixed caps (512 and 8,192 tokens)
on the experiment's seeds and reports

* the DLFP effect on P99 ITL and P99 TTFT: mean over seeds of the paired change
  (candidate - baseline) / baseline, in percent (``dlfp.analysis.stats.paired_change``);
* the TTFT response to the cap: P99 TTFT at cap 512 over P99 TTFT at cap 8,192 (arm means), which the paper and
  the real CPU engine show above 1 (cutting a prefill into small chunks costs time) and the roofline leaves near 1.

Nothing is fitted here; the kernel model's constants come from measured GPU operator times only.

    python -m dlfp.studies.model_switch [--out data/results/device] [--jobs N]
"""
from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from dlfp.analysis.markdown import atomic_write, to_markdown
from dlfp.analysis.stats import paired_change
from dlfp.config import load_experiment
from dlfp.paths import REPO_ROOT

EXPERIMENTS = ("qwen3-0.6b-tp1", "qwen3-0.6b-tp2", "qwen3-8b-r0.10", "qwen3-8b-r0.25", "qwen3-32b-tp2",
               "qwen3-32b-tp2-completion-sync")
MODELS = ("roofline", "kernel")
ARMS = {"baseline": None, "dlfp": None, "fixed-512": 512, "fixed-8192": 8192}
COLUMNS = ["experiment", "device_model", "dlfp_itl_p99_change_pct", "dlfp_ttft_p99_change_pct",
           "baseline_itl_p99_ms", "dlfp_itl_p99_ms", "baseline_ttft_p99_ms", "ttft_p99_cap512_over_cap8192"]


def _config(experiment: str, model: str, arm: str):
    cfg = load_experiment(experiment)
    sim = dict(cfg.backend_options.get("sim") or {})
    sim["device"] = {**dict(sim.get("device") or {}), "device_model": model}
    over = {"backend_options.sim": sim}
    cap = ARMS[arm]
    if cap is not None:
        over[f"arms.{arm}"] = {"policy": "fixed", "cap": cap}
    return cfg.with_overrides(over)


def _trial(task: tuple[str, str, str, int]) -> tuple[str, str, str, int, float, float]:
    """One simulator trial: ``(experiment, model, arm, seed, P99 ITL s, P99 TTFT s)``."""
    from dlfp.analysis.metrics import summarize
    from dlfp.backends import run_trial

    experiment, model, arm, seed = task
    s = summarize(run_trial(_config(experiment, model, arm), arm, seed, backend="sim"))
    return experiment, model, arm, seed, float(s["itl_p99_s"]), float(s["ttft_p99_s"])


def run(experiments=EXPERIMENTS, jobs: int | None = None) -> pd.DataFrame:
    """Every (experiment, model, arm, seed) trial summary, one row each."""
    tasks = [(e, m, a, s) for e in experiments for m in MODELS for a in ARMS for s in load_experiment(e).seeds]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        rows = list(pool.map(_trial, tasks, chunksize=4))
    return pd.DataFrame(rows, columns=["experiment", "device_model", "arm", "seed", "itl_p99_s", "ttft_p99_s"])


def table(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per (experiment, device model): the DLFP effects and the TTFT response to the cap."""
    out = []
    for (exp, model), g in trials.groupby(["experiment", "device_model"], sort=False):
        by = {a: g[g["arm"] == a].sort_values("seed") for a in ARMS}
        itl = paired_change(by["baseline"]["itl_p99_s"], by["dlfp"]["itl_p99_s"]).mean * 100
        ttft = paired_change(by["baseline"]["ttft_p99_s"], by["dlfp"]["ttft_p99_s"]).mean * 100
        ratio = by["fixed-512"]["ttft_p99_s"].mean() / by["fixed-8192"]["ttft_p99_s"].mean()
        out.append((exp, model, itl, ttft, by["baseline"]["itl_p99_s"].mean() * 1e3,
                    by["dlfp"]["itl_p99_s"].mean() * 1e3, by["baseline"]["ttft_p99_s"].mean() * 1e3, ratio))
    return pd.DataFrame(out, columns=COLUMNS)


def write(tab: pd.DataFrame, trials: pd.DataFrame, out_dir: Path) -> None:
    """``model_switch.csv``/``.md`` and the per-trial ``model_switch_trials.csv`` (atomic writes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "model_switch_trials.csv", trials.to_csv(index=False, float_format="%.6g"))
    atomic_write(out_dir / "model_switch.csv", tab.to_csv(index=False, float_format="%.6g"))
    shown = tab.copy()
    for c in COLUMNS[2:]:
        shown[c] = shown[c].map(lambda v: f"{v:+.1f}" if c.endswith("pct") else (
            f"{v:.3f}" if c.startswith("ttft_p99_cap") else f"{v:.1f}"))
    note = ("Simulator, seeds of each experiment. Changes are the mean over seeds of the paired change "
            "(candidate - baseline) / baseline, in percent (negative = lower). cap512/cap8192: P99 TTFT of the "
            "fixed-cap arms (arm means). roofline = dlfp.devices.roofline; kernel = dlfp.devices.kernel_model "
            "(the default). Command: python -m dlfp.studies.model_switch.")
    atomic_write(out_dir / "model_switch.md", "# Device model switch: roofline against kernel-level\n\n" + note
                 + "\n\n" + to_markdown(shown))


def study_main(argv: list[str] | None, module: str, description: str, run_fn, table_fn, write_fn,
               columns: list[str]) -> int:
    """The command line of a side-by-side study: ``--out`` (default ``data/results/device``) and ``--jobs``; runs,
    tabulates, writes and prints. Returns 0, or 1 when a value in ``columns[2:]`` is not finite."""
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "results" / "device")
    p.add_argument("--jobs", type=int, default=None)
    args = p.parse_args(argv)
    trials = run_fn(jobs=args.jobs)
    tab = table_fn(trials)
    write_fn(tab, trials, args.out)
    with pd.option_context("display.width", 200):
        print(tab.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if np.isfinite(tab[columns[2:]].to_numpy(float)).all() else 1


def main(argv: list[str] | None = None) -> int:
    return study_main(argv, "dlfp.studies.model_switch", __doc__.splitlines()[0], run, table, write, COLUMNS)


if __name__ == "__main__":
    raise SystemExit(main())
