"""Joint inference of the paper's unstated workload from its absolute anchors (an inference, not a fact).

A *workload* here is (prompt-length source, prompt scale, token budget): what the paper does not state. Its
rates are stated, so each anchor is read at the paper's rate of its experiment. The anchors and their published
values come from ``data/paper/published.csv`` (never typed here); the tolerance of each is this artifact's
stated choice:

* absolute P99 ITL (Qwen3-8B, 20 requests per seed): within 25 % of the published value (relative), because
  the P99 of a 20-request trial moves by about that much from seed to seed on the simulator;
* SLO passes (of 20 per seed): the mean over seeds within 2 requests (within 1 for "-> 0");
* the 0.6B headline: the mean paired P99 ITL change inside the paper's 95 % interval; P99 TTFT change within
  15 percentage points; P99 E2EL change within 10 points and its interval crossing 0, as the paper's does.

``consistency`` marks every workload against every anchor, ``intersection`` keeps the workloads consistent with
a set of anchors, and ``cross_validate`` picks the best workload from one model's anchors and predicts the other
model's published numbers there.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dlfp.studies.map.table import at

WORKLOAD_KEYS = ["source", "scale", "budget"]
REL_TOL_ITL = 0.25
PASS_TOL = 2.0
PASS_TOL_ZERO = 1.0
TTFT_TOL_PP = 15.0
E2EL_TOL_PP = 10.0


@dataclass(frozen=True)
class Anchor:
    """One published number: where the map reads it and how close counts as consistent."""

    name: str
    group: str  # "8b" or "0.6b": the model whose anchors choose a workload in the cross-validation
    map: str
    rate: float
    column: str  # column of the cell table; per-seed means for passes
    published: float
    low: float
    high: float
    unit: str
    source: str  # experiment / metric / arm_or_change in published.csv

    def value(self, row: pd.Series) -> float:
        v = float(row[self.column])
        return v / float(row["seeds"]) if self.column.startswith("slo_passes") else v

    def holds(self, row: pd.Series) -> bool:
        ok = self.low <= self.value(row) <= self.high
        if self.name == "0.6B P99 E2EL change":
            ok = ok and bool(row["d_e2el_crosses_zero"])
        return bool(ok)

    def error(self, row: pd.Series) -> float:
        """Distance from the published value in units of the tolerance half-width (0 = exact, 1 = at the edge)."""
        half = max(self.published - self.low, self.high - self.published, 1e-12)
        return abs(self.value(row) - self.published) / half


def _published(df: pd.DataFrame, exp: str, metric: str, which: str) -> float:
    sel = df[(df["experiment"] == exp) & (df["metric"] == metric) & (df["arm_or_change"] == which)]
    if len(sel) != 1 or pd.isna(sel["value"].iloc[0]):
        raise ValueError(f"published.csv: no single value for {exp} / {metric} / {which}")
    return float(sel["value"].iloc[0])


def anchors(published_csv: str | Path) -> list[Anchor]:
    """The paper's anchors, values read from ``published_csv``.

    Raises:
        ValueError: a value missing from the file (named).
    """
    pub = pd.read_csv(published_csv)
    out = []
    for rate, exp in ((0.1, "qwen3-8b-r0.10"), (0.25, "qwen3-8b-r0.25")):
        for arm in ("baseline", "dlfp"):
            v = _published(pub, exp, "p99_itl", arm)
            out.append(Anchor(f"8B {rate:g} req/s {arm} P99 ITL", "8b", "qwen3-8b", rate, f"itl_p99_ms_{arm}", v,
                              v * (1 - REL_TOL_ITL), v * (1 + REL_TOL_ITL), "ms", f"{exp}/p99_itl/{arm}"))
    for exp, rate, arm in (("qwen3-8b-r0.10", 0.1, "baseline"), ("qwen3-8b-r0.10", 0.1, "dlfp"),
                           ("qwen3-8b-r0.25", 0.25, "dlfp")):
        v = _published(pub, exp, "slo_passes", arm)
        tol = PASS_TOL_ZERO if v == 0 else PASS_TOL
        out.append(Anchor(f"8B {rate:g} req/s {arm} SLO passes", "8b", "qwen3-8b", rate, f"slo_passes_{arm}", v,
                          v - tol, v + tol, "of 20 per seed", f"{exp}/slo_passes/{arm}"))
    e = "qwen3-0.6b-tp1"
    lo, hi = _published(pub, e, "p99_itl", "change_ci95_low"), _published(pub, e, "p99_itl", "change_ci95_high")
    out.append(Anchor("0.6B P99 ITL change", "0.6b", e, 1.0, "d_itl_pct", _published(pub, e, "p99_itl", "change_mean"),
                      lo, hi, "%", f"{e}/p99_itl/change_mean, CI"))
    v = _published(pub, e, "p99_ttft", "change_mean")
    out.append(Anchor("0.6B P99 TTFT change", "0.6b", e, 1.0, "d_ttft_pct", v, v - TTFT_TOL_PP, v + TTFT_TOL_PP, "%",
                      f"{e}/p99_ttft/change_mean"))
    v = _published(pub, e, "p99_e2el", "change_mean")
    out.append(Anchor("0.6B P99 E2EL change", "0.6b", e, 1.0, "d_e2el_pct", v, v - E2EL_TOL_PP, v + E2EL_TOL_PP, "%",
                      f"{e}/p99_e2el/change_mean + CI crosses 0"))
    return out


def consistency(cells: pd.DataFrame, anchor_list: list[Anchor]) -> pd.DataFrame:
    """One row per (anchor, workload) with the map's value, whether it holds and its error (tolerance units)."""
    rows = []
    for a in anchor_list:
        sub = at(cells, map=a.map, rate=a.rate)
        for _, r in sub.iterrows():
            rows.append({"anchor": a.name, "group": a.group, **{k: r[k] for k in WORKLOAD_KEYS},
                         "value": a.value(r), "published": a.published, "holds": a.holds(r), "error": a.error(r)})
    return pd.DataFrame(rows)


def anchor_table(cons: pd.DataFrame, anchor_list: list[Anchor]) -> pd.DataFrame:
    """Per anchor: published value and tolerance, workloads tested and consistent, the closest workload."""
    rows = []
    for a in anchor_list:
        sub = cons[cons["anchor"] == a.name]
        best = sub.loc[sub["error"].idxmin()] if len(sub) else None
        rows.append({"anchor": a.name, "published": a.published, "consistent_if": f"{a.low:.4g} .. {a.high:.4g}",
                     "unit": a.unit, "source": a.source, "workloads": len(sub), "consistent": int(sub["holds"].sum()),
                     "closest": "" if best is None else _label(best), "closest_value": np.nan if best is None
                     else float(best["value"])})
    return pd.DataFrame(rows)


def _label(r) -> str:
    return f"{r['source']} x{float(r['scale']):g} budget {int(r['budget'])}"


def intersection(cons: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Workloads consistent with every anchor in ``names`` (a workload missing an anchor is not consistent)."""
    sub = cons[cons["anchor"].isin(names)]
    agg = sub.groupby(WORKLOAD_KEYS, sort=False).agg(n=("holds", "size"), held=("holds", "sum"),
                                                     error=("error", "sum")).reset_index()
    return agg[(agg["n"] == len(names)) & (agg["held"] == len(names))].sort_values("error").reset_index(drop=True)


def best_workload(cons: pd.DataFrame, group: str, within: pd.DataFrame | None = None) -> pd.Series:
    """The workload that satisfies most anchors of ``group``, ties broken by the smallest summed error; only
    workloads listed in ``within`` (rows with ``WORKLOAD_KEYS``) when given."""
    sub = cons[cons["group"] == group]
    if within is not None:
        sub = sub.merge(within[WORKLOAD_KEYS].drop_duplicates(), on=WORKLOAD_KEYS)
    agg = sub.groupby(WORKLOAD_KEYS, sort=False).agg(held=("holds", "sum"), error=("error", "sum")).reset_index()
    return agg.sort_values(["held", "error"], ascending=[False, True]).iloc[0]


def cross_validate(cons: pd.DataFrame, anchor_list: list[Anchor]) -> pd.DataFrame:
    """Choose the workload from one group's anchors and report the other group's anchors at it."""
    rows = []
    for chosen_by, predicted in (("8b", "0.6b"), ("0.6b", "8b")):
        w = best_workload(cons, chosen_by, within=cons[cons["group"] == predicted])  # a workload both maps ran
        n_group = sum(a.group == chosen_by for a in anchor_list)
        for a in (x for x in anchor_list if x.group == predicted):
            hit = cons[(cons["anchor"] == a.name) & (cons["source"] == w["source"])
                       & np.isclose(cons["scale"].astype(float), float(w["scale"])) & (cons["budget"] == w["budget"])]
            rows.append({"chosen_by": f"{chosen_by.upper()} anchors ({int(w['held'])} of {n_group} hold)",
                         "workload": _label(w), "anchor": a.name, "published": a.published,
                         "predicted": float(hit["value"].iloc[0]) if len(hit) else np.nan,
                         "holds": bool(hit["holds"].iloc[0]) if len(hit) else False})
    return pd.DataFrame(rows)


__all__ = ["Anchor", "WORKLOAD_KEYS", "anchor_table", "anchors", "best_workload", "consistency", "cross_validate",
           "intersection"]
