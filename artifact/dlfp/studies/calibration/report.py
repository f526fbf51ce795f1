"""What ``dlfp calibrate`` shows of a fit: the residual figure and the coefficient table."""
from __future__ import annotations

import pandas as pd

#: device coefficient -> (unit, meaning), in ``DEVICE_TERMS`` order
DEVICE_TERM_UNITS = {"step_s": ("s/step", "fixed per-step cost"), "per_token_s": ("s/token", "per-token compute"),
                     "per_sampled_s": ("s/sampled row", "per-sequence compute (LM head, sampler)"),
                     "per_attn_pair_s": ("s/pair", "attention over context (causal query-key pairs)"),
                     "per_kv_token_s": ("s/cached token", "KV-cache read")}
#: marker colour per step kind
KIND_COLORS = {"decode": "tab:blue", "mixed": "tab:orange", "prefill": "tab:green"}


def residual_figure(steps: pd.DataFrame, title: str = "Calibrated CPU profile: fit residuals"):
    """Two panels: predicted vs measured ``execute_s`` (log-log, 1:1 line) and relative residual vs tokens.

    ``steps`` needs ``execute_s``, ``predicted_s``, ``tokens``, ``kind`` and ``held_out`` (from ``calibrate``).
    Returns the matplotlib Figure.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for (kind, ho), g in steps.groupby(["kind", "held_out"]):
        kw = dict(s=10, alpha=0.6, color=KIND_COLORS.get(kind, "grey"), marker="x" if ho else "o",
                  label=f"{kind} ({'held-out' if ho else 'fit'}, n={len(g)})")
        axes[0].scatter(g["execute_s"] * 1e3, g["predicted_s"] * 1e3, **kw)
        axes[1].scatter(g["tokens"], g["rel_residual"] * 100, **kw)
    lo = max(1e-1, float(min(steps["execute_s"].min(), steps["predicted_s"].min())) * 1e3 * 0.8)
    hi = float(max(steps["execute_s"].max(), steps["predicted_s"].max())) * 1e3 * 1.2
    axes[0].plot([lo, hi], [lo, hi], "k--", lw=1)
    axes[0].set(xscale="log", yscale="log", xlabel="measured step execute time (ms)",
                ylabel="modelled (ms)", title="modelled vs measured")
    axes[1].axhline(0, color="k", lw=1)
    axes[1].set(xscale="log", xlabel="scheduled tokens in the step", ylabel="residual (modelled/measured - 1, %)",
                title="relative residual")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def coefficient_table(profile: dict) -> pd.DataFrame:
    """The fitted profile as a table: part, term, value, unit, meaning (device then host).

    Raises:
        KeyError: a device coefficient outside ``DEVICE_TERM_UNITS``.
    """
    rows = [("device", k, v, *DEVICE_TERM_UNITS[k]) for k, v in profile["fitted"].items()]
    rows += [("host", k, v, "s", "HostCosts field") for k, v in profile["host"].items()]
    return pd.DataFrame(rows, columns=["part", "term", "value", "unit", "meaning"])
