"""DLFP-G's options: the ``options`` mapping of a ``policy: dlfpg`` arm, as a pydantic model.

Every option has a default, so an arm lists only what it changes. The user's
objective (``itl_target_s``, ``ttft_budget_s``) is filled in from the
experiment's ``slo.itl_s`` and ``slo.ttft_s`` by ``dlfp.config.ExperimentConfig``
unless the arm sets it. The controller constants (``headroom`` ..
``ttft_guard_factor``) were chosen once on the development seeds 901-903 of the
simulator matrix and frozen (REPRODUCE.md, "DLFP-G"); the reported results use
seeds 801-803, which they never saw. A bad value is rejected naming the option
(``field arms.<arm>.options.<name>: ...`` from the experiment config, ``dlfpg
option <name>: ...`` from the constructor).
"""
from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, StrictBool, StrictInt, model_validator

from dlfp.policies.base import OptionFloat, PolicyOptions


class DLFPGOptions(PolicyOptions):
    """The options of :class:`dlfp.policies.dlfpg.controller.DLFPG`, with their defaults and ranges.

    Times are seconds, chunks tokens.

    Attributes:
        itl_target_s: the decode-gap objective; required (the experiment's ITL SLO by default).
        ttft_budget_s: the TTFT budget the guard protects (the experiment's TTFT SLO by default); ``None`` = none.
        headroom: the share of ``itl_target_s`` kept free: an iteration is sized for
            ``(1 - headroom) * itl_target_s`` of expected device time (host work and estimate error use the rest).
        min_chunk, max_chunk, quantum: the chunk sizes allowed: multiples of ``quantum`` in ``[min_chunk, max_chunk]``.
        initial_chunk: the chunk before the estimate is ready (and the start of the proportional law).
        forgetting: the estimator's forgetting factor in (0, 1].
        warmup_samples: timed iterations with prefill before the estimate drives the chunk.
        trust_factor: the estimate is not trusted beyond ``trust_factor`` times the largest prefill it has timed.
        ttft_guard_factor: the TTFT guard may size an iteration up to ``ttft_guard_factor * itl_target_s``.
        use_estimate, use_context, use_ttft_guard: the parts of the controller, for the ablations.

    Raises:
        pydantic.ValidationError: a wrong type, a value out of range, an unknown option, chunk bounds that are not
            multiples of ``quantum`` or out of order, or a missing ``itl_target_s``.
    """

    policy_name: ClassVar[str] = "dlfpg"
    itl_target_s: OptionFloat | None = Field(default=None, gt=0)
    ttft_budget_s: OptionFloat | None = Field(default=None, gt=0)
    headroom: OptionFloat = Field(default=0.25, ge=0, lt=1)
    min_chunk: StrictInt = Field(default=128, gt=0)
    max_chunk: StrictInt = Field(default=8192, gt=0)
    initial_chunk: StrictInt = Field(default=1024, gt=0)
    quantum: StrictInt = Field(default=128, gt=0)
    forgetting: OptionFloat = Field(default=0.98, gt=0, le=1)
    warmup_samples: StrictInt = Field(default=8, ge=3)
    trust_factor: OptionFloat = Field(default=2.0, ge=1)
    ttft_guard_factor: OptionFloat = Field(default=2.0, ge=1)
    use_estimate: StrictBool = True
    use_context: StrictBool = True
    use_ttft_guard: StrictBool = True

    @model_validator(mode="after")
    def _chunks_agree(self) -> "DLFPGOptions":
        if self.itl_target_s is None:
            raise ValueError("options.itl_target_s is required: the decode-gap objective in seconds (an "
                             "experiment fills it in from its slo.itl_s)")
        if self.min_chunk > self.max_chunk:
            raise ValueError(f"min_chunk={self.min_chunk} is larger than max_chunk={self.max_chunk}")
        for name in ("min_chunk", "max_chunk", "initial_chunk"):
            if getattr(self, name) % self.quantum:
                raise ValueError(f"{name}={getattr(self, name)} is not a multiple of quantum={self.quantum}")
        if not self.min_chunk <= self.initial_chunk <= self.max_chunk:
            raise ValueError(f"initial_chunk={self.initial_chunk} is outside "
                             f"[min_chunk={self.min_chunk}, max_chunk={self.max_chunk}]")
        return self


#: Option name -> default, in declaration order.
DEFAULT_OPTIONS: dict[str, Any] = {name: f.default for name, f in DLFPGOptions.model_fields.items()}

__all__ = ["DEFAULT_OPTIONS", "DLFPGOptions"]
