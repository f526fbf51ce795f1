"""DLFP-G: a decode-gap-bounded prefill controller (this artifact's own, not the paper's DLFP).

A user states the decode-gap objective ``itl_target_s`` (default: the
experiment's ITL SLO) and optionally a TTFT budget ``ttft_budget_s`` (default:
its TTFT SLO). While any request decodes, each mixed iteration gets the largest
prefill chunk whose EXPECTED COMPLETED DEVICE TIME stays within
``(1 - headroom) * itl_target_s``:

1. **The estimate** (:class:`dlfp.policies.dlfpg.estimator.CostEstimator`) is
   learned online from completed-work timing: the ``device_completion`` signal
   (``Observation.device_time_s``), never the scheduler cadence (that is the
   ``host_cadence`` ablation). Each sample is the iteration's own features, so
   a short interval of an earlier, smaller batch never grows the chunk.
2. **Conditioned on what the cost depends on**: chunk tokens, the chunk's prior
   context (causal attention pairs), the number of decodes and their context
   (``ScheduleContext`` at scheduling time, ``Observation.prefill_pairs`` /
   ``decode_context_tokens`` when learning). When even ``min_chunk`` is expected
   to exceed the objective at the current context, the decision is
   ``infeasible`` and the chunk is ``min_chunk`` (the request still advances:
   nothing waits for ever). The chunk is never larger than ``trust_factor``
   times the largest prefill timed so far (``trust_limit``): the fit is not
   extrapolated far beyond what it has seen.
3. **TTFT guard**: when the oldest request without a first token would miss
   ``ttft_budget_s`` at the chosen chunk (``waited + ceil(remaining / chunk) *
   T(chunk) > budget``), the guard takes the smallest larger chunk that meets
   the budget, but only if that chunk's expected time is within
   ``ttft_guard_factor * itl_target_s`` (the bounded spend of decode-gap slack);
   if none does, or the budget is already lost, it grants nothing.
4. Before ``warmup_samples`` timed prefills, and with ``use_estimate`` off (an
   ablation), the chunk follows a proportional law on the signal, fed by every
   timed iteration with prefill: over the aim it shrinks to ``min(chunk,
   prefill) * aim / T_obs``; it grows to ``chunk * aim / T_obs`` (at most 2x)
   only after an iteration that prefilled at least the current chunk beside
   decodes; always a multiple of ``quantum`` in ``[min_chunk, max_chunk]``.

Decision reasons (``Decision.reason``, one per ``observe`` call; the reason the
observed iteration's chunk was chosen): ``warmup``, ``proportional``,
``estimate``, ``max_chunk`` (the objective allows the largest chunk),
``trust_limit``, ``infeasible``, ``ttft_guard``; ``no_cap`` for iterations run
without a cap (no decode), ``no_prefill`` for iterations under a cap that
scheduled no prefill (decodes only). ``cap_after`` is the chunk the controller would
choose after learning from the iteration, for its decodes and the context that
follows its chunk.

Times are seconds; chunks are tokens.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any

from dlfp.policies.base import Observation, PolicyBase, ScheduleContext, check_count
from dlfp.policies.dlfpg.estimator import CostEstimator, chunk_pairs
from dlfp.policies.dlfpg.options import DEFAULT_OPTIONS, DLFPGOptions

REASONS: tuple[str, ...] = ("warmup", "proportional", "estimate", "max_chunk", "trust_limit", "infeasible",
                            "ttft_guard", "no_cap", "no_prefill")
_NO_CONTEXT = ScheduleContext()


class DLFPG(PolicyBase):
    """DLFP-G: each mixed iteration sized to an expected completed device time within the decode-gap objective.

    Args:
        signal: ``"device_completion"`` (default) or ``"host_cadence"`` (the ablation).
        **options: checked by :class:`dlfp.policies.dlfpg.options.DLFPGOptions` (names, defaults, ranges there).

    Raises:
        ValueError: an unknown signal; an unknown option or a bad value (one line naming the option).
    """

    name = "dlfpg"
    config_fields = ("signal",)
    wants_context = True  # backends pass a ScheduleContext and fill the Observation's context fields
    logs_reasons = True  # backends keep the reason of every decision (metadata["decisions"])

    def __init__(self, signal: str = "device_completion", **options: Any) -> None:
        super().__init__(signal)
        o = DLFPGOptions.from_options(options)
        self.options = o
        self.itl_target_s = float(o.itl_target_s)
        self.aim_s = (1.0 - o.headroom) * self.itl_target_s
        self.ttft_budget_s = o.ttft_budget_s
        self.min_chunk, self.max_chunk, self.quantum = o.min_chunk, o.max_chunk, o.quantum
        self.estimator = CostEstimator(o.use_context, o.forgetting)
        self.chunk = o.initial_chunk  # the proportional law's state
        self._issued: deque[tuple[int, str]] = deque(maxlen=64)  # (chunk, reason) per capped prefill_cap call
        self.guard_grants = 0

    # ------------------------------------------------------------------ the estimate
    @property
    def estimate_ready(self) -> bool:
        """True when the estimate drives the chunk: on, warmed up, and increasing in chunk tokens."""
        e = self.estimator
        return self.options.use_estimate and e.prefill_samples >= self.options.warmup_samples and e.slope() > 0

    def predict_s(self, chunk: int, prefill_context: int, num_decodes: int, decode_context: int) -> float:
        """Expected completed device time (seconds) of ``chunk`` prefill tokens after ``prefill_context`` cached
        ones, beside ``num_decodes`` decodes whose contexts sum to ``decode_context`` tokens.

        Beyond the largest prefill timed so far the fit is extrapolating, so the prediction is at least that
        iteration's time scaled by ``chunk / its prefill tokens`` (a few samples of one size cannot tell the
        fixed cost from the per-token cost; this keeps the larger chunk from looking cheap).
        """
        e = self.estimator
        t = e.predict(chunk, chunk_pairs(chunk, prefill_context), num_decodes, decode_context)
        if chunk > e.largest_prefill > 0:
            t = max(t, e.largest_prefill_s * chunk / e.largest_prefill)
        return t

    def _floor_q(self, tokens: float) -> int:
        return int(math.floor(tokens / self.quantum + 1e-9)) * self.quantum

    def choose(self, num_decodes: int, ctx: ScheduleContext) -> tuple[int, str]:
        """The chunk (tokens) and its reason for the next mixed iteration, before the TTFT guard."""
        if not self.estimate_ready:
            return self.chunk, ("proportional" if not self.options.use_estimate else "warmup")
        pc, dc = ctx.prefill_context_tokens, ctx.decode_context_tokens
        lo = self.min_chunk
        if self.predict_s(lo, pc, num_decodes, dc) > self.aim_s:
            return lo, "infeasible"
        trust = max(lo, self._floor_q(self.options.trust_factor * self.estimator.largest_prefill))
        hi = min(self.max_chunk, trust)
        if self.predict_s(hi, pc, num_decodes, dc) <= self.aim_s:
            return hi, ("max_chunk" if hi == self.max_chunk else "trust_limit")
        a, b = lo // self.quantum, hi // self.quantum  # invariant: a fits, b does not
        while b - a > 1:
            m = (a + b) // 2
            if self.predict_s(m * self.quantum, pc, num_decodes, dc) <= self.aim_s:
                a = m
            else:
                b = m
        return a * self.quantum, "estimate"

    def _iter_s(self, chunk: int, num_decodes: int, ctx: ScheduleContext) -> float:
        """Expected iteration time (s) of ``chunk``: the estimate when ready, else ``aim * chunk / self.chunk``."""
        if self.estimate_ready:
            return max(self.predict_s(chunk, ctx.prefill_context_tokens, num_decodes, ctx.decode_context_tokens),
                       1e-9)
        return self.aim_s * chunk / self.chunk

    def ttft_guard(self, chunk: int, num_decodes: int, ctx: ScheduleContext, waited_s: float,
                   remaining: int) -> int | None:
        """The larger chunk the TTFT guard grants instead of ``chunk``, or ``None`` (no grant; see the module)."""
        slack = self.ttft_budget_s - waited_s
        if slack <= 0 or remaining <= chunk:
            return None
        if math.ceil(remaining / chunk) * self._iter_s(chunk, num_decodes, ctx) <= slack:
            return None
        limit_s = self.options.ttft_guard_factor * self.itl_target_s
        for k in range(math.ceil(remaining / chunk) - 1, 0, -1):  # fewer iterations, each with a larger chunk
            c = min(self.max_chunk, -(-math.ceil(remaining / k) // self.quantum) * self.quantum)
            t = self._iter_s(c, num_decodes, ctx)
            if t > limit_s:
                return None
            if k * t <= slack:
                return c
            if c == self.max_chunk:
                return None
        return None

    # ------------------------------------------------------------------ policy
    def prefill_cap(self, num_decoding: int, *, now_s: float = 0.0, oldest_waiting_s: float | None = None,
                    oldest_remaining_tokens: int | None = None, context: ScheduleContext | None = None) -> int | None:
        """The prefill chunk (tokens) for the next iteration while ``num_decoding > 0``, else ``None``.

        Raises:
            ValueError: negative or non-integer ``num_decoding`` or ``oldest_remaining_tokens``.
        """
        check_count("num_decoding", num_decoding)
        if num_decoding == 0:
            return None
        ctx = context if context is not None else _NO_CONTEXT
        chunk, reason = self.choose(num_decoding, ctx)
        if (self.options.use_ttft_guard and self.ttft_budget_s is not None and oldest_waiting_s is not None
                and oldest_remaining_tokens is not None):
            check_count("oldest_remaining_tokens", oldest_remaining_tokens)
            granted = self.ttft_guard(chunk, num_decoding, ctx, oldest_waiting_s, oldest_remaining_tokens)
            if granted is not None and granted > chunk:
                chunk, reason = granted, "ttft_guard"
                self.guard_grants += 1
        self._issued.append((chunk, reason))
        return chunk

    def _reason_of(self, cap: int | None) -> str:
        """The reason of the chunk an observed iteration ran under (issued chunks are observed in order)."""
        if cap is None:
            return "no_cap"
        while self._issued:
            c, r = self._issued.popleft()
            if c == cap:
                return r
        if not self.options.use_estimate:  # a chunk this policy did not issue (a test driving observe alone)
            return "proportional"
        return "estimate" if self.estimate_ready else "warmup"

    def observe(self, obs: Observation) -> None:
        """Learn from one completed iteration and log a ``Decision`` with the reason of its chunk.

        Raises:
            ValueError: a guarded iteration without the ``signal`` interval, or with a non-positive or
                non-finite one.
        """
        iv = obs.interval(self.signal)
        if iv is not None and not (math.isfinite(iv) and iv > 0):
            if obs.guarded:
                raise ValueError(f"guarded iteration {obs.iteration}: {self.signal} interval must be positive and "
                                 f"finite, got {iv!r}")
            iv = None
        if obs.guarded and iv is None:
            raise ValueError(f"guarded iteration {obs.iteration} has no {self.signal} interval: backends must "
                             f"call observe() once the {self.signal} signal is known")
        p = int(obs.prefill_tokens)
        pairs = obs.prefill_pairs if obs.prefill_pairs is not None else chunk_pairs(p, 0)
        dctx = obs.decode_context_tokens or 0
        if iv is not None and (p > 0 or obs.num_decodes > 0):
            self.estimator.update(p, pairs, obs.num_decodes, dctx, iv)
        if iv is not None and p > 0:
            self._proportional(obs, p, iv)
        reason = self._reason_of(obs.cap)
        if obs.cap is not None and p == 0:  # the chunk was issued but nothing prefilled: no decision took effect
            reason = "no_prefill"
        after = None
        if obs.num_decodes > 0:  # the chunk for the same decodes, at the context after this chunk
            ctx_before = (pairs - p * (p + 1) * 0.5) / p if p else 0.0
            after = self.choose(obs.num_decodes, ScheduleContext(int(ctx_before) + p, dctx + obs.num_decodes))[0]
        self._record(obs, obs.cap, after, reason)

    def _proportional(self, obs: Observation, prefill: int, iv: float) -> None:
        """The proportional law's update from any timed iteration with prefill (module docstring, part 4)."""
        if iv > self.aim_s:  # over the aim: shrink, from the tokens that took this long
            raw = min(self.chunk, prefill) * self.aim_s / iv
        elif prefill >= self.chunk and obs.num_decodes > 0:  # a full chunk beside decodes came in under the aim
            raw = min(self.chunk * self.aim_s / iv, 2.0 * self.chunk)
        else:
            return  # a short interval of a smaller batch never grows the chunk
        self.chunk = min(self.max_chunk, max(self.min_chunk, self._floor_q(raw)))

    def params(self) -> dict:
        """Parameters (signal and every option, with the SLO-filled objective) for the trace metadata."""
        return {**super().params(), **{k: getattr(self.options, k) for k in DEFAULT_OPTIONS}}


__all__ = ["DLFPG", "REASONS"]
