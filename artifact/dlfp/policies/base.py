"""The prefill-policy interface shared by every backend, and the parts all policies use.

This module imports nothing from vLLM. The simulator (``dlfp.backends.sim``), the
emulated device and the vLLM scheduler patch (``dlfp.backends.vllm.scheduler``) all talk
to a policy through the same two calls:

* ``prefill_cap(num_decoding, now_s=..., oldest_waiting_s=..., oldest_remaining_tokens=...)``
  -> ``int | None``: asked once per iteration before prefill is scheduled.
  ``oldest_waiting_s`` is how long (seconds) the oldest request without a first
  token has waited, ``oldest_remaining_tokens`` its prompt tokens still to
  prefill; both optional context (only the TTFT guards of DLFP-S and DLFP-G read them).
  ``context`` (a ``ScheduleContext``) is passed only to policies whose class sets
  ``wants_context = True`` (DLFP-G); the others never pay for building it. ``None`` means "no cap":
  the engine's own token budget (``max_num_batched_tokens``) is the only limit.
  A cap is the maximum number of TOTAL prefill tokens (all prefilling requests
  together) that this iteration may schedule.
* ``observe(obs)``: called exactly once per scheduled iteration, as soon as the
  signal named by ``policy.signal`` is known for it (``host_cadence``: at the
  next scheduler call; ``device_completion``: when the iteration's output is
  processed). The other signal field of the observation may be ``None``.
  ``prefill_pairs`` and ``decode_context_tokens`` are filled in for policies with
  ``wants_context`` only.

Times are seconds everywhere in this module.

The policies themselves live next to this module: ``baselines`` (NoCap,
FixedCap), ``dlfp`` (the paper's controller and its constants) and ``dlfps``
(this artifact's DLFP-S); ``registry`` maps a config's policy name to its
class and options model. ``dlfp.policies`` re-exports all of them.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

Signal = Literal["host_cadence", "device_completion"]
SIGNALS: tuple[str, ...] = ("host_cadence", "device_completion")


@dataclass(slots=True)
class Observation:
    """What a backend saw of one scheduled iteration (read-only by convention: policies must not modify it;
    not frozen because a frozen dataclass costs about 2 us more to build, once per iteration).

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
        prefill_pairs: causal attention pairs of the iteration's prefill chunks,
            ``sum(n * c + n * (n + 1) / 2)`` over chunks of ``n`` new tokens after
            ``c`` cached ones (``dlfp.devices.batch.chunk_pairs``), or ``None``.
            Filled in only for policies with ``wants_context``.
        decode_context_tokens: sum over the iteration's decodes of the tokens
            already in their KV cache, or ``None`` (as ``prefill_pairs``).
    """

    iteration: int
    time_s: float
    prefill_tokens: int
    num_decodes: int
    cap: int | None
    host_interval_s: float | None = None
    device_time_s: float | None = None
    prefill_pairs: float | None = None
    decode_context_tokens: int | None = None

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


@dataclass(slots=True)
class ScheduleContext:
    """What the next iteration's cost depends on beyond its size, for policies with ``wants_context``.

    Attributes:
        prefill_context_tokens: tokens already in the KV cache of the request
            the next prefill chunk continues (the first running request
            mid-prompt, else the head of the waiting queue; 0 for a fresh one).
        decode_context_tokens: sum over the decoding requests of the tokens
            already in their KV cache.
    """

    prefill_context_tokens: int = 0
    decode_context_tokens: int = 0


@dataclass(slots=True)
class Decision:
    """One controller update (or non-update), kept for the trace and notebooks (read-only by convention).

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
        oldest_remaining_tokens: int | None = None, context: ScheduleContext | None = None,
    ) -> int | None: ...

    def observe(self, obs: Observation) -> None: ...


def is_int(value: object) -> bool:
    """True for Python and numpy integers (``np.int64`` from backends' counters), False for bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)  # np.bool_ is not Integral


def check_count(name: str, value: int) -> None:
    """Accept a non-negative integer count (tokens, requests).

    Raises:
        ValueError: naming ``name`` and the value, for a negative number, a bool or a non-integer.
    """
    if type(value) is int and value >= 0:  # the common case, without the ABC check of is_int
        return
    if not is_int(value) or value < 0:
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


def reject_bool(v: Any) -> Any:
    """``v`` unchanged unless it is a boolean (``rate: true`` is a typo, not 1).

    Raises:
        ValueError: ``v`` is ``True`` or ``False``.
    """
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got the boolean {v}")
    return v


def reject_bool_or_str(v: Any) -> Any:
    """``v`` unchanged unless it is a boolean or a string (``headroom: "0.3"`` is quoted by mistake).

    Raises:
        ValueError: ``v`` is a boolean or a string.
    """
    if isinstance(v, str):
        raise ValueError(f"expected a number, got the string {v!r}")
    return reject_bool(v)


#: A float option that rejects booleans and strings; non-finite values are rejected by ``PolicyOptions``.
OptionFloat = Annotated[float, BeforeValidator(reject_bool_or_str)]


class PolicyOptions(BaseModel):
    """The ``options`` mapping of a policy's config, checked field by field.

    Each policy with options subclasses this (see ``dlfp.policies.registry``);
    this base class itself takes none. Unknown names, booleans where numbers
    belong and non-finite numbers are rejected.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    #: the policy's name in error messages (``<name> option <field>: ...``)
    policy_name: ClassVar[str] = "policy"

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "PolicyOptions":
        """The validated options of a constructor call.

        Raises:
            ValueError: one line, ``<policy_name> option <name>: <message>`` for the first bad option
                (``<policy_name> options: <message>`` when options disagree).
        """
        try:
            return cls.model_validate(dict(options))
        except ValidationError as e:
            err = e.errors()[0]
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = f"unknown option; known: {', '.join(cls.model_fields)}"
            loc = ".".join(str(x) for x in err["loc"])
            where = f"{cls.policy_name} option {loc}" if loc else f"{cls.policy_name} options"
            raise ValueError(f"{where}: {msg}") from None


class PolicyBase:
    """Shared bookkeeping of the shipped policies: the signal, the decision log and ``params``.

    ``config_fields`` names the ``dlfp.config.PolicyConfig`` fields the
    constructor takes as keywords; ``dlfp.config.build_policy`` passes exactly
    those (and the arm's ``options``).

    Raises:
        ValueError: unknown ``signal``.
    """

    name = "base"
    config_fields: tuple[str, ...] = ("signal",)

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


def quantize(tokens: float, quantum: int) -> int:
    """Nearest multiple of ``quantum`` (halves round up), as int tokens."""
    return int(math.floor(tokens / quantum + 0.5)) * quantum


def reason_runs(iterations, reasons) -> dict:
    """The decision reasons of a trial, run-length encoded for its ``metadata.json`` (``metadata["decisions"]``).

    Args:
        iterations: iteration index of each decision, in the order they were made.
        reasons: the reason of each decision (same length).

    Returns:
        ``{"reasons": [names], "start_iteration": [i0, i1, ...], "code": [k0, k1, ...]}``: from iteration ``i_j``
        on (up to the next start) the reason is ``reasons[k_j]``; a new run starts only where the reason changes.
    """
    names: list[str] = []
    starts: list[int] = []
    codes: list[int] = []
    for it, r in zip(iterations, reasons):
        if r not in names:
            names.append(r)
        k = names.index(r)
        if not codes or codes[-1] != k:
            starts.append(int(it))
            codes.append(k)
    return {"reasons": names, "start_iteration": starts, "code": codes}


def decisions_frame(policy: Policy):
    """The policy's decision log as a pandas DataFrame (one row per ``observe`` call, columns = ``Decision``)."""
    import pandas as pd

    cols = [f for f in Decision.__dataclass_fields__]
    return pd.DataFrame([d.as_dict() for d in policy.decisions], columns=cols)


__all__ = [
    "Decision",
    "Observation",
    "OptionFloat",
    "Policy",
    "PolicyBase",
    "PolicyOptions",
    "SIGNALS",
    "ScheduleContext",
    "Signal",
    "check_count",
    "check_interval",
    "decisions_frame",
    "is_int",
    "quantize",
    "reason_runs",
    "reject_bool",
    "reject_bool_or_str",
]
