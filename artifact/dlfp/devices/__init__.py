"""Operator-level GPU time models (decoder-layer GEMMs, elementwise kernels, all-reduce, attention).

Held against measured operator times in ``data/gpu-profiles/`` by ``dlfp.studies.device``; not used by the
simulator (``dlfp.cost_model`` stays its device model).
"""
