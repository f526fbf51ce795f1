"""Fit the operator constants of ``dlfp/devices/operators.yaml`` to Vidur's measured GPU operator times.

The profiles (``data/gpu-profiles/vidur``) are loaded here, and each fitted section is fitted on the rows its fit
entry names (scipy ``least_squares`` on ``log(predicted / measured)``, medians of the profile rows, rounded to 4
significant digits); every other row is held out:

* shared ``gemm``: A100 Llama-3-8B, TP=1; shared ``elementwise``: both A100 files, TP=1; ``allreduce``: the 2-GPU
  rows of the A100 pairwise-NVLink all-reduce file. Another GPU sees these through its datasheet peaks.
* the H100's own ``gemm`` (``gpus.h100-sxm``): H100 Llama-2-7B, TP=1 (H100 phi-2 and TP 2/4/8 held out); its own
  ``elementwise``: H100 Llama-2-7B, TP=1, plus H100 phi-2's ``input_layernorm`` and ``mlp_act`` (the LayerNorm and
  GELU kinds Llama lacks); phi-2's ``attn_rope`` and ``add`` and TP 2/4/8 held out.

A fit entry is ``(file, tp)`` (every operator of the family) or ``(file, tp, operators)``. Units: seconds.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from dlfp.devices.roofline import load_gpu
from dlfp.devices import operators as ops

REPO = Path(__file__).resolve().parents[3]
PROFILES = REPO / "data" / "gpu-profiles" / "vidur"
# profile file -> (GPU key in hardware/gpus.yaml, architecture label)
COMPUTE_FILES = {
    "a100/Meta-Llama-3-8B_mlp.csv": ("a100-sxm4-80gb", "Llama-3-8B"),
    "a100/phi-2_mlp.csv": ("a100-sxm4-80gb", "phi-2"),
    "h100/Llama-2-7b-hf_mlp.csv": ("h100-sxm", "Llama-2-7B"),
    "h100/phi-2_mlp.csv": ("h100-sxm", "phi-2"),
}
ALLREDUCE_FILE = "network/a100_pairwise_nvlink_all_reduce.csv"
ALLREDUCE_TOPOLOGY = "a100_pairwise_nvlink"
GEMM_FIT = (("a100/Meta-Llama-3-8B_mlp.csv", 1),)
EW_FIT = (("a100/Meta-Llama-3-8B_mlp.csv", 1), ("a100/phi-2_mlp.csv", 1))
# the H100's own sections (operators.yaml gpus.h100-sxm), fit entries (file, TP[, operators]): GEMMs on Llama-2-7B
# TP=1 (phi-2 and TP > 1 held out); elementwise on Llama-2-7B TP=1 plus phi-2's two operators of the kernel kinds
# Llama lacks (LayerNorm, GELU); phi-2's rope and add (kinds Qwen3 also runs) and TP > 1 held out
H100 = "h100-sxm"
H100_GEMM_FIT = (("h100/Llama-2-7b-hf_mlp.csv", 1),)
H100_EW_FIT = (("h100/Llama-2-7b-hf_mlp.csv", 1), ("h100/phi-2_mlp.csv", 1, ("input_layernorm", "mlp_act")))
AR_FIT_GPUS = (2,)
SIG = 4  # significant digits of fitted constants (as written in operators.yaml)


def _round_sig(x: float, sig: int = SIG) -> float:
    return float(f"{x:.{sig - 1}e}")


def load_compute_profile(rel: str, root: Path = PROFILES) -> tuple[ops.LayerShape, pd.DataFrame]:
    """Shape and long-form measurements of one ``*_mlp.csv``.

    Returns:
        ``(shape, frame)``; frame columns ``tp, num_tokens, op, measured_s`` (the per-row median, seconds),
        one row per CSV row and operator present in the file (phi-2 has no ``post_attention_layernorm``).
    """
    d = pd.read_csv(root / rel)
    shape = ops.LayerShape.from_csv_row(d.iloc[0], name=COMPUTE_FILES.get(rel, ("", rel))[1])
    parts = []
    for op in ops.GEMM_OPS + ops.ELEMENTWISE_OPS:
        col = f"time_stats.{op}.median"
        if col in d:
            parts.append(pd.DataFrame({"tp": d["num_tensor_parallel_workers"].astype(int),
                                       "num_tokens": d["num_tokens"].astype(int), "op": op,
                                       "measured_s": d[col].astype(float) * 1e-3}))
    return shape, pd.concat(parts, ignore_index=True)


def load_allreduce_profile(root: Path = PROFILES) -> pd.DataFrame:
    """All-reduce measurements: columns ``n_gpus, size_bytes, measured_s`` (median, seconds)."""
    d = pd.read_csv(root / ALLREDUCE_FILE)
    return pd.DataFrame({"n_gpus": d["num_workers"].astype(int), "size_bytes": d["size"].astype(np.int64),
                         "measured_s": d["time_stats.all_reduce.median"].astype(float) * 1e-3})


def _base_constants() -> dict:
    return yaml.safe_load(ops.CONSTANTS_PATH.read_text())


def _with(base: dict, **sections) -> ops.OperatorConstants:
    d = {**base, **sections}
    return ops.constants_from_dict(d)


def _predict(frame: pd.DataFrame, shape: ops.LayerShape, gpu_key: str, c: ops.OperatorConstants) -> np.ndarray:
    m = ops.OperatorModel(shape, load_gpu(gpu_key), c)
    return np.array([m.time(op, int(n), int(tp)) for op, n, tp in zip(frame.op, frame.num_tokens, frame.tp)])


def _fit_ops(entry: tuple, family: tuple) -> tuple:
    """Operators of ``family`` a fit entry ``(file, tp[, operators])`` fits (all of them without a third field)."""
    return tuple(o for o in family if len(entry) < 3 or o in entry[2])


def _fit_rows(profiles: dict, fit: tuple, family: tuple) -> list:
    """``(shape, gpu key, frame)`` of every fit entry, the frame cut to its TP degree and fitted operators."""
    out = []
    for e in fit:
        shape, f = profiles[e[0]]
        out.append((shape, COMPUTE_FILES[e[0]][0], f[(f.tp == e[1]) & f.op.isin(_fit_ops(e, family))]))
    return out


def _with_section(base: dict, name: str, section: dict, gpu: str | None) -> ops.OperatorConstants:
    """Constants with section ``name`` replaced: the shared one, or GPU ``gpu``'s own under ``gpus``."""
    if gpu is None:
        return _with(base, **{name: section})
    return _with(base, gpus={**base["gpus"], gpu: {**base["gpus"][gpu], name: section}})


def _log_residuals(rows: list, c: ops.OperatorConstants) -> np.ndarray:
    return np.concatenate([np.log(_predict(f, s, g, c) / f.measured_s.to_numpy()) for s, g, f in rows])


def fit_gemm(base: dict, rows: list, gpu: str | None = None) -> dict:
    """``eff_compute, eff_memory, launch_s, blend_p`` fitted on ``rows`` (``_fit_rows``), not rounded.

    ``gpu`` ``None``: the shared section (tiles and quantisation from ``base``); else that GPU's own.
    """
    g0 = dict(base["gemm"])

    def section(x):
        return {"eff_compute": x[0], "eff_memory": x[1], "launch_s": x[2] * 1e-6, "blend_p": x[3]}

    def res(x):
        return _log_residuals(rows, _with_section(base, "gemm", {**g0, **section(x)} if gpu is None else section(x),
                                                  gpu))

    r = least_squares(res, [0.7, 0.8, 5.0, 4.0], bounds=([0.05, 0.05, 0.01, 1.0], [1.0, 1.0, 50.0, 30.0]))
    return section(r.x)


def fit_elementwise(base: dict, rows: list, gpu: str | None = None) -> dict:
    """``blend_p`` and ``(eff_bw, fixed_s)`` of every kernel kind fitted on ``rows``, not rounded (``gpu`` as above)."""
    kinds = list(ops.KERNELS)

    def section(x):
        return {"blend_p": x[0], "kernels": {k: {"eff_bw": x[1 + 2 * i], "fixed_s": x[2 + 2 * i] * 1e-6}
                                             for i, k in enumerate(kinds)}}

    def res(x):
        return _log_residuals(rows, _with_section(base, "elementwise", section(x), gpu))

    x0 = [2.0] + [0.5, 4.0] * len(kinds)
    lb = [1.0] + [0.02, 0.1] * len(kinds)
    ub = [30.0] + [1.5, 50.0] * len(kinds)
    return section(least_squares(res, x0, bounds=(lb, ub)).x)


def fit_allreduce(root: Path = PROFILES) -> dict:
    """``latency_s`` per ring step and ``eff_link`` fitted on the all-reduce rows of ``AR_FIT_GPUS`` GPUs."""
    base = _base_constants()
    ar = load_allreduce_profile(root).query("n_gpus in @AR_FIT_GPUS")
    a100 = load_gpu("a100-sxm4-80gb")
    shape = ops.LayerShape("x", 1, 1, 1, 1, 1, True)

    def res_a(x):
        mm = ops.OperatorModel(shape, a100, _with(base, allreduce={"latency_s": x[0] * 1e-6, "eff_link": x[1]}))
        pred = np.array([mm.allreduce_time(s, n, ALLREDUCE_TOPOLOGY) for s, n in zip(ar.size_bytes, ar.n_gpus)])
        return np.log(pred / ar.measured_s.to_numpy())

    ra = least_squares(res_a, [5.0, 0.6], bounds=([0.01, 0.01], [500.0, 1.5]))
    return {"latency_s": ra.x[0] * 1e-6, "eff_link": ra.x[1]}


def _rounded(section: dict) -> dict:
    return {k: _rounded(v) if isinstance(v, dict) else _round_sig(v) for k, v in section.items()}


def fit_constants(root: Path = PROFILES) -> dict:
    """Refit the GEMM, elementwise and all-reduce constants on their fit data (see ``operators.yaml``).

    Returns:
        mapping ``section -> {name: value}`` rounded to 4 significant digits, ready to merge into the YAML dict;
        ``gpus -> {H100: {"gemm": ..., "elementwise": ...}}`` holds the H100's own sections.
    """
    base = _base_constants()
    profiles = {rel: load_compute_profile(rel, root) for rel in COMPUTE_FILES}
    out = {"gemm": fit_gemm(base, _fit_rows(profiles, GEMM_FIT, ops.GEMM_OPS)),
           "elementwise": fit_elementwise(base, _fit_rows(profiles, EW_FIT, ops.ELEMENTWISE_OPS)),
           "allreduce": fit_allreduce(root),
           "gpus": {H100: {"gemm": fit_gemm(base, _fit_rows(profiles, H100_GEMM_FIT, ops.GEMM_OPS), H100),
                           "elementwise": fit_elementwise(base, _fit_rows(profiles, H100_EW_FIT, ops.ELEMENTWISE_OPS),
                                                          H100)}}}
    return _rounded(out)


def _fitted_on(fit: tuple) -> str:
    return "; ".join(f"{e[0]} TP={e[1]}" + (f" ({', '.join(e[2])})" if len(e) > 2 else "") for e in fit)


def fitted_constants_frame(fit: dict) -> pd.DataFrame:
    """The fitted constants as rows ``section, name, value, fitted_on``."""
    rows = []
    on_g = _fitted_on(GEMM_FIT)
    for k, v in fit["gemm"].items():
        rows.append(("gemm", k, v, on_g))
    on_e = {"rms_norm": "a100/Meta-Llama-3-8B_mlp.csv TP=1", "silu_and_mul": "a100/Meta-Llama-3-8B_mlp.csv TP=1",
            "layer_norm": "a100/phi-2_mlp.csv TP=1", "gelu": "a100/phi-2_mlp.csv TP=1"}
    both = _fitted_on(EW_FIT)
    rows.append(("elementwise", "blend_p", fit["elementwise"]["blend_p"], both))
    for k, v in fit["elementwise"]["kernels"].items():
        for kk, vv in v.items():
            rows.append(("elementwise", f"{k}.{kk}", vv, on_e.get(k, both)))
    for k, v in fit["allreduce"].items():
        rows.append(("allreduce", k, v, f"{ALLREDUCE_FILE} n_gpus=2"))
    own = fit["gpus"][H100]
    llama = _fitted_on(H100_EW_FIT[:1])
    on_h = {"rms_norm": llama, "silu_and_mul": llama, "rope": llama, "add": llama,
            "layer_norm": _fitted_on(H100_EW_FIT[1:]), "gelu": _fitted_on(H100_EW_FIT[1:])}
    for k, v in own["gemm"].items():
        rows.append((f"gpus.{H100}.gemm", k, v, _fitted_on(H100_GEMM_FIT)))
    rows.append((f"gpus.{H100}.elementwise", "blend_p", own["elementwise"]["blend_p"], _fitted_on(H100_EW_FIT)))
    for k, v in own["elementwise"]["kernels"].items():
        for kk, vv in v.items():
            rows.append((f"gpus.{H100}.elementwise", f"{k}.{kk}", vv, on_h[k]))
    return pd.DataFrame(rows, columns=["section", "name", "value", "fitted_on"])


def constants_from_fit(fit: dict) -> ops.OperatorConstants:
    """Operator constants of ``operators.yaml`` with the fitted sections (a GPU's own included) replaced by ``fit``."""
    base = _base_constants()
    gpus = {k: {"sm_count": v["sm_count"]} for k, v in base["gpus"].items()}
    for k, sec in fit.get("gpus", {}).items():
        gpus[k] = {**gpus[k], **sec}
    return _with(base, gemm={**base["gemm"], **fit["gemm"]}, elementwise=fit["elementwise"],
                 allreduce=fit["allreduce"], gpus=gpus)


def is_fit(rel: str, tp: int, op: str) -> bool:
    """Whether profile rows of ``rel`` at ``tp`` for operator ``op`` were fitted on (by any fit entry)."""
    fam = ops.GEMM_OPS if op in ops.GEMM_OPS else ops.ELEMENTWISE_OPS
    fits = GEMM_FIT + H100_GEMM_FIT if op in ops.GEMM_OPS else EW_FIT + H100_EW_FIT
    return any(e[0] == rel and e[1] == tp and op in _fit_ops(e, fam) for e in fits)


__all__ = ["ALLREDUCE_FILE", "ALLREDUCE_TOPOLOGY", "AR_FIT_GPUS", "COMPUTE_FILES", "EW_FIT", "GEMM_FIT", "H100",
           "H100_EW_FIT", "H100_GEMM_FIT", "PROFILES", "REPO", "constants_from_fit", "fit_allreduce", "fit_constants",
           "fit_elementwise", "fit_gemm", "fitted_constants_frame", "is_fit", "load_allreduce_profile",
           "load_compute_profile"]
