"""Heat maps of a workload map: sign and size of DLFP's paired effect over prompt scale x request rate.

One figure per (map, metric): a grid of panels, one row per prompt-length source and one column per token
budget; in each panel x = request rate (req/s), y = prompt scale, colour = the mean paired change (percent,
diverging around 0: blue = DLFP lower, red = DLFP higher, clipped at +-100 %), the value written in each cell.
Marked: the shipped assumption (scale 1.0 of the Mooncake conversation quantiles at budget 8,192: a black box at
each paper rate), the paper's rates (bold tick labels), and the contour where the baseline's stalled-gap share
crosses 1 % (dashed), the knife edge of the pooled P99.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlfp.studies.map.grid import SHIPPED, MapSpec

METRIC_LABELS = {"d_itl_pct": "P99 ITL change (%)", "d_ttft_pct": "P99 TTFT change (%)",
                 "d_e2el_pct": "P99 E2EL change (%)", "d_itl_armmean_pct": "P99 ITL change of arm means (%)"}
CLIP_PCT = 100.0
STALL_EDGE = 0.01


def _panel(ax, sub: pd.DataFrame, spec: MapSpec, metric: str, budget: int, source: str):
    rates, scales = list(spec.rates), list(spec.scales)
    z = np.full((len(scales), len(rates)), np.nan)
    stall = np.full_like(z, np.nan)
    for _, r in sub.iterrows():
        i, j = scales.index(float(r["scale"])), rates.index(float(r["rate"]))
        z[i, j], stall[i, j] = r[metric], r["stall_frac_baseline"]
    im = ax.imshow(np.clip(z, -CLIP_PCT, CLIP_PCT), origin="lower", cmap="RdBu_r", vmin=-CLIP_PCT, vmax=CLIP_PCT,
                   aspect="auto")
    for i in range(len(scales)):
        for j in range(len(rates)):
            if np.isfinite(z[i, j]):
                ax.text(j, i, f"{z[i, j]:+.0f}", ha="center", va="center", fontsize=6,
                        color="white" if abs(z[i, j]) > 60 else "black")
    if np.isfinite(stall).sum() >= 4 and np.nanmin(stall) < STALL_EDGE < np.nanmax(stall):
        ax.contour(np.arange(len(rates)), np.arange(len(scales)), stall, levels=[STALL_EDGE], colors="k",
                   linestyles="--", linewidths=1.0)
    ax.set_xticks(range(len(rates)), [f"{r:g}" for r in rates], fontsize=7)
    for lab, r in zip(ax.get_xticklabels(), rates):
        if any(np.isclose(r, p) for p in spec.paper_rates):
            lab.set_fontweight("bold")
    ax.set_yticks(range(len(scales)), [f"{s:g}" for s in scales], fontsize=7)
    if source == SHIPPED["source"] and budget == SHIPPED["budget"] and SHIPPED["scale"] in scales:
        i = scales.index(SHIPPED["scale"])
        for p in spec.paper_rates:
            if any(np.isclose(p, r) for r in rates):
                j = int(np.argmin([abs(p - r) for r in rates]))
                ax.add_patch(_box(j, i))
    return im


def _box(j: int, i: int):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2.0)


def heatmap(cells: pd.DataFrame, spec: MapSpec, metric: str = "d_itl_pct"):
    """The figure for one map and metric (matplotlib ``Figure``), from its cell table."""
    import matplotlib.pyplot as plt

    sub = cells[cells["map"] == spec.name]
    nr, nc = len(spec.sources), len(spec.budgets)
    fig, axes = plt.subplots(nr, nc, figsize=(2.8 * nc + 2.2, 2.4 * nr + 1.2), squeeze=False, sharex=True,
                             sharey=True, layout="constrained")
    im = None
    for a, src in enumerate(spec.sources):
        for b, budget in enumerate(spec.budgets):
            ax = axes[a][b]
            im = _panel(ax, sub[(sub["source"] == src) & (sub["budget"] == budget)], spec, metric, budget, src)
            if a == 0:
                ax.set_title(f"budget {budget:,}", fontsize=9)
            if b == 0:
                ax.set_ylabel(f"{src}\nprompt scale", fontsize=7)
            if a == nr - 1:
                ax.set_xlabel("rate (req/s)", fontsize=8)
    fig.colorbar(im, ax=axes, shrink=0.5, label=f"clipped at +-{CLIP_PCT:.0f} %")
    fig.suptitle(f"{spec.name}: DLFP {METRIC_LABELS.get(metric, metric)}, mean of {len(spec.seeds)} paired seeds\n"
                 f"box: shipped assumption at the paper's rate; dashed: baseline stalled gaps = 1 %", fontsize=8)
    return fig


__all__ = ["CLIP_PCT", "METRIC_LABELS", "STALL_EDGE", "heatmap"]
