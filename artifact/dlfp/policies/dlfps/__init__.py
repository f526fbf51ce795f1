"""DLFP-S, this artifact's own completion-timed prefill controller (not the paper's).

Parts: ``controller`` (the ``DLFPS`` policy), ``options`` (its typed options),
``estimator`` (online RLS fit of the iteration time), ``tail`` (counterfactual
decode-gap tail check) and ``guard`` (TTFT guard).
"""
from dlfp.policies.dlfps.controller import DLFPS
from dlfp.policies.dlfps.estimator import RLSEstimator
from dlfp.policies.dlfps.options import DEFAULT_OPTIONS, ESTIMATOR_SAMPLES, DLFPSOptions
from dlfp.policies.dlfps.tail import TAIL_GRID, counterfactual_gaps, weighted_quantile, weighted_quantiles

__all__ = [
    "DEFAULT_OPTIONS",
    "DLFPS",
    "DLFPSOptions",
    "ESTIMATOR_SAMPLES",
    "RLSEstimator",
    "TAIL_GRID",
    "counterfactual_gaps",
    "weighted_quantile",
    "weighted_quantiles",
]
