"""DLFP-S, this artifact's own completion-timed prefill controller (not the paper's)."""
