"""Simulator fidelity against the real vLLM engine: the tables of what ``dlfp validate-sim`` wrote.

Reads ``<fidelity_dir>/errors.csv`` and ``dlfp_effect.csv`` (seconds and
fractions) and reports milliseconds and percent. Never runs an engine.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dlfp.analysis.markdown import write_table

FIDELITY_COLUMNS = ["arm", "metric", "real_ms", "sim_ms", "error_pct", "target_pct", "met"]


def fidelity_errors(fidelity_dir: str | Path) -> pd.DataFrame | None:
    """The seed-mean error table that ``dlfp validate-sim`` wrote (``<fidelity_dir>/errors.csv``), in long form.

    Columns ``FIDELITY_COLUMNS``: one row per (arm, metric of
    ``dlfp.studies.validation.METRICS``) with real and simulated values (ms), the
    relative error ``sim / real - 1`` (percent), the target (percent) and
    whether it is met. ``None`` when the file does not exist (validate-sim
    has not run).

    Raises:
        ValueError: the file lacks a column validate-sim writes (named).
    """
    from dlfp.studies.validation import METRICS

    p = Path(fidelity_dir) / "errors.csv"
    if not p.exists():
        return None
    err = pd.read_csv(p, dtype={"seed": str, "arm": str})
    rows = []
    for _, r in err[err["seed"] == "mean"].iterrows():
        for m, (_, target) in METRICS.items():
            need = [f"{m}_real_s", f"{m}_sim_s", f"{m}_err"]
            missing = [c for c in need if c not in err.columns]
            if missing:
                raise ValueError(f"{p}: missing column(s) {missing}")
            e = float(r[f"{m}_err"])
            rows.append(dict(arm=r["arm"], metric=m, real_ms=1e3 * float(r[f"{m}_real_s"]),
                             sim_ms=1e3 * float(r[f"{m}_sim_s"]), error_pct=100 * e, target_pct=100 * target,
                             met=bool(abs(e) <= target) if np.isfinite(e) else False))
    return pd.DataFrame(rows, columns=FIDELITY_COLUMNS)


def fidelity_effect(fidelity_dir: str | Path) -> pd.DataFrame | None:
    """``<fidelity_dir>/dlfp_effect.csv`` (validate-sim) with changes in percent; ``None`` when absent.

    Columns: seed, real_change_pct, sim_change_pct (``dlfp / baseline - 1`` of
    P99 ITL, percent), same_sign.
    """
    p = Path(fidelity_dir) / "dlfp_effect.csv"
    if not p.exists():
        return None
    e = pd.read_csv(p, dtype={"seed": str})
    return pd.DataFrame({"seed": e["seed"], "real_change_pct": 100 * e["real_change"].astype(float),
                         "sim_change_pct": 100 * e["sim_change"].astype(float),
                         "same_sign": e["same_sign"].astype(str).str.lower() == "true"})


def write_fidelity(fidelity_dir: str | Path,
                   results_dir: str | Path) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """Write ``fidelity_errors.csv``/``.md`` and ``fidelity_effect.csv``/``.md`` from validate-sim's output.

    When ``fidelity_dir`` holds no ``errors.csv`` nothing is written and
    ``(None, None)`` is returned (the caller shows a placeholder).
    """
    err, eff = fidelity_errors(fidelity_dir), fidelity_effect(fidelity_dir)
    if err is not None:
        write_table(err, results_dir, "fidelity_errors", title="Simulator vs real vLLM engine (CPU): relative error",
                    notes=["error = sim / real - 1 of the seed mean; targets of dlfp validate-sim (10 % P50, "
                           "20 % P99)."])
    if eff is not None:
        write_table(eff, results_dir, "fidelity_effect", title="DLFP effect on P99 ITL: real engine vs simulator")
    return err, eff


__all__ = ["FIDELITY_COLUMNS", "fidelity_effect", "fidelity_errors", "write_fidelity"]
