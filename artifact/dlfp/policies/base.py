"""Prefill-cap policies: the paper's DLFP controller and its baselines.

This module imports nothing from vLLM. The simulator (``dlfp.backends.sim``), the
emulated device and the vLLM scheduler patch (``dlfp.backends.vllm.scheduler``) all talk
to a policy through the same two calls:

* ``prefill_cap(num_decoding, now_s=..., oldest_waiting_s=..., oldest_remaining_tokens=...)``
  -> ``int | None``: asked once per iteration before prefill is scheduled.
  ``oldest_waiting_s`` is how long (seconds) the oldest request without a first
  token has waited, ``oldest_remaining_tokens`` its prompt tokens still to
  prefill; both optional context (only DLFP-S's TTFT guard reads them). ``None`` means "no cap":
  the engine's own token budget (``max_num_batched_tokens``) is the only limit.
  A cap is the maximum number of TOTAL prefill tokens (all prefilling requests
  together) that this iteration may schedule.
* ``observe(obs)``: called exactly once per scheduled iteration, as soon as the
  signal named by ``policy.signal`` is known for it (``host_cadence``: at the
  next scheduler call; ``device_completion``: when the iteration's output is
  processed). The other signal field of the observation may be ``None``.

Times are seconds everywhere in this module.

Paper constants (arXiv v1, 2026-09-29, Section "Controller"): target mixed
iteration latency 80 ms, initial cap 3,072 tokens, cap clamped to
[1,024, 6,144], updates quantised to 128 tokens.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Literal, Protocol, runtime_checkable

Signal = Literal["host_cadence", "device_completion"]
SIGNALS: tuple[str, ...] = ("host_cadence", "device_completion")

# Paper defaults (DLFP paper, arXiv v1 2026-09-29).
PAPER_TARGET_S = 0.080
PAPER_INITIAL_CAP = 3072
PAPER_MIN_CAP = 1024
PAPER_MAX_CAP = 6144
PAPER_QUANTUM = 128
PAPER_GAIN = 1.0


@dataclass(frozen=True)
class Observation:
    """What a backend saw of one scheduled iteration.

    Attributes:
        iteration: engine step index (0-based, in scheduling order).
        time_s: time the observation is made (seconds, backend clock).
        prefill_tokens: total prefill tokens scheduled in the iteration.
        num_decodes: number of decoding requests in the iteration.
        cap: prefill cap that was in force when the iteration was scheduled
            (``None`` = no cap).
        host_interval_s: seconds between this iteration's scheduler call and
            the next one (the paper's ``host_cadence`` signal), or ``None``.
        device_time_s: completed device time of the iteration (seconds, the
            ``device_completion`` signal), or ``None``.
    """

    iteration: int
    time_s: float
    prefill_tokens: int
    num_decodes: int
    cap: int | None
    host_interval_s: float | None = None
    device_time_s: float | None = None

    @property
    def guarded(self) -> bool:
        """True for a guarded cycle: ran under a cap, with >= 1 decode and some prefill."""
        return self.cap is not None and self.num_decodes > 0 and self.prefill_tokens > 0

    def interval(self, signal: str) -> float | None:
        """The observed interval (seconds) of the named signal; ``None`` if unknown.

        Raises:
            ValueError: unknown signal name.
        """
        if signal == "host_cadence":
            return self.host_interval_s
        if signal == "device_completion":
            return self.device_time_s
        raise ValueError(f"unknown signal {signal!r}; expected one of {SIGNALS}")


@dataclass(frozen=True)
class Decision:
    """One controller update (or non-update), kept for the trace and notebooks.

    ``interval_s`` is the observed interval of ``source`` (seconds, NaN when
    the signal was unknown); ``cap_before``/``cap_after`` are token counts
    (``None`` = no cap); ``reason`` is a short tag such as ``"proportional"``.
    """

    iteration: int
    time_s: float
    cap_before: int | None
    cap_after: int | None
    interval_s: float
    source: str
    prefill_tokens: int
    num_decodes: int
    guarded: bool
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


@runtime_checkable
class Policy(Protocol):
    """The interface every backend calls (see the module docstring)."""

    name: str
    signal: str
    decisions: list[Decision]

    def prefill_cap(
        self, num_decoding: int, *, now_s: float = 0.0, oldest_waiting_s: float | None = None,
        oldest_remaining_tokens: int | None = None,
    ) -> int | None: ...

    def observe(self, obs: Observation) -> None: ...


def _is_int(value: object) -> bool:
    """True for Python and numpy integers (``np.int64`` from backends' counters), False for bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # np.bool_ is not Integral


def _check_count(name: str, value: int) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def check_interval(name: str, value: float) -> float:
    """Return ``value`` as float if it is a finite, positive number of seconds.

    Raises:
        ValueError: naming ``name`` and the value, for NaN, inf, zero or negative.
    """
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}") from None
    if not math.isfinite(v) or v <= 0.0:
        raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")
    return v


class _Base:
    """Shared bookkeeping: the decision log and argument checks."""

    name = "base"

    def __init__(self, signal: str = "host_cadence") -> None:
        if signal not in SIGNALS:
            raise ValueError(f"unknown signal {signal!r}; expected one of {SIGNALS}")
        self.signal = signal
        self.decisions: list[Decision] = []

    def _record(self, obs: Observation, before: int | None, after: int | None, reason: str) -> None:
        iv = obs.interval(self.signal)
        self.decisions.append(
            Decision(
                iteration=obs.iteration,
                time_s=obs.time_s,
                cap_before=before,
                cap_after=after,
                interval_s=float("nan") if iv is None else float(iv),
                source=self.signal,
                prefill_tokens=obs.prefill_tokens,
                num_decodes=obs.num_decodes,
                guarded=obs.guarded,
                reason=reason,
            )
        )

    def params(self) -> dict:
        """Parameters that define this policy (written to trace metadata)."""
        return {"name": self.name, "signal": self.signal}


class NoCap(_Base):
    """Stock chunked prefill: the engine's token budget is the only limit."""

    name = "nocap"

    def prefill_cap(self, num_decoding: int, *, now_s: float = 0.0, oldest_waiting_s: float | None = None,
                    oldest_remaining_tokens: int | None = None) -> None:
        """Always ``None`` (no cap)."""
        _check_count("num_decoding", num_decoding)
        return None

    def observe(self, obs: Observation) -> None:
        """Record the observation; nothing changes."""
        self._record(obs, None, None, "nocap")


class FixedCap(_Base):
    """A fixed prefill cap of ``cap`` tokens while at least one request decodes.

    Raises:
        ValueError: ``cap`` not a positive integer.
    """

    name = "fixed"

    def __init__(self, cap: int, signal: str = "host_cadence") -> None:
        super().__init__(signal)
        if not _is_int(cap) or cap <= 0:
            raise ValueError(f"fixed cap must be a positive integer number of tokens, got {cap!r}")
        self.cap = int(cap)

    def prefill_cap(self, num_decoding: int, *, now_s: float = 0.0, oldest_waiting_s: float | None = None,
                    oldest_remaining_tokens: int | None = None) -> int | None:
        """``cap`` tokens while ``num_decoding > 0``, else ``None``."""
        _check_count("num_decoding", num_decoding)
        return self.cap if num_decoding > 0 else None

    def observe(self, obs: Observation) -> None:
        """Record the observation; the cap never moves."""
        self._record(obs, self.cap, self.cap, "fixed")

    def params(self) -> dict:
        return {**super().params(), "cap": self.cap}


def quantize(tokens: float, quantum: int) -> int:
    """Nearest multiple of ``quantum`` (halves round up), as int tokens."""
    return int(math.floor(tokens / quantum + 0.5)) * quantum


class DLFP(_Base):
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
        if not _is_int(quantum) or quantum <= 0:
            raise ValueError(f"quantum must be a positive integer number of tokens, got {quantum!r}")
        quantum = int(quantum)
        self.quantum = quantum
        for nm, v in (("min_cap", min_cap), ("max_cap", max_cap), ("initial_cap", initial_cap)):
            if not _is_int(v) or v <= 0:
                raise ValueError(f"{nm} must be a positive integer number of tokens, got {v!r}")
            if v % quantum:
                raise ValueError(f"{nm}={v} is not a multiple of the quantum {quantum}")
        if min_cap > max_cap:
            raise ValueError(f"min_cap={min_cap} is larger than max_cap={max_cap}")
        if not min_cap <= initial_cap <= max_cap:
            raise ValueError(f"initial_cap={initial_cap} is outside [min_cap={min_cap}, max_cap={max_cap}]")
        self.min_cap, self.max_cap, self.initial_cap = int(min_cap), int(max_cap), int(initial_cap)
        self.cap = self.initial_cap

    def prefill_cap(self, num_decoding: int, *, now_s: float = 0.0, oldest_waiting_s: float | None = None,
                    oldest_remaining_tokens: int | None = None) -> int | None:
        """The current cap (tokens) while ``num_decoding > 0``, else ``None``."""
        _check_count("num_decoding", num_decoding)
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


def decisions_frame(policy: Policy):
    """The policy's decision log as a pandas DataFrame (one row per ``observe`` call)."""
    import pandas as pd

    cols = [f for f in Decision.__dataclass_fields__]
    return pd.DataFrame([d.as_dict() for d in policy.decisions], columns=cols)


__all__ = [
    "DLFP",
    "Decision",
    "FixedCap",
    "NoCap",
    "Observation",
    "Policy",
    "SIGNALS",
    "check_interval",
    "decisions_frame",
    "quantize",
]
