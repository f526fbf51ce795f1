"""Prefill-cap policies: the protocol and baselines, the paper's DLFP, this artifact's DLFP-S, and the registry."""
