"""Prefill-cap policies: the interface (``base``), the baselines, the paper's DLFP, this artifact's DLFP-S and DLFP-G.

``dlfp.policies.registry`` maps a config's policy name to its class and
options model. The names below are re-exported for ``from dlfp import
policies``.
"""
from dlfp.policies.base import (
    SIGNALS,
    Decision,
    Observation,
    Policy,
    PolicyBase,
    PolicyOptions,
    ScheduleContext,
    check_interval,
    decisions_frame,
    quantize,
)
from dlfp.policies.baselines import FixedCap, NoCap
from dlfp.policies.dlfp import (
    DLFP,
    PAPER_GAIN,
    PAPER_INITIAL_CAP,
    PAPER_MAX_CAP,
    PAPER_MIN_CAP,
    PAPER_QUANTUM,
    PAPER_TARGET_S,
)
from dlfp.policies.dlfpg import DLFPG
from dlfp.policies.dlfps import DLFPS

__all__ = [
    "DLFP",
    "DLFPG",
    "DLFPS",
    "Decision",
    "FixedCap",
    "NoCap",
    "Observation",
    "PAPER_GAIN",
    "PAPER_INITIAL_CAP",
    "PAPER_MAX_CAP",
    "PAPER_MIN_CAP",
    "PAPER_QUANTUM",
    "PAPER_TARGET_S",
    "Policy",
    "PolicyBase",
    "PolicyOptions",
    "SIGNALS",
    "ScheduleContext",
    "check_interval",
    "decisions_frame",
    "quantize",
]
