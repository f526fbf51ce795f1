"""DLFP-S's options: the ``options`` mapping of a ``policy: dlfps`` arm, as a pydantic model.

Every option has a default, so an arm lists only what it changes; the
meaning of each is under :class:`dlfp.policies.dlfps.controller.DLFPS`. A bad
value is rejected naming the option (``field arms.<arm>.options.<name>: ...``
from the experiment config, ``dlfps option <name>: ...`` from the constructor).
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, StrictBool, StrictInt, model_validator

from dlfp.policies.base import OptionFloat, PolicyOptions

#: Which iterations feed the RLS fit (option ``estimator_samples``).
EstimatorSamples = Literal["prefill", "guarded", "all"]
ESTIMATOR_SAMPLES: tuple[str, ...] = get_args(EstimatorSamples)


class DLFPSOptions(PolicyOptions):
    """The options of :class:`dlfp.policies.dlfps.controller.DLFPS`, with their defaults and ranges.

    Times are seconds. ``ttft_slo_s`` is filled in from the experiment's
    ``slo.ttft_s`` by ``dlfp.config.ExperimentConfig`` unless the arm sets it.

    Raises:
        pydantic.ValidationError: a wrong type, a value out of range, an
            unknown option, ``tail_band`` too wide for ``tail_quantile``
            (``(1 - tail_quantile) * tail_band >= 1``) or ``tail_min_samples >
            tail_window``.
    """

    policy_name: ClassVar[str] = "dlfps"
    use_estimator: StrictBool = True
    use_feasibility: StrictBool = True
    use_ttft_guard: StrictBool = True
    ttft_slo_s: OptionFloat | None = Field(default=None, gt=0)
    forgetting: OptionFloat = Field(default=0.95, gt=0, le=1)
    min_samples: StrictInt = Field(default=8, ge=3)
    max_rel_error: OptionFloat = Field(default=0.15, gt=0)
    estimator_samples: EstimatorSamples = "prefill"
    infeasible_stand_down: StrictBool = False
    infeasible_after: StrictInt = Field(default=3, ge=1)
    tail_quantile: OptionFloat = Field(default=0.99, gt=0, lt=1)
    tail_band: OptionFloat = Field(default=2.0, ge=1)
    tail_margin: OptionFloat = Field(default=0.05, ge=0, lt=1)
    tail_window: StrictInt = Field(default=20000, ge=1)
    tail_min_samples: StrictInt = Field(default=1000, ge=1)
    tail_check_every: StrictInt = Field(default=100, ge=1)
    ttft_guard_frac: OptionFloat = Field(default=0.5, gt=0, lt=1)

    @model_validator(mode="after")
    def _tail_settings_agree(self) -> "DLFPSOptions":
        if (1 - self.tail_quantile) * self.tail_band >= 1:
            raise ValueError(f"tail_band={self.tail_band} is too wide for tail_quantile={self.tail_quantile}")
        if self.tail_min_samples > self.tail_window:
            raise ValueError(f"tail_min_samples={self.tail_min_samples} is larger than tail_window={self.tail_window}")
        return self


#: Option name -> default, in declaration order.
DEFAULT_OPTIONS: dict[str, Any] = {name: f.default for name, f in DLFPSOptions.model_fields.items()}


__all__ = ["DEFAULT_OPTIONS", "DLFPSOptions", "ESTIMATOR_SAMPLES"]
