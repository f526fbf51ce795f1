"""DLFP-S: a completion-timed, self-checking prefill-cap controller (issue 8).

Same ``Policy`` interface as :class:`dlfp.controller.DLFP` (``prefill_cap`` /
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
   clamped to ``[min_cap, max_cap]``. Otherwise DLFP's proportional law
   (:meth:`dlfp.controller.DLFP.next_cap`) is the fallback.
3. **Feasibility** (``use_feasibility``): the controller stands down (returns
   ``None`` = no cap) when

   * the reliable estimate predicts that even ``min_cap`` tokens with the
     observed decodes exceed ``target_s``; or, without a reliable estimate,
     ``infeasible_after`` consecutive guarded cycles at ``min_cap`` overran
     the target (the measured version of the same test); or
   * the decode-gap tail under the cap is worse than the tail without it.
     Every iteration with ``d >= 1`` decodes gives each of those ``d`` streams
     one inter-token gap equal to the iteration time, so the per-token
     decode-gap distribution is the distribution of iteration times weighted
     by ``num_decodes``, over *all* decode-carrying iterations (decode-only
     ones included: a cap spreads one long prefill over several iterations,
     so it trades one very long gap for several medium ones, and only the
     whole distribution shows which tail is worse). The ``tail_quantile``
     (default P99) of the last ``tail_window`` capped decode-carrying
     iterations is compared with that of the last ``tail_window`` uncapped
     ones. Uncapped samples come from an initial reference phase of
     ``reference_iters`` decode-carrying iterations run with no cap, and from
     every stand-down period (which is exactly "the tail the engine produces
     without the cap", measured on the same run).

   While stood down the controller re-probes (returns to capping, with a fresh
   capped window) after ``reprobe_iters`` decode-carrying iterations or
   ``reprobe_s`` seconds, whichever comes first; every further stand-down
   before a probe has proved itself (passed a tail comparison) multiplies that
   wait by ``reprobe_backoff`` (at most ``reprobe_backoff_max`` times).
   With ``infeasible_probe`` (default) the target test acts only until the
   first stand-down; after that re-probes run at ``min_cap`` and the measured
   tail comparison alone decides, because a cap that cannot meet the target
   can still shorten the tail when uncapped stalls are frequent. With
   ``infeasible_probe=False`` a re-probe is skipped (the stand-down renewed)
   while the reliable estimate still predicts ``min_cap`` infeasible.
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
``reference`` (initial uncapped phase), ``stood_down``, ``stand_down_infeasible``,
``stand_down_tail`` (transitions), ``reprobe`` (back to capping), ``estimate``
and ``proportional`` (guarded cycle, cap from the estimate / proportional law),
``ttft_guard`` (guarded cycle run under a guard-granted chunk: the proportional
law is not applied to it), ``unguarded`` (no decode or no prefill or no cap; in
estimate mode the cap may still move with the refreshed estimate).

Times are seconds; caps and prefill sizes are tokens.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any

from .controller import (
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
    "infeasible_after": 3,
    "tail_quantile": 0.99,
    "tail_margin": 0.05,
    "tail_window": 1000,
    "tail_min_samples": 200,
    "tail_check_every": 50,
    "reference_iters": 200,
    "reprobe_iters": 500,
    "reprobe_s": None,
    "reprobe_backoff": 2.0,
    "reprobe_backoff_max": 16.0,
    "infeasible_probe": True,
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


_CAPPED, _STOOD_DOWN, _REFERENCE = "capped", "stood_down", "reference"


class DLFPS(DLFP):
    """DLFP-S: completion-timed DLFP with online estimate, feasibility and TTFT guards.

    Args (the first seven as :class:`dlfp.controller.DLFP`; paper defaults):
        target_s, initial_cap, min_cap, max_cap, quantum, gain: as DLFP.
        signal: ``"device_completion"`` (default) or ``"host_cadence"`` (ablation).
        **options (see ``DEFAULT_OPTIONS``):
            use_estimator (True): RLS estimate + jump; False = proportional only.
            use_feasibility (True): stand-down on infeasibility / worse tail,
                reference phase and re-probing; False = never stand down.
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
            infeasible_after (3): consecutive guarded cycles at ``min_cap``
                over the target that mean "infeasible" without a reliable fit.
            tail_quantile (0.99): decode-gap quantile compared.
            tail_margin (0.05): capped tail must exceed uncapped * (1 + margin)
                to stand down.
            tail_window (1000): decode-carrying iterations kept per regime.
            tail_min_samples (200): samples needed in both windows to compare.
            tail_check_every (50): compare every this many capped samples.
            reference_iters (200): decode-carrying iterations run uncapped at
                the start to measure the engine's own tail (0 = start capped).
            reprobe_iters (500): decode-carrying iterations stood down before
                a re-probe.
            reprobe_s (None): also re-probe after this many seconds stood down.
            reprobe_backoff (2.0): wait multiplier per failed probe (>= 1).
            reprobe_backoff_max (16.0): largest total multiplier.
            ttft_guard_frac (0.5): without ``oldest_remaining_tokens``, the
                share of the TTFT SLO waited after which ``max_cap`` is granted.
            infeasible_probe (True): after the first stand-down, let the tail
                comparison alone judge probes (see the module docstring).

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
        self.infeasible_after = _opt_int("infeasible_after", o["infeasible_after"], 1)
        self.tail_quantile = _opt_float("tail_quantile", o["tail_quantile"], 0, 1, True, True)
        self.tail_margin = _opt_float("tail_margin", o["tail_margin"], 0, math.inf, False, True)
        self.tail_window = _opt_int("tail_window", o["tail_window"], 1)
        self.tail_min_samples = _opt_int("tail_min_samples", o["tail_min_samples"], 1)
        if self.tail_min_samples > self.tail_window:
            raise ValueError(
                f"dlfps option tail_min_samples={self.tail_min_samples} is larger than tail_window={self.tail_window}"
            )
        self.tail_check_every = _opt_int("tail_check_every", o["tail_check_every"], 1)
        self.reference_iters = _opt_int("reference_iters", o["reference_iters"], 0)
        self.reprobe_iters = _opt_int("reprobe_iters", o["reprobe_iters"], 1)
        self.reprobe_s = (
            None if o["reprobe_s"] is None else _opt_float("reprobe_s", o["reprobe_s"], 0, math.inf, True, True)
        )
        self.reprobe_backoff = _opt_float("reprobe_backoff", o["reprobe_backoff"], 1, math.inf, False, True)
        self.reprobe_backoff_max = _opt_float(
            "reprobe_backoff_max", o["reprobe_backoff_max"], 1, math.inf, False, True
        )
        self.ttft_guard_frac = _opt_float("ttft_guard_frac", o["ttft_guard_frac"], 0, 1, True, True)
        self.infeasible_probe = _opt_bool("infeasible_probe", o["infeasible_probe"])
        self._stood_down_once = False

        self.estimator = RLSEstimator(self.forgetting)
        self.mode = _REFERENCE if (self.use_feasibility and self.reference_iters > 0) else _CAPPED
        self._mode_iters = 0  # decode-carrying iterations since the mode began
        self._mode_since_s: float | None = None
        self._failed_probes = 0  # consecutive stand-downs before a probe proved itself
        self._over_at_min = 0  # consecutive guarded cycles at min_cap over target
        self._capped: deque[tuple[float, int]] = deque(maxlen=self.tail_window)
        self._uncapped: deque[tuple[float, int]] = deque(maxlen=self.tail_window)
        self._since_check = 0
        self._probe_proven = False
        self._grants: deque[int | None] = deque(maxlen=16)  # caps granted by the TTFT guard
        self.guard_grants = 0
        self.last_tail: tuple[float, float] | None = None  # (capped, uncapped) at the last comparison

    @property
    def backoff(self) -> float:
        """Multiplier of the stand-down wait: ``reprobe_backoff ** (failed probes - 1)``, capped."""
        k = max(self._failed_probes - 1, 0)
        return min(self.reprobe_backoff_max, self.reprobe_backoff**k)

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

    @property
    def _infeasible_rule_active(self) -> bool:
        """Whether "min_cap predicted over target" still stands the controller down."""
        return self.use_feasibility and not (self.infeasible_probe and self._stood_down_once)

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
        (estimate mode) or the proportional cap, possibly raised by the TTFT
        guard. ``oldest_waiting_s`` is how long the oldest request without a
        first token has waited (seconds); ``oldest_remaining_tokens`` (optional)
        its prompt tokens still to prefill.

        Raises:
            ValueError: negative or non-integer ``num_decoding``.
        """
        _check_count("num_decoding", num_decoding)
        if num_decoding == 0 or self.mode != _CAPPED:
            return None
        cap: int | None = self.cap
        if self.estimate_reliable:
            cap = self.estimate_cap(num_decoding)
            if cap is None:  # infeasible now: the next observe() stands down if allowed
                cap = None if self._infeasible_rule_active else self.min_cap
        if cap is None:
            return None
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

    # ------------------------------------------------------------------ observe
    def _wants_sample(self, obs: Observation) -> bool:
        if self.estimator_samples == "all":
            return obs.prefill_tokens > 0 or obs.num_decodes > 0
        if self.estimator_samples == "guarded":
            return obs.guarded
        return obs.prefill_tokens > 0

    def _enter(self, mode: str, obs: Observation) -> None:
        self.mode = mode
        self._mode_iters = 0
        self._mode_since_s = obs.time_s
        if mode == _CAPPED:
            self._capped.clear()
            self._since_check = 0
            self._over_at_min = 0
            self._probe_proven = False

    def _stand_down(self, obs: Observation, before: int | None, reason: str) -> None:
        if not self._probe_proven:
            self._failed_probes += 1
        self._stood_down_once = True
        self._enter(_STOOD_DOWN, obs)
        self._record(obs, before, None, reason)

    def _tail_worse(self) -> bool:
        cv, cw = zip(*self._capped)
        uv, uw = zip(*self._uncapped)
        qc = weighted_quantile(list(cv), list(cw), self.tail_quantile)
        qu = weighted_quantile(list(uv), list(uw), self.tail_quantile)
        self.last_tail = (qc, qu)
        return qc > qu * (1.0 + self.tail_margin)

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
        before = self._current_cap()
        granted = obs.guarded and obs.cap in self._grants and (self.cap is None or obs.cap > self.cap)
        if granted:
            self._grants.remove(obs.cap)

        # 1. learn (every qualifying iteration with a known interval, any mode)
        if iv is not None and self.use_estimator and self._wants_sample(obs):
            self.estimator.update(obs.prefill_tokens, obs.num_decodes, iv)

        # 2. decode-gap windows: one gap of length iv for each decoding stream
        has_gap = obs.num_decodes > 0 and iv is not None
        if has_gap:
            self._mode_iters += 1
            (self._capped if self.mode == _CAPPED else self._uncapped).append((iv, obs.num_decodes))
        if self._mode_since_s is None:
            self._mode_since_s = obs.time_s

        # 3. uncapped modes: reference phase and stand-down, with re-probing
        if self.mode == _REFERENCE:
            if self._mode_iters >= self.reference_iters:
                self._reprobe(obs, before)
            else:
                self._record(obs, None, None, "reference")
            return
        if self.mode == _STOOD_DOWN:
            mult = self.backoff
            waited_iters = self._mode_iters >= self.reprobe_iters * mult
            waited_s = self.reprobe_s is not None and obs.time_s - self._mode_since_s >= self.reprobe_s * mult
            if waited_iters or waited_s:
                d = max(obs.num_decodes, 1)
                if not self.infeasible_probe and self.estimate_reliable and self.estimate_cap(d) is None:
                    self._enter(_STOOD_DOWN, obs)  # still infeasible: renew without probing
                    self._record(obs, None, None, "stand_down_infeasible")
                else:
                    self._reprobe(obs, before)
            else:
                self._record(obs, None, None, "stood_down")
            return

        # 4. capped mode
        if obs.guarded and iv is None:
            raise ValueError(
                f"guarded iteration {obs.iteration} has no {self.signal} interval: backends must "
                f"call observe() once the {self.signal} signal is known"
            )
        if self.use_feasibility:
            infeasible_now = obs.num_decodes > 0 and self.estimate_reliable and self.estimate_cap(obs.num_decodes) is None
            if infeasible_now and self._infeasible_rule_active:
                self._stand_down(obs, before, "stand_down_infeasible")
                return
            if obs.guarded and not granted and self._infeasible_rule_active:
                at_min = self.cap == self.min_cap and (obs.cap is None or obs.cap <= self.min_cap)
                self._over_at_min = self._over_at_min + 1 if (at_min and iv > self.target_s) else 0
                if self._over_at_min >= self.infeasible_after:
                    self._stand_down(obs, before, "stand_down_infeasible")
                    return
            if has_gap:
                self._since_check += 1
                enough = len(self._capped) >= self.tail_min_samples
                if enough and self._since_check >= self.tail_check_every:
                    self._since_check = 0
                    if len(self._uncapped) >= self.tail_min_samples and self._tail_worse():
                        self._stand_down(obs, before, "stand_down_tail")
                        return
                    self._probe_proven = True
                    self._failed_probes = 0

        # 5. cap update
        if self.estimate_reliable:
            est = self.estimate_cap(max(obs.num_decodes, 1))
            self.cap = self.min_cap if est is None else est
            reason = "ttft_guard" if granted else ("estimate" if obs.guarded else "unguarded")
        elif obs.guarded and not granted:
            self.cap = self.next_cap(self.cap, iv)  # type: ignore[arg-type]
            reason = "proportional"
        else:
            reason = "ttft_guard" if granted else "unguarded"
        self._record(obs, before, self.cap, reason)

    def _reprobe(self, obs: Observation, before: int | None) -> None:
        self._enter(_CAPPED, obs)
        if self.estimate_reliable:
            est = self.estimate_cap(max(obs.num_decodes, 1))
            if est is not None:
                self.cap = est
        self._record(obs, before, self.cap, "reprobe")

    def params(self) -> dict:
        """Parameters (DLFP's plus every option) for the trace metadata."""
        opts = {k: getattr(self, k) for k in DEFAULT_OPTIONS}
        return {**super().params(), **opts}


__all__ = ["DEFAULT_OPTIONS", "DLFPS", "ESTIMATOR_SAMPLES", "RLSEstimator", "weighted_quantile"]
