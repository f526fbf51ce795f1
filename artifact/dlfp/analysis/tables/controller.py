"""The controller's view of a trial (cap trajectory and its counts) and the absolute per-arm points.

Times are seconds in the trajectory and milliseconds in the tables.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dlfp.analysis import metrics, stats
from dlfp.analysis.markdown import write_table
from dlfp.analysis.tables.loading import LoadedTrial, TraceSet, mark_incomplete
from dlfp.traces.format import Trial

#: The paper's DLFP target in seconds (arXiv v1, 2026-09-29), drawn when an arm records none.
DEFAULT_TARGET_S = 0.080
ARM_POINT_COLUMNS = ["backend", "experiment", "arm", "seeds"] + [
    f"{c}_{k}" for c in ("p99_itl_ms", "p99_ttft_ms") for k in ("mean", "ci_low", "ci_high")]


def cap_trajectory(trial: Trial) -> pd.DataFrame:
    """The controller's view of one trial, one row per iteration.

    Columns: iteration, time_s (scheduler call), cap (in force; NaN = none),
    cap_after, guarded, observed_interval_s (the interval the policy was
    fed; NaN where none), prefill_tokens, num_decodes.
    """
    it = trial.iterations.sort_values("iteration", kind="stable")
    return pd.DataFrame({
        "iteration": it["iteration"].to_numpy(),
        "time_s": it["schedule_s"].to_numpy(float),
        "cap": it["cap"].astype("Float64").to_numpy(dtype=float, na_value=np.nan),
        "cap_after": it["cap_after"].astype("Float64").to_numpy(dtype=float, na_value=np.nan),
        "guarded": it["guarded"].to_numpy(bool),
        "observed_interval_s": it["observed_interval_s"].to_numpy(float),
        "prefill_tokens": it["prefill_tokens"].to_numpy(),
        "num_decodes": it["num_decodes"].to_numpy(),
    })


def decision_reasons(trial: Trial, iterations) -> np.ndarray | None:
    """The decision reason of each of ``iterations`` (shape ``(n,)`` of str) from ``metadata["decisions"]``.

    ``None`` when the trial's policy logs no reasons. An iteration before the first recorded decision gets "".
    """
    dec = trial.metadata.get("decisions")
    if not isinstance(dec, dict) or not dec.get("start_iteration"):
        return None
    starts = np.asarray(dec["start_iteration"], dtype=np.int64)
    names = np.asarray(list(dec["reasons"]) + [""], dtype=object)
    idx = np.searchsorted(starts, np.asarray(iterations, dtype=np.int64), side="right") - 1
    codes = np.where(idx >= 0, np.asarray(dec["code"], dtype=np.int64)[np.maximum(idx, 0)], len(names) - 1)
    return names[codes].astype(str)


def policy_target_s(lt: LoadedTrial) -> float | None:
    """The arm's controller target (seconds) from its config, else from metadata; ``None`` for a non-adaptive arm."""
    if lt.config is not None and lt.arm in lt.config.arms:
        pc = lt.config.arms[lt.arm]
        if pc.policy == "dlfpg":  # DLFP-G's decode-gap objective
            return float(pc.options.get("itl_target_s") or lt.config.slo.itl_s)
        return float(pc.target_s) if pc.policy in ("dlfp", "dlfps") else None
    pol = lt.trial.metadata.get("policy")
    if isinstance(pol, dict) and pol.get("target_s") is not None:
        return float(pol["target_s"])
    return None


def controller_summary(trial: Trial) -> dict[str, Any]:
    """Counts of one trial's controller log.

    Keys: iterations, guarded, cap_changes, cap_min, cap_max (tokens; NaN
    without a cap), observed_interval_p50_ms (median over guarded iterations).
    """
    ct = cap_trajectory(trial)
    g = ct[ct["guarded"]]
    caps = ct["cap"].dropna()
    changes = int((ct["cap_after"].dropna().diff().fillna(0) != 0).sum())
    return dict(iterations=len(ct), guarded=len(g), cap_changes=changes,
                cap_min=float(caps.min()) if len(caps) else float("nan"),
                cap_max=float(caps.max()) if len(caps) else float("nan"),
                observed_interval_p50_ms=metrics.to_ms(metrics.percentile(g["observed_interval_s"], 50)))


def arm_points(ts: TraceSet) -> pd.DataFrame:
    """Absolute P99 TTFT and P99 ITL per arm (mean over seeds with a 95 % t-interval across seeds).

    Columns (``ARM_POINT_COLUMNS``): backend, experiment, arm, seeds,
    p99_itl_ms_mean, p99_itl_ms_ci_low, p99_itl_ms_ci_high, p99_ttft_ms_mean,
    p99_ttft_ms_ci_low, p99_ttft_ms_ci_high (ms; the interval is that of
    ``dlfp.analysis.stats.summarize_changes`` over the seed values).
    """
    s = ts.summary()
    rows = []
    for backend, experiment in ts.groups():
        for arm in ts.arms(backend, experiment):
            a = s[(s["backend"] == backend) & (s["experiment"] == experiment) & (s["arm"] == arm)]
            row: dict[str, Any] = dict(backend=backend, experiment=experiment, arm=arm, seeds=len(a))
            for col in ("p99_itl_ms", "p99_ttft_ms"):
                v = a[col].to_numpy(float)
                v = v[np.isfinite(v)]
                if v.size:
                    r = stats.summarize_changes(v)
                    row.update({f"{col}_mean": r.mean, f"{col}_ci_low": r.ci_low, f"{col}_ci_high": r.ci_high})
                else:
                    row.update({f"{col}_mean": np.nan, f"{col}_ci_low": np.nan, f"{col}_ci_high": np.nan})
            rows.append(row)
    return pd.DataFrame(rows, columns=ARM_POINT_COLUMNS)


def write_arm_points(ts: TraceSet, results_dir: str | Path) -> pd.DataFrame:
    """Write ``arm_points`` (CSV + Markdown)."""
    pts = arm_points(ts)
    write_table(mark_incomplete(pts, ts), results_dir, "arm_points",
                title="P99 ITL and TTFT per arm (mean, 95 % interval)")
    return pts


__all__ = ["ARM_POINT_COLUMNS", "DEFAULT_TARGET_S", "arm_points", "cap_trajectory", "controller_summary",
           "decision_reasons", "policy_target_s", "write_arm_points"]
