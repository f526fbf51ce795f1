"""DLFP-G's online estimate of an iteration's completed device time: recursive least squares (RLS).

The fit is linear in the features an iteration's cost depends on (seconds)::

    T = a + b * prefill_tokens + c * prefill_pairs + d * num_decodes + e * decode_context_tokens

``prefill_pairs`` are the causal attention pairs of the prefill chunks (a chunk of
``n`` tokens after ``c`` cached ones has ``n * c + n * (n + 1) / 2``), so the
attention cost of a chunk deep into a long prompt is part of the estimate;
``decode_context_tokens`` is the decodes' KV cache read. Without context
conditioning (an ablation) the fit is ``T = a + b * prefill_tokens + d *
num_decodes``. It is learned from completed iterations only; no offline profile
and no per-model constant goes into it.
"""
from __future__ import annotations

import numpy as np

from dlfp.devices.batch import chunk_pairs  # the one count of causal attention pairs (re-exported here)

# Regressor scales, for numerical conditioning only: prefill tokens / 1e3, pairs / 1e6, decodes / 1e2,
# decode context tokens / 1e5 (a fit is invariant to them apart from the weak prior).
_SCALES_CONTEXT = np.array([1.0, 1e3, 1e6, 1e2, 1e5])
_SCALES_PLAIN = np.array([1.0, 1e3, 1e2])
_PRIOR_VAR = 1.0e4  # initial covariance diagonal: a weak prior
_MAX_TRACE = 1.0e8  # covariance trace bound: stops forgetting-induced windup in unexcited directions


class CostEstimator:
    """RLS with exponential forgetting over the features above.

    Args:
        use_context: fit the pair and decode-context terms (five features) or not (three).
        forgetting: the per-sample factor ``lambda`` in (0, 1] (memory about ``1 / (1 - lambda)`` samples).

    ``samples`` counts updates; ``prefill_samples`` those with prefill tokens;
    ``largest_prefill`` is the largest prefill (tokens) timed so far and
    ``largest_prefill_s`` the time (seconds) of its latest iteration of that size.
    """

    def __init__(self, use_context: bool = True, forgetting: float = 0.98) -> None:
        self.use_context = bool(use_context)
        self.lam = float(forgetting)
        self._scale = _SCALES_CONTEXT if self.use_context else _SCALES_PLAIN
        k = len(self._scale)
        self.theta = np.zeros(k)
        self.P = np.eye(k) * _PRIOR_VAR
        self.samples = 0
        self.prefill_samples = 0
        self.largest_prefill = 0
        self.largest_prefill_s = 0.0

    def features(self, prefill_tokens: float, prefill_pairs: float, num_decodes: float,
                 decode_context: float) -> np.ndarray:
        """The scaled regressor vector (shape ``(5,)`` with context, ``(3,)`` without)."""
        if self.use_context:
            raw = np.array([1.0, prefill_tokens, prefill_pairs, num_decodes, decode_context])
        else:
            raw = np.array([1.0, prefill_tokens, num_decodes])
        return raw / self._scale

    @property
    def coef(self) -> np.ndarray:
        """Coefficients in natural units (seconds per unit of each feature), intercept first."""
        return self.theta / self._scale

    def predict(self, prefill_tokens: float, prefill_pairs: float, num_decodes: float,
                decode_context: float) -> float:
        """Predicted completed device time (seconds) of an iteration with these features."""
        return float(self.theta @ self.features(prefill_tokens, prefill_pairs, num_decodes, decode_context))

    def update(self, prefill_tokens: float, prefill_pairs: float, num_decodes: float, decode_context: float,
               seconds: float) -> None:
        """Add one completed iteration (``seconds`` > 0 of device time)."""
        x = self.features(prefill_tokens, prefill_pairs, num_decodes, decode_context)
        Px = self.P @ x
        err = seconds - float(self.theta @ x)
        lam = self.lam if np.trace(self.P) / self.lam <= _MAX_TRACE else 1.0
        k = Px / (lam + float(x @ Px))
        self.theta = self.theta + k * err
        P = (self.P - np.outer(k, Px)) / lam
        self.P = 0.5 * (P + P.T)  # keep it symmetric against round-off
        self.samples += 1
        if prefill_tokens > 0:
            self.prefill_samples += 1
            if prefill_tokens >= self.largest_prefill:
                self.largest_prefill, self.largest_prefill_s = int(prefill_tokens), float(seconds)


__all__ = ["CostEstimator", "chunk_pairs"]
