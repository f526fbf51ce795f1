"""DLFP-G, this artifact's decode-gap-bounded prefill controller (not the paper's DLFP): controller, estimator,
options."""
from dlfp.policies.dlfpg.controller import DLFPG, REASONS
from dlfp.policies.dlfpg.estimator import CostEstimator, chunk_pairs
from dlfp.policies.dlfpg.options import DEFAULT_OPTIONS, DLFPGOptions

__all__ = ["DEFAULT_OPTIONS", "DLFPG", "DLFPGOptions", "CostEstimator", "REASONS", "chunk_pairs"]
