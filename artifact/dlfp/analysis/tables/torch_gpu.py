"""The torch backend on a real GPU: what the measurements answer, rendered from the traces and the step costs.

Four tables in one Markdown file (``torch_gpu.md``), each also as a CSV:

* ``torch_gpu_device_model``: the kernel device model (``dlfp.devices.kernel_model``, the experiment's GPU
  datasheet) against the GPU's own time of every iteration of the torch traces (CUDA events), by chunk-size band:
  median and P90 of the relative error ``|predicted / measured - 1|`` and the median signed error. Target: median
  <= 10 % for chunks of 512 tokens and more. Step costs (``step_costs.csv``: fixed batch shapes, the attention mode
  the runs used) are compared the same way, shape by shape.
* ``torch_gpu_decoupling``: per trial, Pearson r of the host interval (scheduler call to scheduler call) with the
  iteration's own device time and with the previous iteration's, over every iteration and over the guarded ones,
  and the median of host interval minus own device time (the lag).
* ``torch_gpu_effects``: each arm against the baseline of the same experiment and seed: P99 ITL, P99 TTFT (ms),
  their relative change and the share of token ids equal to the baseline's.
* ``torch_gpu_anchors``: whether a Qwen3-8B chunk of 3,072 or 6,144 tokens beside 16 decodes takes the paper's
  281-707 ms (DLFP's 8B P99 ITL at 0.10 and 0.25 req/s), from the step costs and from the traces' largest mixed
  iterations.

Only trials that ran on CUDA count (``metadata["torch"]["device"] == "cuda"``). Without any, every table is one row
saying ``pending: no GPU lent``. Seconds in the traces, milliseconds in the tables.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dlfp.analysis import metrics
from dlfp.analysis.markdown import atomic_write, to_markdown, write_table
from dlfp.analysis.tables.loading import TraceSet, guarded_of
from dlfp.analysis.tables.root_cause import _pearson
from dlfp.paths import REPO_ROOT

#: Where the GPU run's step costs are kept (``benchmarks/gpu/step_costs.py`` output on the lent H200).
STEP_COSTS_CSV = REPO_ROOT / "data" / "gpu-measurements" / "h200" / "step_costs.csv"
#: Chunk-size bands of the device-model table (prefill tokens of an iteration; 0 = decodes only).
BANDS = ((0, 0, "decodes only"), (1, 511, "1-511"), (512, 2047, "512-2,047"), (2048, 4095, "2,048-4,095"),
         (4096, 1 << 30, "4,096+"))
#: DLFP's Qwen3-8B P99 ITL in the paper (ms): 281 at 0.10 req/s, 707 at 0.25 req/s.
ANCHORS_MS = (281.0, 707.0)
#: The attention mode of traces written before the mode was recorded (the code then had only this one).
DEFAULT_ATTENTION = "gqa-padded"
PENDING = "pending: no GPU lent"


def _gpu_trials(ts: TraceSet):
    return [lt for lt in ts.trials if lt.backend == "torch"
            and (lt.trial.metadata.get("torch") or {}).get("device") == "cuda"]


def _attention(md: dict) -> str:
    return ((md.get("torch") or {}).get("attention") or {}).get("chosen", DEFAULT_ATTENTION)


def _band(tokens: int) -> str:
    return next(name for lo, hi, name in BANDS if lo <= tokens <= hi)


def _predict(model: str, gpu: str, chunks, num_decodes: int, decode_context: int) -> float:
    """Kernel-model device time (s) of one iteration: chunks ``[(new, cached)]`` and ``num_decodes`` decodes whose
    cached tokens sum to ``decode_context`` (the model reads their count and summed context only)."""
    from dlfp.devices.batch import Batch
    from dlfp.devices.roofline import device_model

    dec = [] if not num_decodes else [(decode_context + num_decodes) / num_decodes] * num_decodes
    batch = Batch(prefill=[(int(c), int(p)) for c, p in chunks], decodes=dec)
    return device_model(model, gpu, 1, kind="kernel").time_batch(batch)[0]


def iteration_errors(ts: TraceSet) -> pd.DataFrame:
    """One row per iteration of every GPU torch trial: measured and predicted device time (s), band, error."""
    rows = []
    for lt in _gpu_trials(ts):
        md, it = lt.trial.metadata, lt.trial.iterations
        cfg = md["config"]
        b = md["torch"]["batches"]
        for i, (ch, dctx) in enumerate(zip(b["chunks"], b["decode_context"])):
            meas = float(it["device_time_s"].iat[i])
            pred = _predict(cfg["model"], cfg["gpu"], ch, int(it["num_decodes"].iat[i]), int(dctx))
            rows.append({"experiment": lt.experiment, "arm": lt.arm, "seed": lt.seed, "model": cfg["model"],
                         "gpu": md["hardware"]["gpu"]["name"], "attention": _attention(md),
                         "band": _band(int(it["prefill_tokens"].iat[i])), "measured_s": meas, "predicted_s": pred,
                         "error": pred / meas - 1.0})
    return pd.DataFrame(rows)


def device_model_table(ts: TraceSet) -> pd.DataFrame:
    """Per model and band: iterations, median measured and predicted (ms), median and P90 |error|, median signed
    error (%), and the target where it applies (chunks of 512 tokens and more: median |error| <= 10 %)."""
    e = iteration_errors(ts)
    if e.empty:
        return pd.DataFrame([{"model": PENDING}])
    rows = []
    for (model, gpu, att), g in e.groupby(["model", "gpu", "attention"], sort=True):
        for _lo, _hi, band in BANDS:
            x = g[g["band"] == band]
            if x.empty:
                continue
            ae = x["error"].abs()
            big = band not in ("decodes only", "1-511")
            rows.append({"model": model, "gpu": gpu, "attention": att, "chunk_tokens": band, "iterations": len(x),
                         "measured_p50_ms": metrics.to_ms(x["measured_s"].median()),
                         "predicted_p50_ms": metrics.to_ms(x["predicted_s"].median()),
                         "abs_error_p50_pct": 100 * ae.median(), "abs_error_p90_pct": 100 * ae.quantile(0.9),
                         "signed_error_p50_pct": 100 * x["error"].median(),
                         "target": "<= 10 %" if big else "",
                         "meets_target": ("yes" if 100 * ae.median() <= 10 else "no") if big else ""})
    return pd.DataFrame(rows)


def step_cost_table(path: Path = STEP_COSTS_CSV, modes: tuple[str, ...] = (DEFAULT_ATTENTION,)) -> pd.DataFrame:
    """Per model and batch shape of ``step_costs.csv`` (in ``modes``): host launch and device ms measured, the
    kernel model's ms, and the error (%)."""
    if not Path(path).is_file():
        return pd.DataFrame([{"model": PENDING}])
    sc = pd.read_csv(path)
    sc = sc[sc["mode"].isin(modes)]
    rows = []
    for r in sc.itertuples():
        chunks = [(int(r.chunk), int(r.prior))] if r.chunk else []
        d, ctx = int(r.decodes), int(r.decode_context)
        long_ctx = int(r.long_decode_context)
        # step_costs' decodes sit at their context (the new token is the context's last): cached = context - 1
        cached = d * (ctx - 1) + (long_ctx - 1 if long_ctx else 0)
        pred = _predict(r.model, "h200", chunks, d + (1 if long_ctx else 0), cached)
        rows.append({"model": r.model, "attention": r.mode, "shape": r.shape, "launch_ms": r.launch_ms,
                     "device_ms": r.device_ms, "predicted_ms": metrics.to_ms(pred),
                     "error_pct": 100 * (metrics.to_ms(pred) / r.device_ms - 1)})
    return pd.DataFrame(rows)


def decoupling_table(ts: TraceSet) -> pd.DataFrame:
    """Per GPU trial: host interval against own and previous device time (r), all iterations and guarded ones,
    and the median lag (host interval minus own device time, ms)."""
    rows = []
    for lt in _gpu_trials(ts):
        it = lt.trial.iterations.sort_values("iteration", kind="stable")
        h, d = it["host_interval_s"].to_numpy(float), it["device_time_s"].to_numpy(float)
        p = np.r_[np.nan, d[:-1]]
        g = guarded_of(ts, lt)
        rows.append({"experiment": lt.experiment, "arm": lt.arm, "seed": lt.seed,
                     "scheduling": lt.trial.metadata["config"]["scheduling"], "iterations": len(it),
                     "r_own": _pearson(h, d), "r_prev": _pearson(h, p),
                     "guarded": len(g), "guarded_r_own": _pearson(g["host_interval_s"].to_numpy(float),
                                                                  g["device_time_s"].to_numpy(float)),
                     "guarded_r_prev": _pearson(g["host_interval_s"].to_numpy(float),
                                                g["prev_device_time_s"].to_numpy(float)),
                     "lag_p50_ms": metrics.to_ms(np.nanmedian(h - d)),
                     "host_interval_p50_ms": metrics.to_ms(np.nanmedian(h)),
                     "device_time_p50_ms": metrics.to_ms(np.nanmedian(d))})
    return pd.DataFrame(rows) if rows else pd.DataFrame([{"experiment": PENDING}])


def effects_table(ts: TraceSet) -> pd.DataFrame:
    """Each arm against its experiment's baseline, seed by seed: P99 ITL and TTFT (ms), change (%), ids equal."""
    from dlfp.analysis.tables.trial_frames import token_agreement

    trials = _gpu_trials(ts)
    rows = []
    for lt in trials:
        base = next((b for b in trials if b.experiment == lt.experiment and b.seed == lt.seed
                     and b.arm == ts.baseline_arm(lt.backend, lt.experiment)), None)
        if base is None:
            continue
        s, sb = metrics.summarize(lt.trial), metrics.summarize(base.trial)
        equal, total = token_agreement(base.trial, lt.trial)
        rows.append({"experiment": lt.experiment, "arm": lt.arm, "seed": lt.seed,
                     "p99_itl_ms": metrics.to_ms(s["itl_p99_s"]), "p99_ttft_ms": metrics.to_ms(s["ttft_p99_s"]),
                     "p99_itl_change_pct": 100 * (s["itl_p99_s"] / sb["itl_p99_s"] - 1),
                     "p99_ttft_change_pct": 100 * (s["ttft_p99_s"] / sb["ttft_p99_s"] - 1),
                     "token_ids_equal": f"{equal:,}/{total:,}"})
    return pd.DataFrame(rows) if rows else pd.DataFrame([{"experiment": PENDING}])


def anchors_table(ts: TraceSet, path: Path = STEP_COSTS_CSV) -> pd.DataFrame:
    """Qwen3-8B chunks beside 16 decodes against the paper's 281-707 ms: step costs and traced iterations."""
    lo, hi = ANCHORS_MS
    rows = []
    if Path(path).is_file():
        sc = pd.read_csv(path)
        sc = sc[(sc["model"] == "qwen3-8b") & (sc["mode"] == DEFAULT_ATTENTION) & (sc["chunk"] > 0)]
        for r in sc.itertuples():
            rows.append({"source": "step costs", "what": f"chunk {int(r.chunk):,} after {int(r.prior):,} cached, "
                                                        f"{int(r.decodes)} decodes", "device_ms": r.device_ms,
                         "in_281_707_ms": "yes" if lo <= r.device_ms <= hi else "no"})
    for lt in _gpu_trials(ts):
        if lt.trial.metadata["config"]["model"] != "qwen3-8b":
            continue
        it = lt.trial.iterations
        mixed = it[(it["prefill_tokens"] > 0) & (it["num_decodes"] >= 16)]
        if mixed.empty:
            continue
        top = mixed.loc[mixed["device_time_s"].idxmax()]
        ms = metrics.to_ms(float(top["device_time_s"]))
        rows.append({"source": f"trace {lt.experiment} {lt.arm} seed {lt.seed}",
                     "what": f"largest mixed iteration: {int(top['prefill_tokens']):,} prefill tokens, "
                             f"{int(top['num_decodes'])} decodes", "device_ms": ms,
                     "in_281_707_ms": "yes" if lo <= ms <= hi else "no"})
    return pd.DataFrame(rows) if rows else pd.DataFrame([{"source": PENDING}])


NOTES = [
    "The torch backend runs the simulator's scheduler and policies over a random-weight Qwen3 in eager PyTorch "
    "(BF16, no CUDA graphs, no FlashAttention: SDPA refused its flash kernel for these shapes on the H200), so its "
    "step times are this implementation's, not vLLM's; they are real device times of the batches the policies chose.",
    "Token ids: greedy from real logits. With random weights the top two logits are often within BF16 rounding, "
    "and batch shapes (which differ between arms and between runs of one arm on a real clock) change the rounding: "
    "agreement across arms is low and is no evidence either way about DLFP.",
    "Single seed (801): changes are one seed's, without an interval.",
]


def write_torch_gpu(ts: TraceSet, results_dir: str | Path, step_costs: Path = STEP_COSTS_CSV) -> dict:
    """Write the four tables (CSV each) and ``torch_gpu.md`` (all four); returns them by name."""
    results_dir = Path(results_dir)
    tables = {"torch_gpu_device_model": device_model_table(ts), "torch_gpu_step_costs": step_cost_table(step_costs),
              "torch_gpu_decoupling": decoupling_table(ts), "torch_gpu_effects": effects_table(ts),
              "torch_gpu_anchors": anchors_table(ts, step_costs)}
    titles = {"torch_gpu_device_model": "Kernel device model against the GPU's own iteration times (torch traces)",
              "torch_gpu_step_costs": "Kernel device model against measured step costs, by batch shape",
              "torch_gpu_decoupling": "Host interval against device time on a real GPU",
              "torch_gpu_effects": "DLFP and DLFP-G against the baseline on a real GPU",
              "torch_gpu_anchors": "Does a Qwen3-8B chunk beside 16 decodes take the paper's 281-707 ms?"}
    md = "# The torch backend on a real GPU\n\n"
    for name, df in tables.items():
        write_table(df, results_dir, name)
        md += f"## {titles[name]}\n\n" + to_markdown(df) + "\n"
    md += "".join(f"- {n}\n" for n in NOTES)
    atomic_write(results_dir / "torch_gpu.md", md)
    return tables


__all__ = ["ANCHORS_MS", "BANDS", "PENDING", "STEP_COSTS_CSV", "anchors_table", "decoupling_table",
           "device_model_table", "effects_table", "iteration_errors", "step_cost_table", "write_torch_gpu"]
