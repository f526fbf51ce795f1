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


def _dot(a, b) -> float:
    """``sum(a[i] * b[i])`` added left to right, each product rounded (no fused multiply-add).

    Written out rather than ``numpy.dot``: OpenBLAS picks its kernel by CPU at run time and a kernel may fuse the
    multiply-add or reorder the sum, so the same trial could round differently on two machines. The compiled core
    (``dlfp.backends.sim.compiled.dlfpg``) does the same operations in the same order."""
    s = 0.0
    for i in range(len(a)):
        s += a[i] * b[i]
    return s


class CostEstimator:
    """RLS with exponential forgetting over the features above.

    Args:
        use_context: fit the pair and decode-context terms (five features) or not (three).
        forgetting: the per-sample factor ``lambda`` in (0, 1] (memory about ``1 / (1 - lambda)`` samples).

    ``samples`` counts updates; ``prefill_samples`` those with prefill tokens;
    ``largest_prefill`` is the largest prefill (tokens) timed so far and
    ``largest_prefill_s`` the time (seconds) of its latest iteration of that size.
    ``theta`` (scaled coefficients) and ``P`` (their covariance, row by row) are lists of floats; every operation
    on them is written out in a fixed order (``_dot``), so a fit rounds the same on every machine.
    """

    def __init__(self, use_context: bool = True, forgetting: float = 0.98) -> None:
        self.use_context = bool(use_context)
        self.lam = float(forgetting)
        self._scale = _SCALES_CONTEXT if self.use_context else _SCALES_PLAIN
        self._scale_list = [float(v) for v in self._scale]
        k = len(self._scale)
        self.theta = [0.0] * k
        self.P = [[_PRIOR_VAR if i == j else 0.0 for j in range(k)] for i in range(k)]
        self.samples = 0
        self.prefill_samples = 0
        self.largest_prefill = 0
        self.largest_prefill_s = 0.0

    def features(self, prefill_tokens: float, prefill_pairs: float, num_decodes: float,
                 decode_context: float) -> list[float]:
        """The scaled regressor (5 floats with context, 3 without)."""
        sc = self._scale_list
        if self.use_context:
            return [1.0 / sc[0], prefill_tokens / sc[1], prefill_pairs / sc[2], num_decodes / sc[3],
                    decode_context / sc[4]]
        return [1.0 / sc[0], prefill_tokens / sc[1], num_decodes / sc[2]]

    @property
    def coef(self) -> np.ndarray:
        """Coefficients in natural units (seconds per unit of each feature), intercept first."""
        return np.array(self.theta) / self._scale

    def slope(self) -> float:
        """The coefficient of prefill tokens in seconds per token (``coef[1]``)."""
        return self.theta[1] / self._scale_list[1]

    def predict(self, prefill_tokens: float, prefill_pairs: float, num_decodes: float,
                decode_context: float) -> float:
        """Predicted completed device time (seconds) of an iteration with these features."""
        return _dot(self.theta, self.features(prefill_tokens, prefill_pairs, num_decodes, decode_context))

    def update(self, prefill_tokens: float, prefill_pairs: float, num_decodes: float, decode_context: float,
               seconds: float) -> None:
        """Add one completed iteration (``seconds`` > 0 of device time)."""
        x = self.features(prefill_tokens, prefill_pairs, num_decodes, decode_context)
        P, n = self.P, len(x)
        Px = [_dot(P[i], x) for i in range(n)]
        err = seconds - _dot(self.theta, x)
        trace = 0.0
        for i in range(n):
            trace += P[i][i]
        lam = self.lam if trace / self.lam <= _MAX_TRACE else 1.0
        den = lam + _dot(x, Px)
        k = [v / den for v in Px]
        self.theta = [self.theta[i] + k[i] * err for i in range(n)]
        Q = [[(P[i][j] - k[i] * Px[j]) / lam for j in range(n)] for i in range(n)]
        self.P = [[0.5 * (Q[i][j] + Q[j][i]) for j in range(n)] for i in range(n)]  # symmetric against round-off
        self.samples += 1
        if prefill_tokens > 0:
            self.prefill_samples += 1
            if prefill_tokens >= self.largest_prefill:
                self.largest_prefill, self.largest_prefill_s = int(prefill_tokens), float(seconds)


__all__ = ["CostEstimator", "chunk_pairs"]
