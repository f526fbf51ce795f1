"""DLFP-S: a completion-timed, self-checking prefill-cap controller (issue 8).

Same ``Policy`` interface as :class:`dlfp.policies.base.DLFP` (``prefill_cap`` /
``observe`` / ``decisions`` / ``params``), no offline profiling and no
per-model constants. It answers the three failure causes the DLFP paper
(arXiv v1, 2026-09-29) names, with four parts that can each be switched off:

1. **Signal** (``signal``, default ``"device_completion"``): the controller
   reads the completed device time of each iteration
   (``Observation.device_time_s``), not the scheduler-call cadence.
2. **Model-free online estimate** (``use_estimator``): recursive least squares
   (RLS) with exponential forgetting fits ``T = a + b * prefill_tokens + c *
   num_decodes`` (seconds) online. While the fit is *reliable* (at least
   ``min_samples`` samples, per-token slope ``b > 0``, forgetting-weighted RMS
   of the relative a-priori prediction error <= ``max_rel_error``) the cap
   jumps straight to the largest multiple of ``quantum`` whose predicted
   iteration time meets ``target_s`` for the current number of decodes,
   clamped to ``[min_cap, max_cap]`` (``min_cap`` when even that is predicted
   over the target). Otherwise DLFP's proportional law
   (:meth:`dlfp.policies.base.DLFP.next_cap`) is the fallback.
3. **Feasibility** (``use_feasibility``): a counterfactual *tail check* decides
   whether to cap at all. Chunking must never make ITL worse, and whether it
   does depends on how often stalls happen, not only on how long one is: a
   cap turns one long stall into several shorter ones, which lowers the
   decode-gap P99 when stalls already hold more than 1 % of the gaps and raises
   it when they hold less (then the P99 sits on plain decode steps and the
   extra medium-length gaps push it up).

   Every decode-carrying iteration gives each of its ``d`` decoding streams
   one inter-token gap equal to its interval, so the per-token gap
   distribution is the distribution of iteration times weighted by
   ``num_decodes``. The controller keeps the last ``tail_window``
   iterations and, every ``tail_check_every`` decode-carrying iterations,
   rebuilds from the *same* window the gap distribution the engine would have
   produced under a prefill limit ``L`` (:func:`counterfactual_gaps`):
   decode-only iterations are kept; each maximal run of consecutive mixed
   iterations (``P`` prefill tokens, excess device time ``E`` over the median
   decode-only step ``t0``, ``D`` decode-slots over ``k`` iterations) becomes
   ``n = ceil(P / L)`` iterations of ``t0 + E / n`` seconds with ``D / k``
   decodes each: prefill cost is spread linearly over the chunks. ``L`` is the
   candidate cap, or for "no cap" the largest prefill chunk seen in any
   iteration (the engine's own token budget). Both sides are rebuilt by the
   same model, so its bias cancels, and both come from the same arrivals, so
   load drift between periods does not enter (the flaw of comparing a capped
   period with an uncapped one). The cap is used only if it lowers the
   ``tail_quantile`` gap by more than ``tail_margin`` *and* is not worse (by
   more than ``tail_margin``) at any quantile whose tail mass lies between
   ``tail_band`` times larger and smaller (P98 to P99.5 for P99 with the
   default 2; ``TAIL_GRID`` quantiles evenly spaced in log tail mass): the
   controller sees warm-ups and a finite window, so the tail mass it measures
   is uncertain by about that factor, and a decision that flips inside that
   band is a coin toss (the P99 knife-edge). Otherwise the controller stands
   down (no cap). The first decision waits for ``tail_min_samples`` decode
   gaps (uncapped "reference" phase; default ``10 / (1 - 0.99) = 1000``,
   about ten gaps beyond the P99); later checks run every
   ``tail_check_every`` gaps. While uncapped, every mixed iteration of at
   least ``min_cap`` prefill tokens counts for the proportional law as a
   cycle run at a cap equal to its prefill, so the cap the check weighs is
   the target's, not the initial one.
   The check keeps running while stood down, so capping resumes as soon as
   the rebuilt tail says it helps; no blind re-probing is needed.

   With ``infeasible_stand_down`` (default off) the controller also stands
   down while the target is infeasible: the reliable estimate predicts even
   ``min_cap`` over ``target_s``, or (without one) ``infeasible_after``
   consecutive guarded cycles at ``min_cap`` overran it. Off by default
   because on the simulator a cap whose iterations miss the 80 ms target
   still cuts the P99 when stalls are frequent (Qwen3-8B at 0.25 req/s); the
   tail check catches the case where it does not (Qwen3-8B at 0.10 req/s).
4. **TTFT guard** (``use_ttft_guard``, needs ``ttft_slo_s``): when the oldest
   waiting request would otherwise miss its TTFT SLO, ``prefill_cap`` grants a
   larger chunk. If the backend passes ``oldest_remaining_tokens`` (its
   remaining prompt tokens) the guard picks the smallest quantised chunk
   ``c`` in ``(cap, max_cap]`` with ``ceil(R / c) * T(c) <= slack``
   (``T`` from the estimate when reliable, else ``target_s * c / cap``), or
   no cap if none fits. Without it the guard grants ``max_cap`` once the
   request has used ``ttft_guard_frac`` of its SLO. The guard never acts once
   the SLO has already been missed (``slack <= 0``): the request fails anyway
   and a bigger chunk would only stall the decoding streams.

Decision reasons (``Decision.reason``), one per ``observe`` call:
``reference`` (initial uncapped phase), ``stood_down``, ``stand_down_tail``,
``stand_down_infeasible`` (transitions to no cap), ``resume`` (tail check
turns capping on), ``estimate`` and ``proportional`` (guarded cycle, cap from
the estimate / proportional law), ``ttft_guard`` (guarded cycle run under a
guard-granted chunk: the proportional law is not applied to it),
``unguarded`` (no decode or no prefill or no cap; in estimate mode the cap may
still move with the refreshed estimate).

Times are seconds; caps and prefill sizes are tokens.

History: the first version compared the P99 of the last capped window with
that of an uncapped window from another period (the reference phase or a
stand-down) and re-probed blindly with back-off; on the simulator that test
was dominated by load differences between the two periods (a start-up burst
in the reference made any cap look better) and left Qwen3-0.6B at +60..330 %
P99 ITL. The counterfactual band check replaced it.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from dlfp.policies.base import (
    PAPER_GAIN,
    PAPER_INITIAL_CAP,
    PAPER_MAX_CAP,
    PAPER_MIN_CAP,
    PAPER_QUANTUM,
    PAPER_TARGET_S,
    DLFP,
    Observation,
    _check_count,
)

# Regressor scaling for numerical conditioning only (the fit is invariant to it
# apart from the weak prior): prefill tokens / 1000, decodes / 100.
_P_SCALE = 1000.0
_D_SCALE = 100.0
_PRIOR_VAR = 1.0e4  # initial RLS covariance diagonal: a weak prior
_MAX_TRACE = 1.0e8  # covariance trace bound: stops forgetting-induced windup

ESTIMATOR_SAMPLES = ("prefill", "guarded", "all")

#: Option name -> default. See :class:`DLFPS` for meanings.
DEFAULT_OPTIONS: dict[str, Any] = {
    "use_estimator": True,
    "use_feasibility": True,
    "use_ttft_guard": True,
    "ttft_slo_s": None,
    "forgetting": 0.95,
    "min_samples": 8,
    "max_rel_error": 0.15,
    "estimator_samples": "prefill",
    "infeasible_stand_down": False,
    "infeasible_after": 3,
    "tail_quantile": 0.99,
    "tail_band": 2.0,
    "tail_margin": 0.05,
    "tail_window": 20000,
    "tail_min_samples": 1000,
    "tail_check_every": 100,
    "ttft_guard_frac": 0.5,
}



def _opt_bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"dlfps option {name} must be true or false, got {v!r}")
    return v


def _opt_int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"dlfps option {name} must be an integer >= {lo}, got {v!r}")
    return v


def _opt_float(name: str, v: Any, lo: float, hi: float, lo_open: bool, hi_open: bool) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        f = float("nan")
    ok = (
        not isinstance(v, bool)
        and math.isfinite(f)
        and (f > lo if lo_open else f >= lo)
        and (f < hi if hi_open else f <= hi)
    )
    if not ok:
        lb = "(" if lo_open else "["
        rb = ")" if hi_open else "]"
        raise ValueError(f"dlfps option {name} must be a number in {lb}{lo}, {hi}{rb}, got {v!r}")
    return f


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


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """Lower weighted quantile: smallest ``v`` with cumulative weight >= ``q`` * total.

    Raises:
        ValueError: empty input or non-positive total weight.
    """
    total = float(sum(weights))
    if not values or total <= 0:
        raise ValueError("weighted_quantile needs at least one sample with positive weight")
    pairs = sorted(zip(values, weights))
    need = q * total
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= need - 1e-12 * total:
            return v
    return pairs[-1][0]


def counterfactual_gaps(entries, limit: float) -> tuple[np.ndarray, np.ndarray]:
    """Decode-gap distribution a window of iterations would have had under prefill limit ``limit``.

    Args:
        entries: sequence of ``(prefill_tokens, num_decodes, interval_s)`` in
            iteration order (any iterations; ``num_decodes == 0`` ones give no
            gap and end a mixed run).
        limit: prefill tokens allowed per mixed iteration (> 0).

    Returns:
        ``(values_s, weights)``, float arrays of equal shape (m,): each
        decode-only iteration as it was (weight = its decodes) and, for each
        maximal run of consecutive mixed iterations with ``P`` prefill tokens,
        ``k`` iterations, ``D`` decode-slots and excess time ``E = sum(max(t -
        t0, 0))``, one entry ``t0 + E / n`` with weight ``n * D / k`` where
        ``n = max(1, ceil(P / limit))``. ``t0`` is the median decode-only
        interval, or the smallest mixed interval when the window has no
        decode-only iteration. Empty arrays when no iteration has decodes.

    Raises:
        ValueError: ``limit`` not positive.
    """
    if not limit > 0:
        raise ValueError(f"counterfactual_gaps: limit must be positive, got {limit!r}")
    a = np.asarray(entries, dtype=float).reshape(-1, 3)
    p, d, t = a[:, 0], a[:, 1], a[:, 2]
    dec = (p == 0) & (d > 0)
    mixed = (p > 0) & (d > 0)
    if not (dec.any() or mixed.any()):
        return np.zeros(0), np.zeros(0)
    t0 = float(np.median(t[dec])) if dec.any() else float(t[mixed].min())
    vals, wts = [t[dec]], [d[dec]]
    if mixed.any():
        run = np.cumsum(~mixed)[mixed]  # run id: constant over consecutive mixed iterations
        _, inv = np.unique(run, return_inverse=True)
        P = np.bincount(inv, weights=p[mixed])
        E = np.bincount(inv, weights=np.maximum(t[mixed] - t0, 0.0))
        D = np.bincount(inv, weights=d[mixed])
        k = np.bincount(inv).astype(float)
        n = np.maximum(1.0, np.ceil(P / float(limit) - 1e-9))
        vals.append(t0 + E / n)
        wts.append(n * D / k)
    return np.concatenate(vals), np.concatenate(wts)


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float]:
    """:func:`weighted_quantile` at several ``qs`` at once (lower weighted quantile).

    Raises:
        ValueError: empty input or non-positive total weight.
    """
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    total = float(w.sum())
    if v.size == 0 or total <= 0:
        raise ValueError("weighted_quantiles needs at least one sample with positive weight")
    order = np.argsort(v, kind="stable")
    cw = np.cumsum(w[order])
    out = []
    for q in qs:
        i = int(np.searchsorted(cw, q * total - 1e-12 * total, side="left"))
        out.append(float(v[order][min(i, v.size - 1)]))
    return out


_CAPPED, _STOOD_DOWN, _REFERENCE = "capped", "stood_down", "reference"

#: Number of quantiles the tail check compares across its band (odd: the middle one is tail_quantile).
TAIL_GRID = 17


class DLFPS(DLFP):
    """DLFP-S: completion-timed DLFP with online estimate, feasibility and TTFT guards.

    Args (the first seven as :class:`dlfp.policies.base.DLFP`; paper defaults):
        target_s, initial_cap, min_cap, max_cap, quantum, gain: as DLFP.
        signal: ``"device_completion"`` (default) or ``"host_cadence"`` (ablation).
        **options (see ``DEFAULT_OPTIONS``):
            use_estimator (True): RLS estimate + jump; False = proportional only.
            use_feasibility (True): counterfactual tail check (reference phase,
                stand-down, resume); False = always cap, never stand down.
            use_ttft_guard (True): TTFT guard; acts only when ``ttft_slo_s`` set.
            ttft_slo_s (None): TTFT SLO in seconds (from the experiment SLO).
            forgetting (0.95): RLS forgetting factor in (0, 1].
            min_samples (8): samples before the estimate can be reliable (>= 3).
            max_rel_error (0.15): largest RMS relative prediction error of a
                reliable estimate.
            estimator_samples ("prefill"): which iterations feed the fit:
                "prefill" = every iteration with prefill tokens (guarded,
                uncapped mixed and prefill-only), "guarded" = guarded cycles
                only, "all" = also decode-only iterations.
            infeasible_stand_down (False): also stand down while the target is
                infeasible (module docstring, part 3).
            infeasible_after (3): consecutive guarded cycles at ``min_cap``
                over the target that mean "infeasible" without a reliable fit.
            tail_quantile (0.99): decode-gap quantile the tail check protects.
            tail_band (2.0): factor on the tail mass ``1 - tail_quantile`` that
                gives the two side quantiles checked too (1 = only the one).
            tail_margin (0.05): relative margin of the tail check.
            tail_window (20000): iterations kept for the tail check.
            tail_min_samples (1000): decode gaps (sum of ``num_decodes``)
                before the first tail decision (the uncapped reference phase).
            tail_check_every (100): decode gaps between checks.
            ttft_guard_frac (0.5): without ``oldest_remaining_tokens``, the
                share of the TTFT SLO waited after which ``max_cap`` is granted.

    Raises:
        ValueError: any DLFP parameter error; an unknown option; an option of
            the wrong type or out of range (the message names the option).
    """

    name = "dlfps"

    def __init__(
        self,
        target_s: float = PAPER_TARGET_S,
        initial_cap: int = PAPER_INITIAL_CAP,
        min_cap: int = PAPER_MIN_CAP,
        max_cap: int = PAPER_MAX_CAP,
        quantum: int = PAPER_QUANTUM,
        gain: float = PAPER_GAIN,
        signal: str = "device_completion",
        **options: Any,
    ) -> None:
        super().__init__(target_s, initial_cap, min_cap, max_cap, quantum, gain, signal)
        unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
        if unknown:
            raise ValueError(f"unknown dlfps option(s) {unknown}; known: {sorted(DEFAULT_OPTIONS)}")
        o = {**DEFAULT_OPTIONS, **options}
        self.use_estimator = _opt_bool("use_estimator", o["use_estimator"])
        self.use_feasibility = _opt_bool("use_feasibility", o["use_feasibility"])
        self.use_ttft_guard = _opt_bool("use_ttft_guard", o["use_ttft_guard"])
        self.ttft_slo_s = (
            None if o["ttft_slo_s"] is None else _opt_float("ttft_slo_s", o["ttft_slo_s"], 0, math.inf, True, True)
        )
        self.forgetting = _opt_float("forgetting", o["forgetting"], 0, 1, True, False)
        self.min_samples = _opt_int("min_samples", o["min_samples"], 3)
        self.max_rel_error = _opt_float("max_rel_error", o["max_rel_error"], 0, math.inf, True, True)
        if o["estimator_samples"] not in ESTIMATOR_SAMPLES:
            raise ValueError(
                f"dlfps option estimator_samples must be one of {ESTIMATOR_SAMPLES}, got {o['estimator_samples']!r}"
            )
        self.estimator_samples = o["estimator_samples"]
        self.infeasible_stand_down = _opt_bool("infeasible_stand_down", o["infeasible_stand_down"])
        self.infeasible_after = _opt_int("infeasible_after", o["infeasible_after"], 1)
        self.tail_quantile = _opt_float("tail_quantile", o["tail_quantile"], 0, 1, True, True)
        self.tail_band = _opt_float("tail_band", o["tail_band"], 1, math.inf, False, True)
        if (1 - self.tail_quantile) * self.tail_band >= 1:
            raise ValueError(
                f"dlfps option tail_band={self.tail_band} is too wide for tail_quantile={self.tail_quantile}"
            )
        self.tail_margin = _opt_float("tail_margin", o["tail_margin"], 0, 1, False, True)
        self.tail_window = _opt_int("tail_window", o["tail_window"], 1)
        self.tail_min_samples = _opt_int("tail_min_samples", o["tail_min_samples"], 1)
        if self.tail_min_samples > self.tail_window:
            raise ValueError(
                f"dlfps option tail_min_samples={self.tail_min_samples} is larger than tail_window={self.tail_window}"
            )
        self.tail_check_every = _opt_int("tail_check_every", o["tail_check_every"], 1)
        self.ttft_guard_frac = _opt_float("ttft_guard_frac", o["ttft_guard_frac"], 0, 1, True, True)

        self.estimator = RLSEstimator(self.forgetting)
        self.mode = _REFERENCE if self.use_feasibility else _CAPPED
        self._over_at_min = 0  # consecutive guarded cycles at min_cap over target
        self._window: deque[tuple[int, int, float]] = deque(maxlen=self.tail_window)
        self._gaps = 0  # decode gaps seen (sum of num_decodes of iterations with an interval)
        self._since_check = 0
        self._max_prefill = 0  # largest prefill chunk seen: the engine's own limit
        self._grants: deque[int | None] = deque(maxlen=16)  # caps granted by the TTFT guard
        self.guard_grants = 0
        self.num_checks = 0
        #: last tail check: {"quantiles", "capped", "uncapped", "limit", "no_cap_limit"} (seconds, tokens)
        self.last_tail: dict[str, Any] | None = None

    # ------------------------------------------------------------------ estimate
    @property
    def estimate_reliable(self) -> bool:
        """True when the RLS fit may drive the cap (see the module docstring)."""
        if not self.use_estimator:
            return False
        e = self.estimator
        if e.n < self.min_samples or e.coef[1] <= 0:
            return False
        err = e.rel_error
        return math.isfinite(err) and err <= self.max_rel_error

    def predict_s(self, prefill_tokens: float, num_decodes: float) -> float:
        """The fitted iteration time (seconds); meaningful when ``estimate_reliable``."""
        return self.estimator.predict(prefill_tokens, num_decodes)

    def estimate_cap(self, num_decodes: int) -> int | None:
        """Largest multiple of ``quantum`` whose predicted time meets ``target_s``, clamped.

        Returns ``None`` when even ``min_cap`` is predicted to exceed the target
        (infeasible), else a cap in ``[min_cap, max_cap]``. Uses the current fit
        whether or not it is reliable.
        """
        a, b, c = self.estimator.coef
        if self.predict_s(self.min_cap, num_decodes) > self.target_s * (1 + 1e-9):
            return None
        if b <= 0:
            return self.max_cap
        raw = (self.target_s - a - c * num_decodes) / b
        q = int(math.floor(raw / self.quantum + 1e-9)) * self.quantum
        return min(self.max_cap, max(self.min_cap, q))

    def _target_cap(self, num_decoding: int) -> int:
        """The cap for the next mixed iteration: estimate (``min_cap`` if infeasible) or the proportional cap."""
        if self.estimate_reliable:
            est = self.estimate_cap(max(num_decoding, 1))
            return self.min_cap if est is None else est
        return self.cap  # type: ignore[return-value]

    # ------------------------------------------------------------------ policy
    def prefill_cap(
        self,
        num_decoding: int,
        *,
        now_s: float = 0.0,
        oldest_waiting_s: float | None = None,
        oldest_remaining_tokens: int | None = None,
    ) -> int | None:
        """The prefill cap (tokens) for the next iteration, or ``None`` for no cap.

        ``None`` with no decoding request, in the reference phase and while
        stood down. Otherwise the estimate cap for ``num_decoding`` decodes
        (``min_cap`` when the target is infeasible) or the proportional cap,
        possibly raised by the TTFT guard. ``oldest_waiting_s`` is how long the
        oldest request without a first token has waited (seconds);
        ``oldest_remaining_tokens`` (optional) its prompt tokens still to prefill.

        Raises:
            ValueError: negative or non-integer ``num_decoding``.
        """
        _check_count("num_decoding", num_decoding)
        if num_decoding == 0 or self.mode != _CAPPED:
            return None
        cap = self._target_cap(num_decoding)
        granted = self._ttft_guard(cap, num_decoding, oldest_waiting_s, oldest_remaining_tokens)
        if granted != cap:
            self._grants.append(granted)
            self.guard_grants += 1
        return granted

    def _iter_time(self, chunk: int, base_cap: int, num_decoding: int) -> float:
        if self.estimate_reliable:
            return max(self.predict_s(chunk, num_decoding), 1e-9)
        return self.target_s * chunk / base_cap

    def _ttft_guard(
        self, cap: int, num_decoding: int, waited: float | None, remaining: int | None
    ) -> int | None:
        if not self.use_ttft_guard or self.ttft_slo_s is None or waited is None:
            return cap
        slack = self.ttft_slo_s - waited
        if slack <= 0:  # already missed: a bigger chunk cannot save it
            return cap
        if remaining is None:
            if waited >= self.ttft_guard_frac * self.ttft_slo_s:
                return max(cap, self.max_cap)
            return cap
        _check_count("oldest_remaining_tokens", remaining)
        if remaining == 0:
            return cap

        def need(c: int) -> float:
            return math.ceil(remaining / c) * self._iter_time(c, cap, num_decoding)

        if need(cap) <= slack:
            return cap
        c = cap + self.quantum
        while c <= self.max_cap:
            if need(c) <= slack:
                return c
            c += self.quantum
        return None

    # ------------------------------------------------------------------ tail check
    def tail_quantiles(self) -> tuple[float, ...]:
        """The quantiles the tail check compares, ascending, shape (TAIL_GRID,).

        Tail masses ``m * band ** x`` for ``x`` evenly spaced from 1 down to -1
        (``m = 1 - tail_quantile``), i.e. from ``1 - m * band`` to ``1 - m /
        band``; the middle one is ``tail_quantile``. With ``tail_band = 1``
        just ``(tail_quantile,)``.
        """
        m = 1.0 - self.tail_quantile
        if self.tail_band == 1.0:
            return (self.tail_quantile,)
        xs = np.linspace(1.0, -1.0, TAIL_GRID)
        qs = [1.0 - m * self.tail_band**x for x in xs]
        qs[TAIL_GRID // 2] = self.tail_quantile
        return tuple(float(q) for q in qs)

    def tail_check(self, limit: int) -> bool:
        """True when capping at ``limit`` tokens beats no cap on the rebuilt window tail.

        Rebuilds the window under ``limit`` and under the largest prefill chunk
        seen (:func:`counterfactual_gaps`) and compares the quantiles of
        :meth:`tail_quantiles`: the cap must be lower than no cap by more than
        ``tail_margin`` at ``tail_quantile`` and not higher by more than
        ``tail_margin`` at every other one. False when the window has no gap or
        no prefill chunk larger than ``limit`` was ever seen (a cap that never
        binds cannot help). Stores the numbers in ``last_tail``.
        """
        none_limit = self._max_prefill
        if not self._window or none_limit <= limit:
            self.last_tail = None
            return False
        qs = self.tail_quantiles()
        cv, cw = counterfactual_gaps(self._window, limit)
        uv, uw = counterfactual_gaps(self._window, none_limit)
        if cv.size == 0 or cw.sum() <= 0:
            self.last_tail = None
            return False
        qc = weighted_quantiles(cv, cw, qs)
        qu = weighted_quantiles(uv, uw, qs)
        self.last_tail = {"quantiles": qs, "capped": qc, "uncapped": qu, "limit": limit, "no_cap_limit": none_limit}
        m = self.tail_margin
        mid = qs.index(self.tail_quantile)
        better = qc[mid] < qu[mid] * (1.0 - m)
        no_worse = all(c <= u * (1.0 + m) for c, u in zip(qc, qu))
        return bool(better and no_worse)

    def _typical_decodes(self) -> int:
        ds = [d for p, d, _ in self._window if p > 0 and d > 0]
        if not ds:
            return 1
        ds.sort()
        return max(1, ds[len(ds) // 2])

    def _infeasible(self, obs: Observation) -> bool:
        if self.estimate_reliable:
            return self.estimate_cap(max(obs.num_decodes, 1)) is None
        return self._over_at_min >= self.infeasible_after

    # ------------------------------------------------------------------ observe
    def _wants_sample(self, obs: Observation) -> bool:
        if self.estimator_samples == "all":
            return obs.prefill_tokens > 0 or obs.num_decodes > 0
        if self.estimator_samples == "guarded":
            return obs.guarded
        return obs.prefill_tokens > 0

    def _current_cap(self) -> int | None:
        return self.cap if self.mode == _CAPPED else None

    def observe(self, obs: Observation) -> None:
        """Learn from one iteration, run the guards, and log a ``Decision``.

        Raises:
            ValueError: a guarded iteration (in the capped mode) without the
                ``signal`` interval, or with a non-positive or non-finite one.
        """
        iv = obs.interval(self.signal)
        if iv is not None and not (math.isfinite(iv) and iv > 0):
            if obs.guarded and self.mode == _CAPPED:
                raise ValueError(
                    f"guarded iteration {obs.iteration}: {self.signal} interval must be positive and finite, got {iv!r}"
                )
            iv = None  # an unusable interval of an unguarded iteration is ignored
        if obs.guarded and self.mode == _CAPPED and iv is None:
            raise ValueError(
                f"guarded iteration {obs.iteration} has no {self.signal} interval: backends must "
                f"call observe() once the {self.signal} signal is known"
            )
        before = self._current_cap()
        granted = obs.guarded and obs.cap in self._grants and (self.cap is None or obs.cap > self.cap)
        if granted:
            self._grants.remove(obs.cap)

        # 1. learn (every qualifying iteration with a known interval, any mode)
        if iv is not None and self.use_estimator and self._wants_sample(obs):
            self.estimator.update(obs.prefill_tokens, obs.num_decodes, iv)
        self._max_prefill = max(self._max_prefill, int(obs.prefill_tokens))
        if iv is not None:
            self._window.append((int(obs.prefill_tokens), int(obs.num_decodes), float(iv)))
        if obs.num_decodes > 0 and iv is not None:
            self._gaps += int(obs.num_decodes)
            self._since_check += int(obs.num_decodes)
        if self.mode != _CAPPED and iv is not None and obs.num_decodes > 0 and obs.prefill_tokens >= self.min_cap:
            # an uncapped mixed iteration is a cycle "at cap = its prefill": the proportional law learns
            # from it, so the candidate cap the tail check weighs is already the target's, not the initial one
            self.cap = self.next_cap(int(obs.prefill_tokens), iv)
        if obs.guarded and not granted and self.mode == _CAPPED:
            at_min = self.cap == self.min_cap and (obs.cap is None or obs.cap <= self.min_cap)
            self._over_at_min = self._over_at_min + 1 if (at_min and iv > self.target_s) else 0

        # 2. feasibility: the counterfactual tail check (and, optionally, the target's feasibility)
        if self.use_feasibility:
            due = self._gaps >= self.tail_min_samples and (
                self.mode == _REFERENCE or self._since_check >= self.tail_check_every
            )
            if due:
                self._since_check = 0
                self.num_checks += 1
                infeasible = self.infeasible_stand_down and self._infeasible(obs)
                want = (not infeasible) and self.tail_check(self._target_cap(self._typical_decodes()))
                if want and self.mode != _CAPPED:
                    self.mode = _CAPPED
                    self._over_at_min = 0
                    if self.estimate_reliable:
                        self.cap = self._target_cap(max(obs.num_decodes, 1))
                    self._record(obs, before, self.cap, "resume")
                    return
                if not want and self.mode != _STOOD_DOWN:
                    self.mode = _STOOD_DOWN
                    self._record(obs, before, None, "stand_down_infeasible" if infeasible else "stand_down_tail")
                    return
            if self.mode != _CAPPED:
                self._record(obs, None, None, "reference" if self.mode == _REFERENCE else "stood_down")
                return

        # 3. cap update (capped mode)
        if self.estimate_reliable:
            self.cap = self._target_cap(max(obs.num_decodes, 1))
            reason = "ttft_guard" if granted else ("estimate" if obs.guarded else "unguarded")
        elif obs.guarded and not granted:
            self.cap = self.next_cap(self.cap, iv)  # type: ignore[arg-type]
            reason = "proportional"
        else:
            reason = "ttft_guard" if granted else "unguarded"
        self._record(obs, before, self.cap, reason)

    def params(self) -> dict:
        """Parameters (DLFP's plus every option) for the trace metadata."""
        opts = {k: getattr(self, k) for k in DEFAULT_OPTIONS}
        return {**super().params(), **opts}


__all__ = [
    "DEFAULT_OPTIONS",
    "DLFPS",
    "ESTIMATOR_SAMPLES",
    "RLSEstimator",
    "counterfactual_gaps",
    "weighted_quantile",
    "weighted_quantiles",
]
