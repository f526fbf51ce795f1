"""Least-squares fits of the device and host cost terms, and their residual statistics.

Device coefficients are non-negative (``scipy.optimize.nnls``) and fitted on RELATIVE residuals
(each step weighted by ``1 / modelled``, iteratively reweighted from ``1 / measured``), so the many
10 ms decode steps count as much as the few 1 s prefill steps. Host terms are fitted the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from dlfp.studies.calibration.features import DEVICE_TERMS, CalibrationError, design_matrix, predict_execute

#: HostCosts fields the CPU engine has no phase for (no kernel launch, no sampler launch: it is eager and
#: synchronous): fixed at 0
HOST_ZERO = ("launch_graph_s", "launch_piecewise_per_layer_s", "launch_eager_per_kernel_s", "sample_launch_s")
#: rounds of the reweighted fit: one weighted by 1 / measured, then reweighted by 1 / modelled
IRLS_ROUNDS = 6


def _nnls_relative(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative residuals, ``b >= 0``; ``X`` is ``(n, k)``, ``y`` ``(n,)``.

    First round: minimise ``sum(((X b - y) / y)^2)``; then ``IRLS_ROUNDS - 1`` rounds of
    ``sum(((X b - y) / p)^2)`` with ``p`` the previous round's prediction (iteratively reweighted
    least squares; residuals relative to the model, which is not biased low by slow outliers).
    Columns are scaled to unit norm before ``scipy.optimize.nnls`` (conditioning) and the
    solution is scaled back. Returns ``b``, shape ``(k,)``.

    Raises:
        CalibrationError: fewer rows than coefficients, or a non-finite or non-positive ``y``.
    """
    from scipy.optimize import nnls

    if len(y) < X.shape[1]:
        raise CalibrationError(f"fit: {len(y)} steps for {X.shape[1]} coefficients")
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise CalibrationError("fit: measured times must be finite and positive")
    scale = y.copy()
    b = np.zeros(X.shape[1])
    for _ in range(IRLS_ROUNDS):
        Xw = X / scale[:, None]
        norm = np.linalg.norm(Xw, axis=0)
        norm[norm == 0] = 1.0
        b, _ = nnls(Xw / norm, y / scale, maxiter=50 * X.shape[1])
        b = b / norm
        pred = X @ b
        # reweight by the model's own prediction: 1/measured alone favours under-prediction when the noise is
        # one-sided (a step slowed by another process gets a small weight, a fast one a large weight)
        scale = np.where(pred > 0, pred, y)
    return b


@dataclass
class FitResult:
    """Fitted coefficients (seconds per unit) and relative residuals ``pred / measured - 1``, shape ``(n,)``."""

    coef: dict[str, float]
    residuals: np.ndarray
    n: int
    stats: dict[str, float] = field(default_factory=dict)


def residual_stats(measured: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Relative-residual summary: ``median_abs``, ``p90_abs``, ``max_abs``, ``bias`` (median signed), ``r2``, ``n``.

    ``r2`` is the coefficient of determination of the absolute times. Empty input gives NaNs.
    """
    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    if m.size == 0:
        return {"n": 0, "median_abs": math.nan, "p90_abs": math.nan, "max_abs": math.nan, "bias": math.nan,
                "r2": math.nan}
    r = p / m - 1.0
    ss_res = float(np.sum((m - p) ** 2))
    ss_tot = float(np.sum((m - m.mean()) ** 2))
    return {"n": int(m.size), "median_abs": float(np.median(np.abs(r))), "p90_abs": float(np.percentile(np.abs(r), 90)),
            "max_abs": float(np.max(np.abs(r))), "bias": float(np.median(r)),
            "r2": float(1 - ss_res / ss_tot) if ss_tot > 0 else math.nan}


def fit_device(steps: pd.DataFrame, time_col: str = "execute_s") -> FitResult:
    """Fit the device coefficients (``DEVICE_TERMS``) to ``steps[time_col]`` (seconds).

    Non-negative least squares on relative residuals (see the module docstring).

    Raises:
        CalibrationError: too few steps, non-positive times, missing columns.
    """
    if time_col not in steps:
        raise CalibrationError(f"steps: column {time_col!r} missing")
    y = steps[time_col].to_numpy(dtype=float)
    X = design_matrix(steps)
    b = _nnls_relative(X, y)
    coef = {k: float(v) for (k, _), v in zip(DEVICE_TERMS, b)}
    pred = X @ b
    return FitResult(coef=coef, residuals=pred / y - 1.0, n=len(y), stats=residual_stats(y, pred))


#: steps a row count needs in the fitted set to get its own entry in the LM-head table
LM_HEAD_MIN_STEPS = 3


def fit_device_parts(steps: pd.DataFrame) -> FitResult:
    """Fit the device terms part by part to the model runner's measured parts (seconds).

    * ``forward_s`` (``_model_forward``) ~ step + per token + per causal attention pair + per cached token read;
    * ``logits_s`` (``compute_logits``) -> the LM-head table: the median time per row count
      (``num_scheduled``, one row per scheduled request), for every row count with at least
      ``LM_HEAD_MIN_STEPS`` steps;
    * ``sample_s`` (``_sample``) ~ step + per row.

    The coefficients are those of ``dlfp.devices.roofline.FittedCosts`` (``step_s`` = the forward pass's and
    the sampler's fixed parts); the residuals are those of the predicted ``device_s``.

    Raises:
        CalibrationError: a part column is missing, or too few steps for a term.
    """
    for c in ("forward_s", "logits_s", "sample_s", "device_s", "num_scheduled"):
        if c not in steps:
            raise CalibrationError(f"steps: column {c!r} missing")
    ok = steps[np.isfinite(steps["forward_s"]) & (steps["forward_s"] > 0)]
    X = np.column_stack([np.ones(len(ok)), ok["tokens"].to_numpy(float), ok["attn_pairs"].to_numpy(float),
                         ok["kv_tokens"].to_numpy(float)])
    f0, f_tok, f_pair, f_kv = _nnls_relative(X, ok["forward_s"].to_numpy(float))
    sm = steps[np.isfinite(steps["sample_s"]) & (steps["sample_s"] > 0)]
    s0, s_row = _nnls_relative(np.column_stack([np.ones(len(sm)), sm["num_scheduled"].to_numpy(float)]),
                               sm["sample_s"].to_numpy(float))
    lg = steps[np.isfinite(steps["logits_s"]) & (steps["logits_s"] > 0)]
    counts = lg.groupby("num_scheduled")["logits_s"].agg(["median", "size"])
    counts = counts[counts["size"] >= LM_HEAD_MIN_STEPS]
    if counts.empty:
        raise CalibrationError(f"fit: no row count has {LM_HEAD_MIN_STEPS} steps with a measured LM head")
    coef = {"step_s": float(f0 + s0), "per_token_s": float(f_tok), "per_sampled_s": float(s_row),
            "per_attn_pair_s": float(f_pair), "per_kv_token_s": float(f_kv),
            "lm_head_rows": [int(r) for r in counts.index], "lm_head_s": [float(v) for v in counts["median"]]}
    y = steps["device_s"].to_numpy(float)
    pred = predict_execute(steps, coef)
    return FitResult(coef=coef, residuals=pred / y - 1.0, n=len(y), stats=residual_stats(y, pred))


def fit_linear_host(y: np.ndarray, x: np.ndarray, names: tuple[str, str]) -> dict[str, float]:
    """``y ~ base + per * x`` by non-negative least squares on relative residuals; ``{names[0]: base, names[1]: per}``.

    Raises:
        CalibrationError: fewer than 2 points, or non-positive times.
    """
    return _fit_linear_columns(y, np.column_stack([np.ones(len(x)), np.asarray(x, float)]), names)


def _fit_linear_columns(y: np.ndarray, X: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    """``y ~ X b`` (``b >= 0``) on relative residuals (``_nnls_relative``); ``{name: coefficient}``."""
    b = _nnls_relative(np.asarray(X, float), np.asarray(y, float))
    return {n: float(v) for n, v in zip(names, b)}


def fit_host(steps: pd.DataFrame, tokens: pd.DataFrame | None = None,
             ingest: Sequence[float] | None = None) -> dict[str, float]:
    """``HostCosts`` fields from the step log (seconds), each fitted to the measured part it stands for.

    Args:
        steps: columns ``schedule_cost_s``, ``num_running``, ``num_scheduled``, ``tokens``, and either the
            named parts of ``measurements.STEP_PARTS`` (``prep_s``, ``bookkeeping_s``, ``update_s``,
            ``loop_s``; rows of a log with the model runner's parts) or, for an older log without them,
            ``update_cost_s`` (then ``update_*`` covers update and loop, and prep / bookkeeping / loop are 0).
        tokens: optional client token receipts with ``client_s`` and ``update_start_s`` (the
            producing step's start of ``update_from_output``, engine clock) and that step's
            ``num_scheduled``: ``frontend_output_s`` = median of ``client_s - (update_start_s +
            modelled update cost)``, floored at 0.
        ingest: optional samples (s) of client ``generate()`` -> scheduler ``add_request`` with the
            engine idle; ``ingest_s`` = their median.

    Terms (each ``base + per-unit x count``, non-negative least squares on relative residuals):

    * ``schedule_*``: ``schedule_cost_s`` ~ 1 + (running + scheduled requests);
    * ``prep_*``: ``prep_s`` ~ 1 + scheduled requests + tokens;
    * ``bookkeeping_*``: ``bookkeeping_s`` ~ 1 + scheduled requests;
    * ``update_*``: ``update_s`` ~ 1 + scheduled requests;
    * ``engine_loop_s``: median of ``loop_s``.

    Returns:
        all ``HostCosts`` fields that this fit sets (those in ``HOST_ZERO`` are 0).

    Raises:
        CalibrationError: a column is missing, or too few positive times for a linear term.
    """
    need = ("schedule_cost_s", "num_running", "num_scheduled", "update_cost_s")
    for c in need:
        if c not in steps:
            raise CalibrationError(f"steps: column {c!r} missing")
    out: dict[str, float] = {k: 0.0 for k in HOST_ZERO}
    s = steps[steps["schedule_cost_s"] > 0]
    out.update(fit_linear_host(s["schedule_cost_s"].to_numpy(), (s["num_running"] + s["num_scheduled"]).to_numpy(),
                               ("schedule_base_s", "schedule_per_req_s")))
    parts = "prep_s" in steps and bool(steps["prep_s"].notna().any())
    if parts:
        p = steps[np.isfinite(steps["prep_s"]) & (steps["prep_s"] > 0)]
        X = np.column_stack([np.ones(len(p)), p["num_scheduled"].to_numpy(float), p["tokens"].to_numpy(float)])
        out.update(_fit_linear_columns(p["prep_s"].to_numpy(), X,
                                       ("prep_base_s", "prep_per_req_s", "prep_per_token_s")))
        k = steps[np.isfinite(steps["bookkeeping_s"]) & (steps["bookkeeping_s"] > 0)]
        out.update(fit_linear_host(k["bookkeeping_s"].to_numpy(), k["num_scheduled"].to_numpy(),
                                   ("bookkeeping_base_s", "bookkeeping_per_req_s")))
        u = steps[np.isfinite(steps["update_s"]) & (steps["update_s"] > 0)]
        out.update(fit_linear_host(u["update_s"].to_numpy(), u["num_scheduled"].to_numpy(),
                                   ("update_base_s", "update_per_req_s")))
        loop = steps["loop_s"].to_numpy(float)
        loop = loop[np.isfinite(loop) & (loop >= 0)]
        out["engine_loop_s"] = float(np.median(loop)) if loop.size else 0.0
    else:
        out.update({"prep_base_s": 0.0, "prep_per_req_s": 0.0, "prep_per_token_s": 0.0, "bookkeeping_base_s": 0.0,
                    "bookkeeping_per_req_s": 0.0, "engine_loop_s": 0.0})
        u = steps[np.isfinite(steps["update_cost_s"]) & (steps["update_cost_s"] > 0)]
        out.update(fit_linear_host(u["update_cost_s"].to_numpy(), u["num_scheduled"].to_numpy(),
                                   ("update_base_s", "update_per_req_s")))
    if tokens is not None and len(tokens):
        upd = out["update_base_s"] + out["update_per_req_s"] * tokens["num_scheduled"].to_numpy(dtype=float)
        d = tokens["client_s"].to_numpy(dtype=float) - tokens["update_start_s"].to_numpy(dtype=float) - upd
        out["frontend_output_s"] = max(0.0, float(np.median(d)))
    if ingest is not None and len(ingest):
        out["ingest_s"] = max(0.0, float(np.median(np.asarray(ingest, float))))
    return out
