"""DLFP-S tables: its targets (``dlfp.analysis.evaluation.target_table``) and its ablation, per backend.

The ablation's changes follow ``dlfp.analysis.stats`` (percent, negative =
lower than the baseline); the target table's ITL values are reductions, as
its targets are stated (``dlfp.analysis.evaluation``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from dlfp.analysis import evaluation
from dlfp.analysis.markdown import write_table
from dlfp.analysis.tables.loading import TraceSet, mark_incomplete

DLFPS_ARM = "dlfps"
ABLATION_COLUMNS = ["backend", "experiment", "arm", "p99_itl_change_pct_mean", "p99_itl_change_pct_ci_low",
                    "p99_itl_change_pct_ci_high", "p99_ttft_change_pct_mean", "slo_passes", "slo_passes_baseline"]


def evaluation_frame(ts: TraceSet, backend: str) -> pd.DataFrame:
    """The per-trial frame ``dlfp.analysis.evaluation`` expects, for one backend (seconds).

    Columns: experiment, arm, seed, itl_p99_s, ttft_p99_s, slo_passes (from
    ``trial_summaries``; ms converted back to seconds).
    """
    s = ts.summary()
    g = s[s["backend"] == backend]
    return pd.DataFrame({"experiment": g["experiment"].to_numpy(), "arm": g["arm"].to_numpy(),
                         "seed": g["seed"].to_numpy(), "itl_p99_s": g["p99_itl_ms"].to_numpy(float) / 1e3,
                         "ttft_p99_s": g["p99_ttft_ms"].to_numpy(float) / 1e3,
                         "slo_passes": g["slo_passes"].to_numpy(float)})


def _backends_with_arm(ts: TraceSet, arm: str) -> list[str]:
    return sorted({b for b, e in ts.groups() if arm in set(ts.arms(b, e))})


def dlfps_targets(ts: TraceSet, candidate: str = DLFPS_ARM) -> pd.DataFrame:
    """``dlfp.analysis.evaluation.target_table`` per backend whose traces have the ``candidate`` arm.

    Only experiments whose baseline arm is ``"baseline"`` are evaluated.
    Columns: backend, then ``dlfp.analysis.evaluation.TARGET_COLUMNS`` (target,
    experiment, reached, value, threshold, detail): ``value``/``threshold``
    are fractions for the ITL targets (reductions: positive = lower than the
    baseline; TTFT rows: increases), mean SLO passes for ``slo_passes``, and
    P99 ITL in seconds for ``frontier``; ``detail`` says it in words.
    """
    frames = []
    for backend in _backends_with_arm(ts, candidate):
        df = evaluation_frame(ts, backend)
        df = df[df["experiment"].isin([e for b, e in ts.groups() if b == backend
                                       and ts.baseline_arm(b, e) == "baseline"])]
        tt = evaluation.target_table(df, candidate=candidate)
        frames.append(tt.assign(backend=backend))
    cols = ["backend"] + list(evaluation.TARGET_COLUMNS)
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def dlfps_ablation(ts: TraceSet, candidate: str = DLFPS_ARM, reference: Sequence[str] = ("dlfp",)) -> pd.DataFrame:
    """``dlfp.analysis.evaluation.ablation_table`` per backend: ``reference`` arms, ``candidate``, its ablations.

    Ablation arms are those named ``<candidate>-<part switched off>`` (e.g.
    ``dlfps-no-estimator``). Columns ``ABLATION_COLUMNS``: backend,
    experiment, arm, p99_itl_change_pct_mean, p99_itl_change_pct_ci_low,
    p99_itl_change_pct_ci_high, p99_ttft_change_pct_mean (percent, negative =
    lower than the baseline), slo_passes, slo_passes_baseline (means over seeds).
    """
    frames = []
    for backend in _backends_with_arm(ts, candidate):
        present = set().union(*(set(ts.arms(b, e)) for b, e in ts.groups() if b == backend))
        arms = [a for a in reference if a in present] + [candidate] + sorted(
            a for a in present if a.startswith(candidate + "-"))
        ab = evaluation.ablation_table(evaluation_frame(ts, backend), arms)
        frames.append(pd.DataFrame({
            "backend": backend, "experiment": ab["experiment"], "arm": ab["arm"],
            "p99_itl_change_pct_mean": 100 * ab["itl_change"],
            "p99_itl_change_pct_ci_low": 100 * ab["itl_ci_low"],
            "p99_itl_change_pct_ci_high": 100 * ab["itl_ci_high"],
            "p99_ttft_change_pct_mean": 100 * ab["ttft_change"],
            "slo_passes": ab["slo_passes"], "slo_passes_baseline": ab["slo_passes_baseline"]}))
    if not frames:
        return pd.DataFrame(columns=ABLATION_COLUMNS)
    out = pd.concat(frames, ignore_index=True)[ABLATION_COLUMNS]
    return out.sort_values(["backend", "experiment"], kind="stable").reset_index(drop=True)


def write_dlfps(ts: TraceSet, results_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write ``dlfps_targets.csv``/``.md`` and ``dlfps_ablation.csv``/``.md`` (a note when no trial has the arm)."""
    tt, ab = dlfps_targets(ts), dlfps_ablation(ts)
    none = [] if len(tt) else [f"NO DATA: no traces have the {DLFPS_ARM!r} arm."]
    tmd = tt[["backend", "target", "experiment", "reached", "detail"]] if len(tt) else tt
    write_table(mark_incomplete(tt, ts), results_dir, "dlfps_targets", markdown=mark_incomplete(tmd, ts),
                title="DLFP-S against its targets (what is reached, not what was hoped)",
                notes=none + ["value/threshold: change fractions with positive = lower than the baseline (TTFT "
                              "rows: increase); mean SLO passes; frontier rows: P99 ITL in seconds."])
    write_table(mark_incomplete(ab, ts), results_dir, "dlfps_ablation",
                title="DLFP-S ablation: paired change vs the baseline",
                notes=none + ["ΔP99 in percent, negative = lower than the baseline; 95 % paired t-interval over "
                              "seeds; SLO passes are means per trial."])
    return tt, ab


__all__ = ["ABLATION_COLUMNS", "DLFPS_ARM", "dlfps_ablation", "dlfps_targets", "evaluation_frame", "write_dlfps"]
