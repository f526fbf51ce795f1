"""What ``dlfp calibrate`` shows of a fit: the residual figure, the coefficient table and the cost form
(``cost_form.md``)."""
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


def _us(v: float) -> str:
    """A duration (s) in the unit that reads best: ms from 1 ms, else us."""
    return f"{v * 1e3:.2f} ms" if v >= 1e-3 else f"{v * 1e6:.1f} us"


def cost_form_markdown(profile: dict) -> str:
    """The fitted cost form as Markdown: one row per part of vLLM's step, its simulator term, the fitted value and
    the part's measured median per step; then the fit quality of the device time and of the whole step.

    ``profile``: the profile dict ``write_profile`` writes (``fitted``, ``host``, ``fit.grid.part_medians_s``,
    ``fit.in_sample``, ``fit.held_out``, ``fit.grid.whole_step``, ``machine``). Times from seconds.

    Raises:
        KeyError: a profile without those fields (one written before the parts were timed).
    """
    f, h, g = profile["fitted"], profile["host"], profile["fit"]["grid"]
    med = g["part_medians_s"]
    heads = ", ".join(f"{_us(v)} ({int(r)} row{'s' if int(r) > 1 else ''})"
                      for r, v in list(zip(f.get("lm_head_rows") or (), f.get("lm_head_s") or ()))[:4])
    rows = [
        ("`Scheduler.schedule()`", "`schedule_base_s` + `schedule_per_req_s` x (running + scheduled)",
         f"{_us(h['schedule_base_s'])} + {_us(h['schedule_per_req_s'])}", med["schedule_cost_s"]),
        ("executor dispatch + `GPUModelRunner._update_states` + `_prepare_inputs`",
         "`prep_*` (base, per request, per token)",
         f"{_us(h['prep_base_s'])} + {_us(h['prep_per_req_s'])} + {h['prep_per_token_s'] * 1e6:.3f} us",
         med["prep_s"]),
        ("`GPUModelRunner._model_forward`", "`step_s` + `per_token_s` x tokens + `per_attn_pair_s` x causal pairs + "
         "`per_kv_token_s` x cached tokens", f"{_us(f['step_s'])} + {_us(f['per_token_s'])} + "
         f"{f['per_attn_pair_s'] * 1e6:.3f} us + {f['per_kv_token_s'] * 1e6:.3f} us", med["forward_s"]),
        ("`compute_logits` (LM head, one row per scheduled request)", "`lm_head_s` table by row count",
         heads + ", ...", med["logits_s"]),
        ("`GPUModelRunner._sample`", "in `step_s` + `per_sampled_s` x rows", f"{_us(f['per_sampled_s'])} per row",
         med["sample_s"]),
        ("rest of `sample_tokens` (`_bookkeeping_sync`, `ModelRunnerOutput`)",
         "`bookkeeping_base_s` + `bookkeeping_per_req_s`",
         f"{_us(h['bookkeeping_base_s'])} + {_us(h['bookkeeping_per_req_s'])}", med["bookkeeping_s"]),
        ("`Scheduler.update_from_output()`", "`update_base_s` + `update_per_req_s`",
         f"{_us(h['update_base_s'])} + {_us(h['update_per_req_s'])}", med["update_s"]),
        ("`_process_engine_step` after the step + `_process_input_queue`", "`engine_loop_s`",
         _us(h["engine_loop_s"]), med["loop_s"]),
    ]
    lines = ["| part (vLLM 0.17.1) | simulator term | fitted value | median per step |", "|---|---|---|---:|"]
    lines += [f"| {a} | {b} | {c} | {_us(d)} |" for a, b, c, d in rows]
    lines.append(f"| engine -> token at the client; client -> scheduler | `frontend_output_s`, `ingest_s` | "
                 f"{_us(h['frontend_output_s'])}, {_us(h['ingest_s'])} | |")
    fit = profile["fit"]
    whole = g.get("whole_step", {}).get("held_out", {})
    ci = g.get("phase_ci") or {}
    if ci:
        n = fit["in_sample"]["n"] + fit["held_out"]["n"]
        ph = g["phases"]
        held = sum(1 for x in ph if x.get("held_out")) if isinstance(ph, list) else 0
        nph = len(ph) if isinstance(ph, list) else int(ph)
        med_hw, max_hw = ci["median_rel_halfwidth"] * 100, ci["max_rel_halfwidth"] * 100
        lines += ["", f"The grid: {nph} phases ({held} held out: their shapes are only predicted) x {g['repeats']} "
                  f"repeats, {n:,} timed steps. A phase's mean "
                  f"step time moves between repeats by a median 95 % half-width of {med_hw:.0f} % (at most "
                  f"{max_hw:.0f} %)."]
    lines += ["", "| residual of the modelled time, \\|modelled / measured - 1\\| | steps | median | 90th percentile |",
              "|---|---:|---:|---:|"]
    for label, r in (("device time, in-sample shapes", fit["in_sample"]), ("device time, held-out shapes",
                                                                        fit["held_out"]),
                     ("whole step (prep + device + bookkeeping), held-out shapes", whole)):
        if r:
            lines.append(f"| {label} | {r['n']:,} | {r['median_abs'] * 100:.1f} % | {r['p90_abs'] * 100:.1f} % |")
    return "\n".join(lines) + "\n"
