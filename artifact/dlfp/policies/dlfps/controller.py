"""DLFP-S: a completion-timed, self-checking prefill-cap controller (this artifact's, not the paper's).

Same ``Policy`` interface as :class:`dlfp.policies.dlfp.DLFP` (``prefill_cap`` /
``observe`` / ``decisions`` / ``params``), no offline profiling and no
per-model constants. It answers the three failure causes the DLFP paper
(arXiv v1, 2026-09-29) names, with four parts that can each be switched off:

1. **Signal** (``signal``, default ``"device_completion"``): the controller
   reads the completed device time of each iteration
   (``Observation.device_time_s``), not the scheduler-call cadence.
2. **Model-free online estimate** (``use_estimator``): the RLS fit of
   :mod:`dlfp.policies.dlfps.estimator`. While the fit is *reliable* (at least
   ``min_samples`` samples, per-token slope ``b > 0``, forgetting-weighted RMS
   of the relative a-priori prediction error <= ``max_rel_error``) the cap
   jumps straight to the largest multiple of ``quantum`` whose predicted
   iteration time meets ``target_s`` for the current number of decodes,
   clamped to ``[min_cap, max_cap]`` (``min_cap`` when even that is predicted
   over the target). Otherwise DLFP's proportional law
   (:meth:`dlfp.policies.dlfp.DLFP.next_cap`) is the fallback.
3. **Feasibility** (``use_feasibility``): the counterfactual tail check of
   :mod:`dlfp.policies.dlfps.tail` decides whether to cap at all. The
   controller keeps the last ``tail_window`` iterations and, every
   ``tail_check_every`` decode gaps, compares the window's rebuilt
   decode-gap tail under the candidate cap with the one under no cap; it caps
   only while the cap wins, else it stands down (no cap). The first decision
   waits for ``tail_min_samples`` decode gaps (uncapped "reference" phase;
   default ``10 / (1 - 0.99) = 1000``, about ten gaps beyond the P99). While
   uncapped, every mixed iteration of at least ``min_cap`` prefill tokens
   counts for the proportional law as a cycle run at a cap equal to its
   prefill, so the cap the check weighs is the target's, not the initial one.
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
   larger chunk (:mod:`dlfp.policies.dlfps.guard`); the iteration time of a
   chunk comes from the estimate when reliable, else ``target_s * chunk / cap``.

Decision reasons (``Decision.reason``), one per ``observe`` call:
``reference`` (initial uncapped phase), ``stood_down``, ``stand_down_tail``,
``stand_down_infeasible`` (transitions to no cap), ``resume`` (tail check
turns capping on), ``estimate`` and ``proportional`` (guarded cycle, cap from
the estimate / proportional law), ``ttft_guard`` (guarded cycle run under a
guard-granted chunk: the proportional law is not applied to it),
``unguarded`` (no decode or no prefill or no cap; in estimate mode the cap may
still move with the refreshed estimate).

Times are seconds; caps and prefill sizes are tokens.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from dlfp.policies.base import Observation, ScheduleContext, check_count
from dlfp.policies.dlfp import (
    DLFP,
    PAPER_GAIN,
    PAPER_INITIAL_CAP,
    PAPER_MAX_CAP,
    PAPER_MIN_CAP,
    PAPER_QUANTUM,
    PAPER_TARGET_S,
)
from dlfp.policies.dlfps.estimator import RLSEstimator
from dlfp.policies.dlfps.guard import guard_chunk
from dlfp.policies.dlfps.options import DEFAULT_OPTIONS, DLFPSOptions
from dlfp.policies.dlfps.tail import IterationWindow, compare_tails, tail_quantiles

_CAPPED, _STOOD_DOWN, _REFERENCE = "capped", "stood_down", "reference"


class DLFPS(DLFP):
    """DLFP-S: completion-timed DLFP with online estimate, feasibility and TTFT guards.

    Args (the first seven as :class:`dlfp.policies.dlfp.DLFP`; paper defaults):
        target_s, initial_cap, min_cap, max_cap, quantum, gain: as DLFP.
        signal: ``"device_completion"`` (default) or ``"host_cadence"`` (ablation).
        **options (checked by :class:`dlfp.policies.dlfps.options.DLFPSOptions`):
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
        o = DLFPSOptions.from_options(options)
        self.use_estimator = o.use_estimator
        self.use_feasibility = o.use_feasibility
        self.use_ttft_guard = o.use_ttft_guard
        self.ttft_slo_s = o.ttft_slo_s
        self.forgetting = o.forgetting
        self.min_samples = o.min_samples
        self.max_rel_error = o.max_rel_error
        self.estimator_samples = o.estimator_samples
        self.infeasible_stand_down = o.infeasible_stand_down
        self.infeasible_after = o.infeasible_after
        self.tail_quantile = o.tail_quantile
        self.tail_band = o.tail_band
        self.tail_margin = o.tail_margin
        self.tail_window = o.tail_window
        self.tail_min_samples = o.tail_min_samples
        self.tail_check_every = o.tail_check_every
        self.ttft_guard_frac = o.ttft_guard_frac

        self.estimator = RLSEstimator(self.forgetting)
        self.mode = _REFERENCE if self.use_feasibility else _CAPPED
        self._over_at_min = 0  # consecutive guarded cycles at min_cap over target
        self._window = IterationWindow(self.tail_window)
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
        context: ScheduleContext | None = None,
    ) -> int | None:
        """The prefill cap (tokens) for the next iteration, or ``None`` for no cap.

        ``None`` with no decoding request, in the reference phase and while
        stood down. Otherwise the estimate cap for ``num_decoding`` decodes
        (``min_cap`` when the target is infeasible) or the proportional cap,
        possibly raised by the TTFT guard. ``oldest_waiting_s`` is how long the
        oldest request without a first token has waited (seconds);
        ``oldest_remaining_tokens`` (optional) its prompt tokens still to prefill.

        Raises:
            ValueError: negative or non-integer ``num_decoding`` or ``oldest_remaining_tokens``.
        """
        check_count("num_decoding", num_decoding)
        if num_decoding == 0 or self.mode != _CAPPED:
            return None
        cap = self._target_cap(num_decoding)
        granted = self._ttft_guard(cap, num_decoding, oldest_waiting_s, oldest_remaining_tokens)
        if granted != cap:
            self._grants.append(granted)
            self.guard_grants += 1
        return granted

    def _iter_time(self, chunk: int, base_cap: int, num_decoding: int) -> float:
        """Iteration time (s) of a ``chunk``-token prefill: the estimate, else ``target_s * chunk / base_cap``."""
        if self.estimate_reliable:
            return max(self.predict_s(chunk, num_decoding), 1e-9)
        return self.target_s * chunk / base_cap

    def _ttft_guard(
        self, cap: int, num_decoding: int, waited: float | None, remaining: int | None
    ) -> int | None:
        """The chunk granted instead of ``cap`` (``cap`` when the guard is off or has no SLO or wait time)."""
        if not self.use_ttft_guard or self.ttft_slo_s is None or waited is None:
            return cap
        return guard_chunk(
            cap, slo_s=self.ttft_slo_s, waited_s=waited, remaining=remaining, guard_frac=self.ttft_guard_frac,
            quantum=self.quantum, max_cap=self.max_cap,
            iter_time_s=lambda chunk: self._iter_time(chunk, cap, num_decoding),
        )

    # ------------------------------------------------------------------ tail check
    def tail_quantiles(self) -> tuple[float, ...]:
        """The quantiles the tail check compares (:func:`dlfp.policies.dlfps.tail.tail_quantiles`)."""
        return tail_quantiles(self.tail_quantile, self.tail_band)

    def tail_check(self, limit: int) -> bool:
        """True when capping at ``limit`` tokens beats no cap on the rebuilt window tail.

        No cap is the largest prefill chunk seen; see
        :func:`dlfp.policies.dlfps.tail.compare_tails`. Stores the numbers
        compared in ``last_tail`` (``None`` when there was nothing to compare).
        """
        wins, self.last_tail = compare_tails(
            self._window, limit, self._max_prefill, self.tail_quantiles(), self.tail_quantile, self.tail_margin
        )
        return wins

    def _typical_decodes(self) -> int:
        """Median decodes of the window's mixed iterations (1 if none): the decodes a candidate cap is sized for."""
        p, d, _ = self._window.columns()
        ds = np.sort(d[(p > 0) & (d > 0)])
        if not ds.size:
            return 1
        return max(1, int(ds[ds.size // 2]))

    def _infeasible(self, obs: Observation) -> bool:
        if self.estimate_reliable:
            return self.estimate_cap(max(obs.num_decodes, 1)) is None
        return self._over_at_min >= self.infeasible_after

    # ------------------------------------------------------------------ observe
    def observe(self, obs: Observation) -> None:
        """Learn from one iteration, run the guards, and log a ``Decision``.

        Raises:
            ValueError: a guarded iteration (in the capped mode) without the
                ``signal`` interval, or with a non-positive or non-finite one.
        """
        iv = self._usable_interval(obs)
        before = self._current_cap()
        granted = obs.guarded and obs.cap in self._grants and (self.cap is None or obs.cap > self.cap)
        if granted:
            self._grants.remove(obs.cap)
        self._learn(obs, iv, granted)
        if self.use_feasibility and self._feasibility_step(obs, before):
            return
        self._update_cap(obs, iv, before, granted)

    def _usable_interval(self, obs: Observation) -> float | None:
        """The ``signal`` interval (seconds) of ``obs``; ``None`` when unknown or unusable on an unguarded iteration.

        Raises:
            ValueError: see ``observe``.
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
        return iv

    def _current_cap(self) -> int | None:
        return self.cap if self.mode == _CAPPED else None

    def _wants_sample(self, obs: Observation) -> bool:
        """Whether ``obs`` feeds the RLS fit under ``estimator_samples``."""
        if self.estimator_samples == "all":
            return obs.prefill_tokens > 0 or obs.num_decodes > 0
        if self.estimator_samples == "guarded":
            return obs.guarded
        return obs.prefill_tokens > 0

    def _learn(self, obs: Observation, iv: float | None, granted: bool) -> None:
        """Feed an iteration with a known interval to the fit, the tail window and the counters (any mode)."""
        if iv is not None and self.use_estimator and self._wants_sample(obs):
            self.estimator.update(obs.prefill_tokens, obs.num_decodes, iv)
        self._max_prefill = max(self._max_prefill, int(obs.prefill_tokens))
        if iv is not None:
            self._window.append(int(obs.prefill_tokens), int(obs.num_decodes), float(iv))
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

    def _feasibility_step(self, obs: Observation, before: int | None) -> bool:
        """Run the tail check when due and switch modes; True when it logged this iteration's decision."""
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
                return True
            if not want and self.mode != _STOOD_DOWN:
                self.mode = _STOOD_DOWN
                self._record(obs, before, None, "stand_down_infeasible" if infeasible else "stand_down_tail")
                return True
        if self.mode != _CAPPED:
            self._record(obs, None, None, "reference" if self.mode == _REFERENCE else "stood_down")
            return True
        return False

    def _update_cap(self, obs: Observation, iv: float | None, before: int | None, granted: bool) -> None:
        """Capped mode: move the cap by the estimate or the proportional law, and log the decision."""
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


__all__ = ["DLFPS"]
