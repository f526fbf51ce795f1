"""Hold the device cost model against measured GPU operator times (Vidur's profiles, ``data/gpu-profiles/vidur``).

``write_device_tables(out_dir)`` (or ``python -m dlfp.studies.device [--out DIR]``) writes:

* ``fitted_constants.csv``: the constants of ``dlfp/devices/operators.yaml`` refitted by
  ``dlfp.studies.device_fit`` (scipy least squares on ``log(predicted / measured)``), with the data each was
  fitted on (the H100's own GEMM and elementwise sections included);
* ``operator_errors.csv`` / ``.md``: per profile file, TP degree, operator family (projections, elementwise,
  all-reduce) and band of token count (message size for all-reduce): median and worst absolute relative error
  ``|predicted / measured - 1|`` of today's roofline (``before``: ``dlfp.devices.roofline`` with default
  ``DeviceAssumptions``) and of the operator model (``after``), and whether the rows were fitted or held out;
* ``spot_check.csv`` / ``.md``: Llama-3-8B on A100, TP=1: fraction of the 312 TFLOP/s peak reached by the four
  projection GEMMs, measured and predicted;
* ``chunking.csv`` / ``.md``: predicted time to prefill a 16,384-token prompt in chunks alongside 16 decodes,
  Qwen3-8B on A100 (a model prediction: no measurement exists);
* ``operators.png`` / ``.pdf``: predicted against measured per operator family, log-log;
* ``h100_prefill.md`` and its CSVs (``dlfp.studies.h100_prefill``): the H100/A100 ratio the profiles measure, the
  error of the shared and of the H100's own constants on the H100 rows, and the modelled prefill speed-up.

Units: seconds in code, milliseconds in the written tables. Writes are atomic (temporary file in the same
directory, then ``os.replace``) and the outputs are deterministic (byte-identical on rerun).

"Before" per operator: a projection GEMM takes ``max(2 M N K / (peak * linear_flops_eff), N K b / (hbm *
mem_bw_eff)) + kernel_gap_s`` (the linear-layer roofline and per-kernel gap of ``DeviceModel`` applied per
GEMM); an elementwise kernel takes ``kernel_gap_s`` (today's model has no other term for it: its bytes sit
inside the weight-read maximum); an all-reduce takes ``allreduce_latency_s + 2 (n-1)/n S / (nvlink / 2)``.
Errors are pooled over the operators of a family (each operator of each row is one point).
"""
from __future__ import annotations

import argparse
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd

from dlfp.analysis.figures import atomic_savefig
from dlfp.analysis.markdown import atomic_write
from dlfp.devices.roofline import DeviceAssumptions, load_gpu, load_model
from dlfp.devices import attention as att
from dlfp.devices import operators as ops
from dlfp.studies.device_fit import (  # noqa: F401  (re-exported: the study's former names)
    ALLREDUCE_FILE, ALLREDUCE_TOPOLOGY, AR_FIT_GPUS, COMPUTE_FILES, EW_FIT, GEMM_FIT, H100, H100_EW_FIT,
    H100_GEMM_FIT, PROFILES, REPO, _predict, constants_from_fit, fit_allreduce, fit_constants, fit_elementwise,
    fit_gemm, fitted_constants_frame, is_fit, load_allreduce_profile, load_compute_profile)

DEFAULT_OUT = REPO / "data" / "results" / "device"
TOKEN_BANDS = ((1, 64, "1-64"), (65, 512, "65-512"), (513, 4096, "513-4,096"), (4097, 10**9, ">4,096"))
KIB, MIB = 1024, 1024**2
SIZE_BANDS = ((0, 64 * KIB, "<=64 KiB"), (64 * KIB + 1, MIB, "64 KiB-1 MiB"), (MIB + 1, 16 * MIB, "1-16 MiB"),
              (16 * MIB + 1, 10**15, ">16 MiB"))
SPOT_TOKENS = (128, 512, 1024, 2048, 4096, 8192, 16384)
CHUNKS = (256, 512, 1024, 2048, 4096, 8192)
PROMPT, N_DECODES, DECODE_CONTEXT = 16384, 16, 8192


# ---- today's roofline, per operator -------------------------------------------------------------------------
def before_time(shape: ops.LayerShape, gpu_key: str, op: str, tokens: int, tp: int,
                a: DeviceAssumptions | None = None) -> float:
    """Today's ``DeviceModel`` terms for one operator (seconds); see the module docstring."""
    a = a or DeviceAssumptions()
    gpu = load_gpu(gpu_key)
    if op in ops.GEMM_OPS:
        n, k = shape.gemm_nk(op, tp)
        return max(2.0 * tokens * n * k / (gpu.peak_flops * a.linear_flops_eff),
                   shape.dtype_bytes * n * k / (gpu.hbm_bw * a.mem_bw_eff)) + a.kernel_gap_s
    return a.kernel_gap_s


def before_allreduce(size_bytes: float, n: int, a: DeviceAssumptions | None = None) -> float:
    """Today's all-reduce time (s): ``allreduce_latency_s + 2 (n-1)/n S / (nvlink / 2)`` on the A100."""
    a = a or DeviceAssumptions()
    return a.allreduce_latency_s + ops.ring_allreduce_bytes(size_bytes, n) / load_gpu("a100-sxm4-80gb").link_bw_one_way


def predictions(c: ops.OperatorConstants, root: Path = PROFILES) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-point predictions: ``(compute, allreduce)`` frames with ``measured_s, before_s, after_s, split``."""
    parts = []
    for rel, (gpu_key, _) in COMPUTE_FILES.items():
        shape, f = load_compute_profile(rel, root)
        f = f.copy()
        f.insert(0, "file", rel)
        f["family"] = np.where(f.op.isin(ops.GEMM_OPS), "projections", "elementwise")
        f["after_s"] = _predict(f, shape, gpu_key, c)
        f["before_s"] = [before_time(shape, gpu_key, op, n, tp) for op, n, tp in zip(f.op, f.num_tokens, f.tp)]
        f["split"] = ["fit" if is_fit(rel, tp, op) else "held-out" for tp, op in zip(f.tp, f.op)]
        parts.append(f)
    comp = pd.concat(parts, ignore_index=True)
    ar = load_allreduce_profile(root)
    m = ops.OperatorModel(ops.LayerShape("x", 1, 1, 1, 1, 1, True), load_gpu("a100-sxm4-80gb"), c)
    ar["after_s"] = [m.allreduce_time(s, n, ALLREDUCE_TOPOLOGY) for s, n in zip(ar.size_bytes, ar.n_gpus)]
    ar["before_s"] = [before_allreduce(s, n) for s, n in zip(ar.size_bytes, ar.n_gpus)]
    ar["split"] = np.where(ar.n_gpus.isin(AR_FIT_GPUS), "fit", "held-out")
    return comp, ar


def _band(x: int, bands) -> str:
    for lo, hi, name in bands:
        if lo <= x <= hi:
            return name
    raise ValueError(f"no band for {x}")


def error_table(comp: pd.DataFrame, ar: pd.DataFrame) -> pd.DataFrame:
    """Median and worst ``|pred/meas - 1|`` per file, TP, family, band, before and after, with targets.

    Target for the operator model (projections and elementwise): median <= 0.10 in bands above 512 tokens,
    <= 0.20 below; none for all-reduce.
    """
    rows = []
    c = comp.assign(band=[_band(n, TOKEN_BANDS) for n in comp.num_tokens])
    order = {b[2]: i for i, b in enumerate(TOKEN_BANDS)}
    for (rel, tp, fam, _split), g in c.groupby(["file", "tp", "family", "split"], sort=False):
        for band, gb in sorted(g.groupby("band"), key=lambda kv: order[kv[0]]):
            eb = (gb.before_s / gb.measured_s - 1).abs()
            ea = (gb.after_s / gb.measured_s - 1).abs()
            target = 0.10 if order[band] >= 2 else 0.20
            rows.append((rel, COMPUTE_FILES[rel][0], int(tp), fam, band, len(gb), gb.split.iloc[0],
                         eb.median(), eb.max(), ea.median(), ea.max(), target,
                         "yes" if ea.median() <= target else "no"))
    a = ar.assign(band=[_band(s, SIZE_BANDS) for s in ar.size_bytes])
    order = {b[2]: i for i, b in enumerate(SIZE_BANDS)}
    for n, g in a.groupby("n_gpus"):
        for band, gb in sorted(g.groupby("band"), key=lambda kv: order[kv[0]]):
            eb = (gb.before_s / gb.measured_s - 1).abs()
            ea = (gb.after_s / gb.measured_s - 1).abs()
            rows.append((ALLREDUCE_FILE, "a100-sxm4-80gb", int(n), "all-reduce", band, len(gb), gb.split.iloc[0],
                         eb.median(), eb.max(), ea.median(), ea.max(), float("nan"), "-"))
    cols = ["file", "gpu", "tp", "family", "band", "points", "split", "before_median", "before_worst",
            "after_median", "after_worst", "target_median", "target_met"]
    return pd.DataFrame(rows, columns=cols)


def spot_check(comp: pd.DataFrame) -> pd.DataFrame:
    """Llama-3-8B, A100, TP=1: fraction of the 312 TFLOP/s peak of the four projections, measured and predicted.

    ``fraction = sum of 2 M N K / (sum of times * peak)``; duplicate rows of a token count are averaged.
    """
    rel = "a100/Meta-Llama-3-8B_mlp.csv"
    shape = ops.LayerShape.from_csv_row(pd.read_csv(PROFILES / rel, nrows=1).iloc[0])
    peak = load_gpu("a100-sxm4-80gb").peak_flops
    f = comp.query("file == @rel and tp == 1 and family == 'projections'")
    rows = []
    for n in SPOT_TOKENS:
        g = f[f.num_tokens == n]
        k = len(g) // len(ops.GEMM_OPS)
        flops = sum(2.0 * n * a * b for a, b in (shape.gemm_nk(op, 1) for op in ops.GEMM_OPS))
        meas, bef, aft = (g[c].sum() / k for c in ("measured_s", "before_s", "after_s"))
        rows.append((n, flops / (meas * peak), flops / (bef * peak), flops / (aft * peak), bef / meas - 1,
                     aft / meas - 1))
    return pd.DataFrame(rows, columns=["num_tokens", "measured_fraction", "before_fraction", "after_fraction",
                                       "before_rel_error", "after_rel_error"])


def chunking_table(c: ops.OperatorConstants) -> pd.DataFrame:
    """Predicted prefill of a 16,384-token prompt in chunks alongside 16 decodes (8,192 context), Qwen3-8B, A100.

    Per iteration ``i`` (chunk ``c`` after ``p = i c`` prior tokens, 16 decodes): decoder layers x (four
    projections + five elementwise kernels at ``c + 16`` tokens + attention of :mod:`dlfp.devices.attention`)
    + LM head over the sampled rows (16 decodes, plus one on the last chunk). Today's roofline: ``DeviceModel``
    iteration time of the same batch (includes its per-iteration overhead). Model predictions, not measured.
    """
    spec = load_model("qwen3-8b")
    gpu = load_gpu("a100-sxm4-80gb")
    shape = ops.LayerShape.from_model_spec(spec)
    om = ops.OperatorModel(shape, gpu, c)
    am = att.AttentionModel(shape, gpu, c)
    from dlfp.devices.roofline import Batch, DeviceModel, batch_counts
    dm = DeviceModel(spec, gpu, 1, DeviceAssumptions(device_model="roofline"))
    rows = []
    for chunk in CHUNKS:
        t_lin = t_ew = t_att = t_head = t_before = 0.0
        iters = math.ceil(PROMPT / chunk)
        for i in range(iters):
            p = i * chunk
            cc = min(chunk, PROMPT - p)
            tok = cc + N_DECODES
            sampled = N_DECODES + (1 if i == iters - 1 else 0)
            L = spec.num_hidden_layers
            t_lin += L * sum(om.gemm_time(op, tok) for op in ops.GEMM_OPS)
            t_ew += L * sum(om.elementwise_time(op, tok) for op in ops.ELEMENTWISE_OPS)
            t_att += L * am.batch_time(cc, p, N_DECODES, DECODE_CONTEXT)
            t_head += om.gemm_time("lm_head", sampled)
            b = Batch(prefill=[(cc, p)], decodes=[DECODE_CONTEXT] * N_DECODES, sampled=sampled)
            t_before += dm.time(*batch_counts(b))[0]
        total = t_lin + t_ew + t_att + t_head
        rows.append((chunk, iters, total * 1e3, t_lin * 1e3, t_ew * 1e3, t_att * 1e3, t_head * 1e3,
                     total / iters * 1e3, t_before * 1e3, total / t_before))
    return pd.DataFrame(rows, columns=["chunk_tokens", "iterations", "after_total_ms", "after_projections_ms",
                                       "after_elementwise_ms", "after_attention_ms", "after_lm_head_ms",
                                       "after_per_iteration_ms", "before_total_ms", "after_over_before"])


# ---- writing ----------------------------------------------------------------------------------------------
def _csv(df: pd.DataFrame) -> str:
    return df.to_csv(index=False, float_format="%.6g", lineterminator="\n")


def _md(df: pd.DataFrame, title: str, note: str = "") -> str:
    out = io.StringIO()
    out.write(f"# {title}\n\n")
    if note:
        out.write(note.strip() + "\n\n")
    cols = list(df.columns)
    out.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
    for r in df.itertuples(index=False):
        cells = []
        for v in r:
            if isinstance(v, float):
                cells.append("" if math.isnan(v) else f"{v:.3g}")
            else:
                cells.append(str(v))
        out.write("| " + " | ".join(cells) + " |\n")
    return out.getvalue()


def _figure(comp: pd.DataFrame, ar: pd.DataFrame, out_dir: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.hashsalt"] = "dlfp"
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    colours = dict(zip(COMPUTE_FILES, ("C0", "C1", "C2", "C3")))
    for ax, fam in zip(axes[:2], ("projections", "elementwise")):
        for rel in COMPUTE_FILES:
            g = comp.query("file == @rel and tp == 1 and family == @fam")
            s = g.groupby("num_tokens")[["measured_s", "before_s", "after_s"]].sum() / \
                g.groupby("num_tokens").op.count().to_numpy()[:, None] * g.op.nunique()
            lab = f"{COMPUTE_FILES[rel][1]} {rel.split('/')[0].upper()}"
            ax.plot(s.index, s.measured_s * 1e3, "o", ms=2.5, color=colours[rel], label=f"{lab} measured")
            ax.plot(s.index, s.after_s * 1e3, "-", lw=1.2, color=colours[rel], label=f"{lab} operator model")
            ax.plot(s.index, s.before_s * 1e3, ":", lw=1.0, color=colours[rel], label=f"{lab} today's roofline")
        ax.set(xscale="log", yscale="log", xlabel="num_tokens", ylabel="time per layer (ms), sum of family",
               title=f"{fam} (TP=1)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=6, ncol=1)
    ax = axes[2]
    for n, col in ((2, "C0"), (4, "C1")):
        g = ar[ar.n_gpus == n].sort_values("size_bytes")
        ax.plot(g.size_bytes, g.measured_s * 1e3, "o", ms=1.5, color=col, label=f"{n} GPUs measured")
        ax.plot(g.size_bytes, g.after_s * 1e3, "-", color=col, label=f"{n} GPUs operator model")
        ax.plot(g.size_bytes, g.before_s * 1e3, ":", color=col, label=f"{n} GPUs today's roofline")
    ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="time (ms)",
           title="all-reduce, A100 pairwise NVLink")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    for ext, kw in (("png", {"dpi": 110, "metadata": {"Software": None}}),
                    ("pdf", {"metadata": {"CreationDate": None, "Producer": None, "Creator": None}})):
        atomic_savefig(fig, out_dir / f"operators.{ext}", ext, **kw)
    plt.close(fig)


def write_device_tables(out_dir: str | Path = DEFAULT_OUT, root: Path = PROFILES, figure: bool = True) -> dict:
    """Fit, evaluate and write every table (and the figure) under ``out_dir``; returns the frames by name."""
    out = Path(out_dir)
    fit = fit_constants(root)
    c = constants_from_fit(fit)
    comp, ar = predictions(c, root)
    frames = {"fitted_constants": fitted_constants_frame(fit), "operator_errors": error_table(comp, ar),
              "spot_check": spot_check(comp), "chunking": chunking_table(c)}
    notes = {
        "fitted_constants": "Constants refitted by dlfp.studies.device; dlfp/devices/operators.yaml holds the same "
                            "values. Times in seconds.",
        "operator_errors": "Absolute relative error |predicted/measured - 1| per operator point (operators of a "
                           "family pooled). before = today's roofline (dlfp.devices.roofline defaults), after = "
                           "dlfp.devices.operators. split: fit = rows the constants were fitted on; held-out = not "
                           "used in any fit. For all-reduce, tp = number of GPUs and band = message size. Target "
                           "(after, projections and elementwise): median <= 0.10 above 512 tokens, <= 0.20 below.",
        "spot_check": "Llama-3-8B on A100, TP=1: fraction of 312 TFLOP/s dense BF16 reached by the four projection "
                      "GEMMs. rel_error = predicted/measured time - 1 (negative = model too fast).",
        "chunking": "MODEL PREDICTION (no measurement exists): Qwen3-8B on one A100, prefill of a 16,384-token "
                    "prompt in chunks, each iteration also carrying 16 decodes at 8,192 context. after = "
                    "dlfp.devices.operators + dlfp.devices.attention (decoder layers + LM head); before = "
                    "dlfp.devices.roofline.DeviceModel (includes its fixed per-iteration overhead). Milliseconds.",
    }
    for name, df in frames.items():
        atomic_write(out / f"{name}.csv", _csv(df))
        atomic_write(out / f"{name}.md", _md(df, name.replace("_", " "), notes[name]))
    if figure:
        _figure(comp, ar, out)
    from dlfp.studies.h100_prefill import write_h100_tables

    frames.update(write_h100_tables(out, c, root))
    return frames


def spot_line(spot: pd.DataFrame) -> str:
    """One line: measured and predicted fraction of peak at 128 tokens and over 512..16,384."""
    r = spot.set_index("num_tokens")
    big = spot[spot.num_tokens >= 512]
    ge2k = spot[spot.num_tokens >= 2048]
    return (f"Llama-3-8B A100 projections, fraction of peak: measured {r.measured_fraction[128]:.2f} at 128 tokens, "
            f"{big.measured_fraction.min():.2f}-{big.measured_fraction.max():.2f} at 512-16,384; operator model "
            f"{r.after_fraction[128]:.2f} / {big.after_fraction.min():.2f}-{big.after_fraction.max():.2f}; today's "
            f"roofline time error {r.before_rel_error[128] * 100:+.0f} % at 128, "
            f"{r.before_rel_error[1024] * 100:+.0f} % at 1,024, {ge2k.before_rel_error.min() * 100:+.0f} to "
            f"{ge2k.before_rel_error.max() * 100:+.0f} % at 2,048-16,384")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlfp.studies.device", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (default data/results/device)")
    args = ap.parse_args(argv)
    frames = write_device_tables(args.out)
    print(spot_line(frames["spot_check"]))
    e = frames["operator_errors"]
    missed = e[(e.target_met == "no")]
    print(f"operator model: {len(e[e.target_met == 'yes'])} bands meet the target, {len(missed)} miss it")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["before_allreduce", "before_time", "chunking_table", "constants_from_fit", "error_table",
           "fit_constants", "load_allreduce_profile", "load_compute_profile", "predictions", "spot_check",
           "write_device_tables"]
