"""DLFP, the paper's Decode-Latency Feedback Prefill controller, and its constants.

Paper constants (arXiv v1, 2026-09-29, Section "Controller"): target mixed
iteration latency 80 ms, initial cap 3,072 tokens, cap clamped to
[1,024, 6,144], updates quantised to 128 tokens; the update law has no gain
term, i.e. gain 1.
"""
from __future__ import annotations

import math

from dlfp.policies.base import (
    Observation,
    PolicyBase,
    ScheduleContext,
    check_count,
    check_interval,
    is_int,
    quantize,
)

PAPER_TARGET_S = 0.080
PAPER_INITIAL_CAP = 3072
PAPER_MIN_CAP = 1024
PAPER_MAX_CAP = 6144
PAPER_QUANTUM = 128
PAPER_GAIN = 1.0


class DLFP(PolicyBase):
    """Decode-Latency Feedback Prefill: the paper's proportional controller.

    While at least one request decodes, ``prefill_cap`` returns the current cap
    ``c`` (tokens). After each guarded cycle (ran under the cap with >= 1
    decode and > 0 prefill tokens) with observed interval ``T_obs`` (seconds,
    from ``signal``), the cap is updated::

        c <- clamp(Q(c * (1 + gain * (target_s / T_obs - 1))), min_cap, max_cap)

    where ``Q`` rounds to the nearest multiple of ``quantum`` tokens. With
    ``gain = 1`` this is ``c * target_s / T_obs``: a cycle twice as long as the
    target halves the cap. Non-guarded cycles never move the cap, and with no
    decoding request there is no cap (isolated prefill is unconstrained).

    Defaults are the paper's: ``target_s`` 0.080 s, ``initial_cap`` 3,072,
    ``min_cap`` 1,024, ``max_cap`` 6,144, ``quantum`` 128, ``gain`` 1.

    Raises:
        ValueError: non-positive or non-finite target or gain, ``min_cap >
            max_cap``, a cap or bound that is not a positive multiple of
            ``quantum``, an initial cap outside the clamp, or (in ``observe``)
            a guarded cycle whose interval is missing, non-finite, zero or
            negative.
    """

    name = "dlfp"
    config_fields = ("target_s", "initial_cap", "min_cap", "max_cap", "quantum", "gain", "signal")

    def __init__(
        self,
        target_s: float = PAPER_TARGET_S,
        initial_cap: int = PAPER_INITIAL_CAP,
        min_cap: int = PAPER_MIN_CAP,
        max_cap: int = PAPER_MAX_CAP,
        quantum: int = PAPER_QUANTUM,
        gain: float = PAPER_GAIN,
        signal: str = "host_cadence",
    ) -> None:
        super().__init__(signal)
        self.target_s = check_interval("target_s", target_s)
        g = float(gain)
        if not math.isfinite(g) or g <= 0:
            raise ValueError(f"gain must be a positive finite number, got {gain!r}")
        self.gain = g
        if not is_int(quantum) or quantum <= 0:
            raise ValueError(f"quantum must be a positive integer number of tokens, got {quantum!r}")
        self.quantum = int(quantum)
        self._check_clamp(initial_cap, min_cap, max_cap)
        self.min_cap, self.max_cap, self.initial_cap = int(min_cap), int(max_cap), int(initial_cap)
        self.cap = self.initial_cap

    def _check_clamp(self, initial_cap: int, min_cap: int, max_cap: int) -> None:
        """The caps are positive multiples of the quantum and ``min_cap <= initial_cap <= max_cap``."""
        for nm, v in (("min_cap", min_cap), ("max_cap", max_cap), ("initial_cap", initial_cap)):
            if not is_int(v) or v <= 0:
                raise ValueError(f"{nm} must be a positive integer number of tokens, got {v!r}")
            if v % self.quantum:
                raise ValueError(f"{nm}={v} is not a multiple of the quantum {self.quantum}")
        if min_cap > max_cap:
            raise ValueError(f"min_cap={min_cap} is larger than max_cap={max_cap}")
        if not min_cap <= initial_cap <= max_cap:
            raise ValueError(f"initial_cap={initial_cap} is outside [min_cap={min_cap}, max_cap={max_cap}]")

    def prefill_cap(self, num_decoding: int, *, now_s: float = 0.0, oldest_waiting_s: float | None = None,
                    oldest_remaining_tokens: int | None = None, context: ScheduleContext | None = None) -> int | None:
        """The current cap (tokens) while ``num_decoding > 0``, else ``None``."""
        check_count("num_decoding", num_decoding)
        return self.cap if num_decoding > 0 else None

    def next_cap(self, cap: int, interval_s: float) -> int:
        """The proportional law applied once: new cap (tokens) for ``cap`` and ``interval_s``.

        Raises:
            ValueError: ``interval_s`` non-finite, zero or negative.
        """
        t = check_interval("observed interval", interval_s)
        raw = cap * (1.0 + self.gain * (self.target_s / t - 1.0))
        return min(self.max_cap, max(self.min_cap, quantize(raw, self.quantum)))

    def observe(self, obs: Observation) -> None:
        """Update the cap after a guarded cycle; log every call as a ``Decision``."""
        before = self.cap
        if not obs.guarded:
            self._record(obs, before, before, "unguarded")
            return
        iv = obs.interval(self.signal)
        if iv is None:
            raise ValueError(
                f"guarded iteration {obs.iteration} has no {self.signal} interval: backends must "
                f"call observe() once the {self.signal} signal is known"
            )
        self.cap = self.next_cap(before, iv)
        self._record(obs, before, self.cap, "proportional")

    def params(self) -> dict:
        return {
            **super().params(),
            "target_s": self.target_s,
            "initial_cap": self.initial_cap,
            "min_cap": self.min_cap,
            "max_cap": self.max_cap,
            "quantum": self.quantum,
            "gain": self.gain,
        }


__all__ = [
    "DLFP",
    "PAPER_GAIN",
    "PAPER_INITIAL_CAP",
    "PAPER_MAX_CAP",
    "PAPER_MIN_CAP",
    "PAPER_QUANTUM",
    "PAPER_TARGET_S",
]
