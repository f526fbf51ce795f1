"""DLFP-S's model-free online estimate of the iteration time: recursive least squares (RLS).

The fit is ``T = a + b * prefill_tokens + c * num_decodes`` (seconds), updated
once per sample with exponential forgetting; no offline profile and no
per-model constant goes into it.
"""
from __future__ import annotations

import math

# Regressor scaling for numerical conditioning only (the fit is invariant to it
# apart from the weak prior): prefill tokens / 1000, decodes / 100.
_P_SCALE = 1000.0
_D_SCALE = 100.0
_PRIOR_VAR = 1.0e4  # initial RLS covariance diagonal: a weak prior
_MAX_TRACE = 1.0e8  # covariance trace bound: stops forgetting-induced windup


class RLSEstimator:
    """Recursive least squares with exponential forgetting for ``T = a + b*p + c*d``.

    ``p`` is prefill tokens, ``d`` decodes, ``T`` seconds. ``forgetting`` is
    the per-sample factor ``lambda`` in (0, 1] (memory ~ 1/(1-lambda)
    samples). The covariance trace is bounded (forgetting is skipped when it
    would exceed ``1e8``) so that directions no sample excites do not blow up.

    ``rel_error`` is the forgetting-weighted RMS of the relative a-priori
    error ``(T - T_hat) / T`` over the samples after the first three (before
    that the three-parameter fit is under-determined and its predictions say
    nothing about reliability); ``nan`` until then.
    """

    def __init__(self, forgetting: float = 0.95) -> None:
        self.lam = float(forgetting)
        self.theta = [0.0, 0.0, 0.0]
        self.P = [[_PRIOR_VAR if i == j else 0.0 for j in range(3)] for i in range(3)]
        self.n = 0
        self._err_s = 0.0
        self._err_w = 0.0

    @staticmethod
    def _x(p: float, d: float) -> list[float]:
        return [1.0, p / _P_SCALE, d / _D_SCALE]

    @property
    def coef(self) -> tuple[float, float, float]:
        """``(a [s], b [s/prefill token], c [s/decode])`` in natural units."""
        return (self.theta[0], self.theta[1] / _P_SCALE, self.theta[2] / _D_SCALE)

    @property
    def rel_error(self) -> float:
        """Forgetting-weighted RMS relative a-priori error (dimensionless); ``nan`` before the fourth sample."""
        return math.sqrt(self._err_s / self._err_w) if self._err_w > 0 else float("nan")

    def predict(self, p: float, d: float) -> float:
        """Predicted iteration time (s) for ``p`` prefill tokens and ``d`` decodes."""
        x = self._x(p, d)
        return sum(t * xi for t, xi in zip(self.theta, x))

    def update(self, p: float, d: float, t: float) -> None:
        """Add one sample: ``p`` prefill tokens, ``d`` decodes, ``t`` seconds (> 0)."""
        x = self._x(p, d)
        P = self.P
        Px = [sum(P[i][j] * x[j] for j in range(3)) for i in range(3)]
        xPx = sum(x[i] * Px[i] for i in range(3))
        err = t - sum(th * xi for th, xi in zip(self.theta, x))
        if self.n >= 3:
            r = err / t
            self._err_s = self.lam * self._err_s + r * r
            self._err_w = self.lam * self._err_w + 1.0
        trace = sum(P[i][i] for i in range(3))
        lam = self.lam if trace / self.lam <= _MAX_TRACE else 1.0
        denom = lam + xPx
        k = [v / denom for v in Px]
        self.theta = [th + ki * err for th, ki in zip(self.theta, k)]
        newP = [[(P[i][j] - k[i] * Px[j]) / lam for j in range(3)] for i in range(3)]
        for i in range(3):  # keep it symmetric against round-off
            for j in range(i + 1, 3):
                m = 0.5 * (newP[i][j] + newP[j][i])
                newP[i][j] = newP[j][i] = m
        self.P = newP
        self.n += 1


__all__ = ["RLSEstimator"]
