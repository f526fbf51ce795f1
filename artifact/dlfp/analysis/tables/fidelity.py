"""Simulator fidelity against the real vLLM engine: the tables of what ``dlfp validate-sim`` wrote.

Reads ``<fidelity_dir>/audit_errors.csv`` and ``effects.csv`` (seconds and fractions, one block per
validation workload) and reports milliseconds, percent and points. Never runs an engine.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dlfp.analysis.markdown import write_table

FIDELITY_COLUMNS = ["experiment", "arm", "metric", "real_ms", "sim_ms", "error_pct", "target_pct", "noise_pct",
                    "met"]
EFFECT_COLUMNS = ["experiment", "arm", "metric", "seed", "real_change_pct", "sim_change_pct", "diff_pp", "met"]


def _read(p: Path, need: list[str]) -> pd.DataFrame:
    df = pd.read_csv(p, dtype={"seed": str, "arm": str, "experiment": str})
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"{p}: missing column(s) {missing}")
    return df


def fidelity_errors(fidelity_dir: str | Path) -> pd.DataFrame | None:
    """The seed-mean error table of ``dlfp validate-sim`` (``<fidelity_dir>/audit_errors.csv``).

    Columns ``FIDELITY_COLUMNS``: one row per (workload, arm, metric of ``dlfp.studies.validation.METRICS``)
    with real and simulated values (ms), the relative error ``sim / real - 1`` (percent), the target and the
    real engine's run-to-run noise (percent), and whether the target is met. ``None`` when the file does not
    exist (validate-sim has not run).

    Raises:
        ValueError: the file lacks a column validate-sim writes (named).
    """
    p = Path(fidelity_dir) / "audit_errors.csv"
    if not p.exists():
        return None
    a = _read(p, ["experiment", "arm", "metric", "real_s", "sim_s", "error", "target", "noise", "met"])
    return pd.DataFrame({"experiment": a["experiment"], "arm": a["arm"], "metric": a["metric"],
                         "real_ms": 1e3 * a["real_s"].astype(float), "sim_ms": 1e3 * a["sim_s"].astype(float),
                         "error_pct": 100 * a["error"].astype(float), "target_pct": 100 * a["target"].astype(float),
                         "noise_pct": 100 * a["noise"].astype(float),
                         "met": a["met"].astype(str).str.lower() == "true"})[FIDELITY_COLUMNS]


def fidelity_effect(fidelity_dir: str | Path) -> pd.DataFrame | None:
    """``<fidelity_dir>/effects.csv`` (validate-sim) in percent and points; ``None`` when absent.

    Columns ``EFFECT_COLUMNS``: the paired change of each controller arm against the baseline
    (``arm / baseline - 1`` of P99 ITL or P99 TTFT), real and simulated, per seed and for the seed mean, the
    difference in points and whether it is within the target.
    """
    p = Path(fidelity_dir) / "effects.csv"
    if not p.exists():
        return None
    e = _read(p, ["experiment", "arm", "metric", "seed", "real_change", "sim_change", "diff_pp", "met"])
    return pd.DataFrame({"experiment": e["experiment"], "arm": e["arm"], "metric": e["metric"], "seed": e["seed"],
                         "real_change_pct": 100 * e["real_change"].astype(float),
                         "sim_change_pct": 100 * e["sim_change"].astype(float),
                         "diff_pp": e["diff_pp"].astype(float).round(6),
                         "met": e["met"].astype(str).str.lower() == "true"})[EFFECT_COLUMNS]


def write_fidelity(fidelity_dir: str | Path,
                   results_dir: str | Path) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """Write ``fidelity_errors.csv``/``.md`` and ``fidelity_effect.csv``/``.md`` from validate-sim's output.

    When ``fidelity_dir`` holds no ``audit_errors.csv`` nothing is written and
    ``(None, None)`` is returned (the caller shows a placeholder).
    """
    err, eff = fidelity_errors(fidelity_dir), fidelity_effect(fidelity_dir)
    if err is not None:
        write_table(err, results_dir, "fidelity_errors", title="Simulator vs real vLLM engine (CPU): relative error",
                    notes=["error = sim / real - 1 of the seed mean, per validation workload; targets of dlfp "
                           "validate-sim (10 % P50, 20 % P99); noise = the real engine's run-to-run change on a "
                           "replicate trial."])
    if eff is not None:
        write_table(eff, results_dir, "fidelity_effect",
                    title="Controller effects (arm / baseline - 1) on P99 ITL and P99 TTFT: real engine vs simulator",
                    notes=["target: the simulated effect within 10 points of the real engine's, per seed."])
    return err, eff


__all__ = ["EFFECT_COLUMNS", "FIDELITY_COLUMNS", "fidelity_effect", "fidelity_errors", "write_fidelity"]
