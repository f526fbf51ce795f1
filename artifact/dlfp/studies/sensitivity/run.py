"""Running a sweep plan on the simulator: one summary per (variant, arm, seed) cell, nothing written.

Each distinct run (``TrialTask``) is a ``dlfp.backends.run_trial(...,
backend="sim")`` call, in spawned worker processes; its trial is summarised
under every SLO that uses it. Times are seconds.
"""
from __future__ import annotations

import json
import os
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from dlfp.config import ExperimentConfig
from dlfp.studies.sensitivity.plan import SensitivityError, SweepPlan, TrialTask

#: Columns of the per-trial summary frame (one row per variant x arm x seed).
TRIAL_COLUMNS = ("experiment", "field", "value", "is_default", "arm", "seed", "measured", "completed",
                 "itl_p50_s", "itl_p99_s", "stall_frac", "ttft_p99_s", "e2el_p99_s", "slo_passes")
#: A "stalled" inter-token gap is longer than this multiple of the trial's median gap (a diagnostic, not a metric
#: of the paper: it shows whether the P99 gap falls among the stalls, i.e. whether stall_frac exceeds 1 %).
STALL_FACTOR = 10.0

Progress = Callable[[int, int], None]


def trial_summaries(cfg: ExperimentConfig, arm: str, seed: int, slos: Sequence[str]) -> list[dict]:
    """Run one sim trial (nothing written) and summarise it under each SLO (canonical JSON); one dict per SLO.

    Keys: ``measured``, ``completed``, ``itl_p50_s``, ``itl_p99_s``, ``ttft_p99_s``, ``e2el_p99_s`` (seconds),
    ``stall_frac`` (fraction of measured inter-token gaps longer than ``STALL_FACTOR`` x their median),
    ``slo_passes``.
    """
    from dlfp.analysis.metrics import itl_samples, summarize
    from dlfp.backends import run_trial

    trial = run_trial(cfg, arm, seed, backend="sim")
    gaps = itl_samples(trial)
    gaps = gaps[np.isfinite(gaps)]
    stall = float((gaps > STALL_FACTOR * np.median(gaps)).mean()) if gaps.size else float("nan")
    out = []
    for slo in slos:
        s = summarize(trial, json.loads(slo))
        out.append({"measured": int(s["measured"]), "completed": int(s["completed"]),
                    "itl_p50_s": float(s["itl_p50_s"]), "itl_p99_s": float(s["itl_p99_s"]), "stall_frac": stall,
                    "ttft_p99_s": float(s["ttft_p99_s"]), "e2el_p99_s": float(s["e2el_p99_s"]),
                    "slo_passes": int(s["slo_passes"])})
    return out


def _jobs(jobs: int | None) -> int:
    """Worker processes: ``jobs``, else ``$DLFP_JOBS``, else the CPU count.

    Raises:
        SensitivityError: ``jobs`` or ``$DLFP_JOBS`` is not a positive integer.
    """
    if jobs is not None:
        if int(jobs) < 1:
            raise SensitivityError(f"jobs must be >= 1, got {jobs!r}")
        return int(jobs)
    env = os.environ.get("DLFP_JOBS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise SensitivityError(f"DLFP_JOBS={env!r} is not a positive integer")
        return int(env)
    return os.cpu_count() or 1


def _run_tasks(todo: list[TrialTask], jobs: int, progress: Progress | None) -> dict[str, dict[str, dict]]:
    """``{task key: {slo json: summary}}`` of every task, in ``jobs`` spawned processes (1: in this process)."""
    results: dict[str, dict[str, dict]] = {}

    def record(t: TrialTask, summaries: list[dict]) -> None:
        results[t.key] = dict(zip(t.slos, summaries))
        if progress:
            progress(len(results), len(todo))

    if jobs == 1 or len(todo) <= 1:
        for t in todo:
            record(t, trial_summaries(t.config, t.arm, t.seed, t.slos))
        return results
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=mp.get_context("spawn")) as pool:
        futs = {pool.submit(trial_summaries, t.config, t.arm, t.seed, t.slos): t for t in todo}
        for fut in as_completed(futs):
            record(futs[fut], fut.result())
    return results


def run_plan(plan: SweepPlan, *, jobs: int | None = None, progress: Progress | None = None) -> pd.DataFrame:
    """Run every distinct trial of ``plan`` and return the per-cell summaries.

    ``jobs`` spawn processes (1 = in this process; default ``$DLFP_JOBS`` or
    the CPU count); ``progress(done, total)`` is called after each run.
    Returns ``TRIAL_COLUMNS``, one row per variant x arm x seed, in plan order.

    Raises:
        SensitivityError: a bad ``jobs`` / ``$DLFP_JOBS``.
    """
    results = _run_tasks(list(plan.tasks.values()), _jobs(jobs), progress)
    rows = []
    for (i, arm, seed), (key, slo) in plan.cells.items():
        v = plan.variants[i]
        rows.append({"experiment": v.experiment, "field": v.field, "value": v.label, "is_default": v.is_default,
                     "arm": arm, "seed": seed, **results[key][slo]})
    return pd.DataFrame(rows, columns=list(TRIAL_COLUMNS))


__all__ = ["STALL_FACTOR", "TRIAL_COLUMNS", "run_plan", "trial_summaries"]
