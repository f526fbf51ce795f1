"""Root cause: the host interval against the completed device time, per guarded iteration.

The times are seconds in the traces and milliseconds in the table.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dlfp.analysis import metrics
from dlfp.analysis.markdown import write_table
from dlfp.analysis.tables.loading import TraceSet, guarded_of, mark_incomplete

ROOT_CAUSE_COLUMNS = ["backend", "experiment", "arm", "model", "tp", "scheduling", "n_guarded", "r_own", "r_prev",
                      "host_interval_p50_ms", "device_time_p50_ms", "host_minus_device_p50_ms"]


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r of the finite pairs of ``x`` and ``y``; NaN with fewer than 3 pairs or a constant side."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def _root_cause_row(ts: TraceSet, backend: str, experiment: str, arm: str) -> dict | None:
    """One ``root_cause`` row (seeds pooled); ``None`` for an arm without guarded iterations."""
    cfg = ts.config(backend, experiment)
    frames = [guarded_of(ts, lt) for lt in ts.select(backend, experiment, arm)]
    g = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if g.empty:
        return None
    h = g["host_interval_s"].to_numpy(float)
    d = g["device_time_s"].to_numpy(float)
    p = g["prev_device_time_s"].to_numpy(float)
    return dict(
        backend=backend, experiment=experiment, arm=arm,
        model=cfg.model if cfg else "", tp=cfg.tp if cfg else np.nan,
        scheduling=cfg.scheduling if cfg else "", n_guarded=len(g),
        r_own=_pearson(h, d), r_prev=_pearson(h, p),
        host_interval_p50_ms=metrics.to_ms(metrics.percentile(h, 50)),
        device_time_p50_ms=metrics.to_ms(metrics.percentile(d, 50)),
        host_minus_device_p50_ms=metrics.to_ms(metrics.percentile(h - d, 50)),
    )


def root_cause(ts: TraceSet) -> pd.DataFrame:
    """Host interval against completed device time, per guarded iteration, per arm (seeds pooled; computed once).

    Columns (``ROOT_CAUSE_COLUMNS``): backend, experiment, arm, model, tp,
    scheduling, n_guarded, r_own (Pearson r of host_interval_s with the same
    iteration's device_time_s), r_prev (with the previous iteration's device
    time), host_interval_p50_ms, device_time_p50_ms, host_minus_device_p50_ms.
    Arms without guarded iterations (e.g. an uncapped baseline) are left out;
    r is NaN with fewer than 3 finite pairs.
    """
    def compute() -> pd.DataFrame:
        rows = [_root_cause_row(ts, backend, experiment, arm)
                for backend, experiment in ts.groups() for arm in ts.arms(backend, experiment)]
        return pd.DataFrame([r for r in rows if r is not None], columns=ROOT_CAUSE_COLUMNS)

    return ts.cached("root_cause", compute)


def write_root_cause(ts: TraceSet, results_dir: str | Path) -> pd.DataFrame:
    """Write ``root_cause`` (CSV + Markdown)."""
    rc = root_cause(ts)
    write_table(mark_incomplete(rc, ts), results_dir, "root_cause",
                title="Host interval vs device time (guarded iterations)")
    return rc


__all__ = ["ROOT_CAUSE_COLUMNS", "root_cause", "write_root_cause"]
