"""The device cost terms of a calibration step and the per-step features they multiply.

A step's features are the aggregate batch features of ``dlfp.devices.batch.features`` (tokens, sampled rows,
causal attention pairs, cached tokens read) plus a constant column ``one`` for the fixed per-step cost.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from dlfp.devices.batch import features

#: device cost terms: (coefficient name, feature column); the coefficients are seconds per unit of the feature
DEVICE_TERMS: tuple[tuple[str, str], ...] = (
    ("step_s", "one"),
    ("per_token_s", "tokens"),
    ("per_sampled_s", "sampled"),
    ("per_attn_pair_s", "attn_pairs"),
    ("per_kv_token_s", "kv_tokens"),
)


class CalibrationError(ValueError):
    """Bad calibration input (empty log, missing column, unreadable profile); the message names it."""


def chunk_counts(chunks: Iterable[tuple[int, int, bool]]) -> dict[str, float]:
    """Aggregate features of one step from its per-request chunks (``dlfp.devices.batch.features``).

    Args:
        chunks: ``(new_tokens, computed_before, sampled)`` per scheduled request: ``new_tokens``
            scheduled this step after ``computed_before`` tokens already in the KV cache; ``sampled``
            true when the step produces a token for it (decode, or the final prefill chunk).

    Returns:
        ``{"tokens", "sampled", "attn_pairs", "kv_tokens", "num_scheduled"}``: a chunk of ``c`` after
        ``p`` has ``c * p + c (c + 1) / 2`` causal pairs and reads ``p`` cached tokens (a decode is
        ``c = 1``: ``p + 1`` pairs).

    Raises:
        CalibrationError: ``new_tokens <= 0`` or ``computed_before < 0``.
    """
    try:
        tokens, sampled, pairs, kv, n = features(chunks)
    except ValueError as e:
        raise CalibrationError(str(e)) from None
    return {"tokens": tokens, "sampled": sampled, "attn_pairs": pairs, "kv_tokens": kv, "num_scheduled": n}


def design_matrix(steps: pd.DataFrame) -> np.ndarray:
    """Columns of ``DEVICE_TERMS`` for each step: shape ``(n_steps, 5)``.

    Raises:
        CalibrationError: a feature column is missing.
    """
    cols = []
    for _, f in DEVICE_TERMS:
        if f == "one":
            cols.append(np.ones(len(steps)))
        elif f not in steps:
            raise CalibrationError(f"steps: column {f!r} missing (have {sorted(steps.columns)})")
        else:
            cols.append(steps[f].to_numpy(dtype=float))
    return np.column_stack(cols)


def predict_execute(steps: pd.DataFrame, coef: dict[str, float]) -> np.ndarray:
    """Modelled device time (seconds) of each step from the device coefficients; shape ``(n_steps,)``.

    With an LM-head table in ``coef`` (``lm_head_rows``), ``dlfp.devices.roofline.FittedCosts.time`` with one row
    per scheduled request; without it, the linear ``DEVICE_TERMS``.
    """
    if coef.get("lm_head_rows"):
        from dlfp.devices.roofline import FittedCosts

        fc = FittedCosts(**coef)
        return np.array([fc.time(t, r, p, k) for t, r, p, k in zip(steps["tokens"], steps["num_scheduled"],
                                                                   steps["attn_pairs"], steps["kv_tokens"])])
    return design_matrix(steps) @ np.array([float(coef[k]) for k, _ in DEVICE_TERMS])
