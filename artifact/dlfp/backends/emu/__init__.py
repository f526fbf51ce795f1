"""Emulated device for vLLM 0.17.1: the real engine loop over a modelled GPU, on a CPU.

* ``dlfp.backends.emu.device``: the device thread, device-time models (the project's
  cost model or a linear one), model-runner host costs, deterministic token ids.
  Imports nothing from vLLM.
* ``dlfp.backends.emu.executor``: ``EmuExecutor``, the vLLM ``Executor`` (imports vLLM).
* ``dlfp.backends.emu.runner``: one trial through the vLLM backend's ``AsyncLLM`` harness.

``EmuExecutor`` is importable as ``dlfp.backends.emu.EmuExecutor`` (loaded on first use,
so this package itself does not need vLLM).
"""
from dlfp.backends.emu.device import CostModelDeviceTime, EmuBatch, EmulatedDevice, LinearDeviceTime


def __getattr__(name: str):
    if name in ("EmuExecutor", "EmuSettings"):
        from dlfp.backends.emu import executor

        return getattr(executor, name)
    raise AttributeError(f"module 'dlfp.backends.emu' has no attribute {name!r}")


__all__ = ["CostModelDeviceTime", "EmuBatch", "EmuExecutor", "EmuSettings", "EmulatedDevice",
           "LinearDeviceTime"]
