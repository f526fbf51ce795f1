"""Emulated device for vLLM 0.17.1: the real engine loop over a modelled GPU, on a CPU.

* ``dlfp.emulator.device``: the device thread, device-time models (the project's
  cost model or a linear one), model-runner host costs, deterministic token ids.
  Imports nothing from vLLM.
* ``dlfp.emulator.executor``: ``EmuExecutor``, the vLLM ``Executor`` (imports vLLM).
* ``dlfp.runners.emu``: one trial through the vLLM backend's ``AsyncLLM`` harness.

``EmuExecutor`` is importable as ``dlfp.emulator.EmuExecutor`` (loaded on first use,
so this package itself does not need vLLM).
"""
from .device import CostModelDeviceTime, EmuBatch, EmulatedDevice, HostCosts, LinearDeviceTime, token_id


def __getattr__(name: str):
    if name in ("EmuExecutor", "EmuSettings"):
        from . import executor

        return getattr(executor, name)
    raise AttributeError(f"module 'dlfp.emulator' has no attribute {name!r}")


__all__ = ["CostModelDeviceTime", "EmuBatch", "EmuExecutor", "EmuSettings", "EmulatedDevice", "HostCosts",
           "LinearDeviceTime", "token_id"]
