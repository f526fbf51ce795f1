"""Backends: one trial (experiment x arm x seed) on a backend -> a ``Trial``.

Each backend module ``dlfp.runners.<backend>`` (``sim``, ``emu``, ``vllm``)
exposes::

    run_trial(cfg: ExperimentConfig, arm: str, seed: int,
              progress: Callable[[int, int], None] | None = None) -> Trial

``progress(done, total)`` is called as requests finish (``total`` counts
warm-ups too). The returned trial's metadata carries every key of
``dlfp.traces.METADATA_KEYS``; ``run_trial`` here writes nothing to disk.
"""
from __future__ import annotations

import importlib
from typing import Callable

from ..config import ExperimentConfig
from ..traces import BACKENDS, Trial

ProgressFn = Callable[[int, int], None]


class BackendUnavailable(RuntimeError):
    """A backend whose software is not installed; the message says what to install."""


def backend_module(backend: str):
    """Import ``dlfp.runners.<backend>``.

    Raises:
        ValueError: unknown backend name.
        BackendUnavailable: the backend's dependencies are missing.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    return importlib.import_module(f"{__name__}.{backend}")


def run_trial(cfg: ExperimentConfig, arm: str, seed: int, backend: str = "sim",
              progress: ProgressFn | None = None) -> Trial:
    """Run one trial on ``backend`` and return it (not written).

    Raises:
        ValueError: unknown arm or backend.
        BackendUnavailable: see ``backend_module``.
    """
    if arm not in cfg.arms:
        raise ValueError(f"experiment {cfg.name!r} has no arm {arm!r}; arms: {sorted(cfg.arms)}")
    return backend_module(backend).run_trial(cfg, arm, seed, progress=progress)
