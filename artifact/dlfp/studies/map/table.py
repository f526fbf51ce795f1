"""One row per map cell: the paired DLFP effect and the cell's distribution-level views.

Changes follow ``dlfp.analysis.stats`` (``(dlfp - baseline) / baseline`` per seed, in percent; NEGATIVE = DLFP
lower). For each of P99 ITL, P99 TTFT and P99 E2EL a cell has:

* ``d_<m>_pct``: the paper's statistic, the mean over seeds of the per-seed paired change, with its two-sided
  95 % Student-t interval (``_lo``, ``_hi``; NaN with one seed) and ``_signs`` (per-seed signs, e.g. ``"--+"``);
* ``d_<m>_armmean_pct``: the change of the arm means (mean over seeds of each arm, then the relative change),
  which does not let one seed whose baseline P99 sits in the decode band dominate.

Distribution-level views that do not jump at the P99 knife edge: ``gap_over_slo_<arm>`` (share of inter-token
gaps above the ITL SLO, mean over seeds) and ``stalled_s_<arm>`` (seconds of such gaps per request). Also the
SLO passes summed over seeds per arm, the baseline's stalled-gap share (``stall_frac_baseline``, mean over seeds)
and the utilisation (prefill demand over capacity).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlfp.analysis.stats import paired_change
from dlfp.studies.map.grid import MapError

CELL_KEYS = ["map", "source", "scale", "rate", "budget"]
METRICS = {"itl": "itl_p99_s", "ttft": "ttft_p99_s", "e2el": "e2el_p99_s"}


def _signs(values) -> str:
    return "".join("+" if v > 0 else ("-" if v < 0 else "0") for v in values)


def _cell_row(g: pd.DataFrame, base: str, cand: str) -> dict:
    b = g[g["arm"] == base].sort_values("seed")
    c = g[g["arm"] == cand].sort_values("seed")
    if list(b["seed"]) != list(c["seed"]) or b.empty:
        raise MapError(f"map cell {tuple(g.iloc[0][CELL_KEYS])}: arms {base} and {cand} are not paired on the "
                       f"same seeds ({list(b['seed'])} vs {list(c['seed'])})")
    row = {"seeds": len(b)}
    for name, col in METRICS.items():
        pc = paired_change(b[col].to_numpy(float), c[col].to_numpy(float)).as_percent()
        row[f"d_{name}_pct"], row[f"d_{name}_lo"], row[f"d_{name}_hi"] = pc.mean, pc.ci_low, pc.ci_high
        row[f"d_{name}_crosses_zero"] = bool(pc.crosses_zero)
        row[f"d_{name}_signs"] = _signs(pc.per_seed)
        bm, cm = float(b[col].mean()), float(c[col].mean())
        row[f"d_{name}_armmean_pct"] = 100.0 * (cm - bm) / bm
        row[f"{name}_p99_ms_{base}"], row[f"{name}_p99_ms_{cand}"] = 1e3 * bm, 1e3 * cm
    for arm, df in ((base, b), (cand, c)):
        row[f"slo_passes_{arm}"] = int(df["slo_passes"].sum())
        row[f"gap_over_slo_{arm}"] = float(df["gap_over_slo_frac"].mean())
        row[f"stalled_s_{arm}"] = float(df["stalled_s_per_request"].mean())
    row["measured_per_seed"] = int(b["measured"].iloc[0])
    row["stall_frac_baseline"] = float(b["stall_frac"].mean())
    row["utilisation"] = float(b["utilisation"].mean())
    return row


def cell_table(trials: pd.DataFrame, base: str = "baseline", cand: str = "dlfp") -> pd.DataFrame:
    """One row per cell of the raw per-trial table (``dlfp.studies.map.run.TRIAL_COLUMNS``), in input order.

    Raises:
        MapError: a cell whose arms are not paired on the same seeds.
    """
    rows = []
    for key, g in trials.groupby(CELL_KEYS, sort=False):
        rows.append({**dict(zip(CELL_KEYS, key)), **_cell_row(g, base, cand)})
    return pd.DataFrame(rows)


def at(cells: pd.DataFrame, **where) -> pd.DataFrame:
    """The rows of ``cells`` whose columns equal ``where`` (floats compared with a relative tolerance of 1e-9)."""
    mask = np.ones(len(cells), dtype=bool)
    for k, v in where.items():
        col = cells[k]
        mask &= np.isclose(col.astype(float), float(v), rtol=1e-9, atol=0) if isinstance(v, float) else (col == v)
    return cells[mask]


__all__ = ["CELL_KEYS", "METRICS", "at", "cell_table"]
