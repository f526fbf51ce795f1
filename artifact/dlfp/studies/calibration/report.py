"""What ``dlfp calibrate`` shows of a fit: the residual figure and the coefficient table."""
from __future__ import annotations

import pandas as pd

#: device coefficient -> (unit, meaning), in ``DEVICE_TERMS`` order
DEVICE_TERM_UNITS = {"step_s": ("s/step", "fixed per-step cost"), "per_token_s": ("s/token", "per-token compute"),
                     "per_sampled_s": ("s/row", "per-sequence compute (sampler; also the LM head without a table)"),
                     "per_attn_pair_s": ("s/pair", "attention over context (causal query-key pairs)"),
                     "per_kv_token_s": ("s/cached token", "KV-cache read")}
#: marker colour per step kind
KIND_COLORS = {"decode": "tab:blue", "mixed": "tab:orange", "prefill": "tab:green"}


def residual_figure(steps: pd.DataFrame, title: str = "Calibrated CPU profile: fit residuals"):
    """Two panels: predicted vs measured device time (log-log, 1:1 line) and relative residual vs tokens.

    ``steps`` needs ``predicted_s``, ``tokens``, ``kind``, ``held_out`` (from ``calibrate``) and the measured time
    the device model was fitted to: ``device_s`` (the model runner's forward pass, LM head and sampler) when
    present, else ``execute_s`` (the whole step). Returns the matplotlib Figure.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    col = "device_s" if "device_s" in steps and steps["device_s"].notna().any() else "execute_s"
    what = "device time (forward + LM head + sampler)" if col == "device_s" else "step execute time"
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for (kind, ho), g in steps.groupby(["kind", "held_out"]):
        kw = dict(s=10, alpha=0.6, color=KIND_COLORS.get(kind, "grey"), marker="x" if ho else "o",
                  label=f"{kind} ({'held-out' if ho else 'fit'}, n={len(g)})")
        axes[0].scatter(g[col] * 1e3, g["predicted_s"] * 1e3, **kw)
        axes[1].scatter(g["tokens"], g["rel_residual"] * 100, **kw)
    lo = max(1e-1, float(min(steps[col].min(), steps["predicted_s"].min())) * 1e3 * 0.8)
    hi = float(max(steps[col].max(), steps["predicted_s"].max())) * 1e3 * 1.2
    axes[0].plot([lo, hi], [lo, hi], "k--", lw=1)
    axes[0].set(xscale="log", yscale="log", xlabel=f"measured {what} (ms)",
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
    fitted = profile["fitted"]
    rows = [("device", k, v, *DEVICE_TERM_UNITS[k]) for k, v in fitted.items() if not k.startswith("lm_head")]
    rows += [("device", f"lm_head_s[{int(r)} rows]", v, "s", "LM head (compute_logits) at this row count")
             for r, v in zip(fitted.get("lm_head_rows") or (), fitted.get("lm_head_s") or ())]
    rows += [("host", k, v, "s", "HostCosts field") for k, v in profile["host"].items()]
    return pd.DataFrame(rows, columns=["part", "term", "value", "unit", "meaning"])
