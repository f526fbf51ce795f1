"""Where each published claim holds on the map: the share of cells, by statistic, and at the shipped assumption.

A claim is a direction of DLFP's effect in one paper configuration (its map). Each is judged per cell with three
statistics, because near the P99 knife edge they disagree:

* ``paper``: the paper's statistic, the mean over seeds of the per-seed paired P99 change (for "lowers": mean < 0
  and the 95 % interval below 0; for "raises": mean > 0 and the interval above 0; for "not a win": the interval
  crosses 0 or the mean is >= 0);
* ``armmean``: the sign of the change of the arm means (P99 averaged over seeds per arm);
* ``tail_share``: the share of inter-token gaps above the ITL SLO, DLFP against the baseline (a distribution-level
  view that does not jump when the P99 moves between the decode and the stall band).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlfp.studies.map.grid import SHIPPED, get_map
from dlfp.studies.map.table import at

#: (claim, map, metric, direction, paper rate) in the paper's words (data/paper/published.csv).
CLAIMS = (
    ("0.6B TP1: DLFP lowers P99 ITL (-27.7 %)", "qwen3-0.6b-tp1", "itl", "lowers", 1.0),
    ("0.6B TP1: DLFP raises P99 TTFT (+34.8 %)", "qwen3-0.6b-tp1", "ttft", "raises", 1.0),
    ("0.6B TP2: not a win on P99 ITL (CI crosses 0)", "qwen3-0.6b-tp2", "itl", "not_a_win", 1.0),
    ("8B 0.10 req/s: DLFP raises P99 ITL (19 -> 281 ms)", "qwen3-8b", "itl", "raises", 0.1),
    ("8B 0.25 req/s: DLFP lowers P99 ITL (1,763 -> 707 ms)", "qwen3-8b", "itl", "lowers", 0.25),
    ("32B TP2: DLFP worsens P99 ITL", "qwen3-32b-tp2", "itl", "raises_mean", 0.1),
    ("32B TP2 sync, completion signal: not a win on P99 ITL", "qwen3-32b-tp2-sync", "itl", "not_a_win", 0.1),
)


def holds(cells: pd.DataFrame, metric: str, direction: str, statistic: str) -> pd.Series:
    """Boolean per cell: does ``direction`` hold for ``metric`` under ``statistic`` (see the module docstring)."""
    m, lo, hi = cells[f"d_{metric}_pct"], cells[f"d_{metric}_lo"], cells[f"d_{metric}_hi"]
    if statistic == "armmean":
        v = cells[f"d_{metric}_armmean_pct"]
        return {"lowers": v < 0, "raises": v > 0, "raises_mean": v > 0, "not_a_win": v >= 0}[direction]
    if statistic == "tail_share":
        if metric != "itl":
            return pd.Series(np.nan, index=cells.index)
        d = cells["gap_over_slo_dlfp"] - cells["gap_over_slo_baseline"]
        return {"lowers": d < 0, "raises": d > 0, "raises_mean": d > 0, "not_a_win": d >= 0}[direction]
    ci = lo.notna()
    return {"lowers": (m < 0) & (~ci | (hi < 0)), "raises": (m > 0) & (~ci | (lo > 0)), "raises_mean": m > 0,
            "not_a_win": (m >= 0) | (ci & (lo <= 0) & (hi >= 0))}[direction]


def claims_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per claim and statistic: cells where it holds (all, at the paper's rate), and at the shipped cell."""
    rows = []
    for claim, name, metric, direction, rate in CLAIMS:
        sub = cells[cells["map"] == name]
        if sub.empty:
            continue
        spec = get_map(name)
        for stat in ("paper", "armmean", "tail_share"):
            h = holds(sub, metric, direction, stat)
            if h.isna().all():
                continue
            h = h.astype(bool)
            at_rate = np.isclose(sub["rate"].astype(float), rate)
            shipped = at(sub, source=SHIPPED["source"], scale=SHIPPED["scale"], budget=SHIPPED["budget"], rate=rate)
            by_source = {}
            for s in spec.sources:
                sel = at_rate & (sub["source"] == s).to_numpy()
                by_source[s] = f"{int(h[sel].sum())}/{int(sel.sum())}"
            rows.append({"claim": claim, "map": name, "statistic": stat, "cells_holding": int(h.sum()),
                         "cells": len(sub), "at_paper_rate": f"{int(h[at_rate].sum())}/{int(at_rate.sum())}",
                         **{f"at_rate_{s}": v for s, v in by_source.items()},
                         "shipped_holds": bool(h.loc[shipped.index].all()) if len(shipped) else None})
    return pd.DataFrame(rows)


__all__ = ["CLAIMS", "claims_table", "holds"]
