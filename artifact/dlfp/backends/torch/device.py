"""Where an iteration's forward pass runs, and the device's own clock of it.

Two devices, one interface (``start``, ``launch``; a ``Launch`` has ``done``, ``wait``, ``device_times``):

* ``CudaDevice``: the forward pass is enqueued on the current CUDA stream between a start and an end CUDA event;
  its sampled token ids are copied to pinned host memory with a non-blocking copy, followed by a third event.
  ``launch`` returns as soon as the kernels are enqueued (the host runs ahead of the GPU, as vLLM's
  ``GPUModelRunner`` does); ``done`` queries the copy's event; ``wait`` blocks on it. Device start and end are read
  from the events (``elapsed_time`` from a reference event recorded when the trial's clock started), so they are
  the GPU's own times, not the host's view of them.
* ``ThreadDevice``: the CPU stand-in. One worker thread runs forward passes in launch order, so the host loop can
  run ahead of it exactly as it does of a GPU stream; start and end are the worker's wall clock.

Both put every time on the trial clock: seconds since the host time passed to ``start``. The event source of
``CudaDevice`` is injectable (``event_factory``) so its bookkeeping is tested without a GPU.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import torch

Clock = Callable[[], float]


class Launch:
    """One launched forward pass (see the module docstring); created by a device's ``launch``."""

    def done(self) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def wait(self) -> torch.Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def device_times(self) -> tuple[float, float]:  # pragma: no cover - interface
        raise NotImplementedError


class _CudaLaunch(Launch):
    __slots__ = ("dev", "start", "end", "copied", "host")

    def __init__(self, dev: "CudaDevice", start: Any, end: Any, copied: Any, host: torch.Tensor):
        self.dev, self.start, self.end, self.copied, self.host = dev, start, end, copied, host

    def done(self) -> bool:
        """Whether the sampled ids have reached host memory (the copy's event completed); never blocks."""
        return bool(self.copied.query())

    def wait(self) -> torch.Tensor:
        """Block until the sampled ids are in host memory; returns them ([S] int64, CPU)."""
        self.copied.synchronize()
        return self.host

    def device_times(self) -> tuple[float, float]:
        """(start, end) of the forward pass on the GPU's clock, in seconds of the trial clock; call after ``wait``."""
        ref, ref_s = self.dev.ref, self.dev.ref_s
        return ref_s + ref.elapsed_time(self.start) / 1e3, ref_s + ref.elapsed_time(self.end) / 1e3


class CudaDevice:
    """A CUDA stream with event timing (see the module docstring).

    Args:
        event_factory: returns a new event with ``record()``, ``query()``, ``synchronize()`` and
            ``elapsed_time(other)`` (milliseconds from this event to ``other``); default
            ``torch.cuda.Event(enable_timing=True)``.
        copy_to_host: copies a device tensor to host memory without blocking (default: into a new pinned tensor
            with ``non_blocking=True``).
        clock: the host clock (seconds).
    """

    def __init__(self, event_factory: Callable[[], Any] | None = None,
                 copy_to_host: Callable[[torch.Tensor], torch.Tensor] | None = None, clock: Clock = time.perf_counter):
        self.event_factory = event_factory or (lambda: torch.cuda.Event(enable_timing=True))
        self.copy_to_host = copy_to_host or _pinned_copy
        self.clock = clock
        self.ref: Any = None
        self.ref_s = 0.0

    def start(self, t0: float) -> None:
        """Tie the GPU's clock to the trial clock: a reference event, completed, taken as time ``clock() - t0``."""
        self.ref = self.event_factory()
        self.ref.record()
        self.ref.synchronize()
        self.ref_s = self.clock() - t0

    def launch(self, fn: Callable[[], torch.Tensor]) -> Launch:
        """Enqueue ``fn()`` (the forward pass, returning the sampled ids on the device) between timing events.

        Raises:
            RuntimeError: ``start`` was not called.
        """
        if self.ref is None:
            raise RuntimeError("CudaDevice.launch before start")
        s, e, c = self.event_factory(), self.event_factory(), self.event_factory()
        s.record()
        out = fn()
        e.record()
        host = self.copy_to_host(out)
        c.record()
        return _CudaLaunch(self, s, e, c, host)

    def close(self) -> None:
        """Nothing to release (the stream belongs to torch)."""


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


class _ThreadLaunch(Launch):
    __slots__ = ("fut", "t0")

    def __init__(self, fut: Future, t0: float):
        self.fut, self.t0 = fut, t0

    def done(self) -> bool:
        return self.fut.done()

    def wait(self) -> torch.Tensor:
        return self.fut.result()[0]

    def device_times(self) -> tuple[float, float]:
        _, s, e = self.fut.result()
        return s - self.t0, e - self.t0


class ThreadDevice:
    """The CPU stand-in for a GPU stream: one worker thread, forward passes in launch order (module docstring)."""

    def __init__(self, clock: Clock = time.perf_counter):
        self.clock = clock
        self.t0 = 0.0
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dlfp-device")

    def start(self, t0: float) -> None:
        """Times from now on are seconds since ``t0`` on ``clock``."""
        self.t0 = t0

    def launch(self, fn: Callable[[], torch.Tensor]) -> Launch:
        """Queue ``fn()`` on the worker; returns at once."""
        clock = self.clock

        def run():
            s = clock()
            out = fn()
            return out, s, clock()

        return _ThreadLaunch(self.pool.submit(run), self.t0)

    def close(self) -> None:
        """Stop the worker after the queued passes."""
        self.pool.shutdown(wait=True)


__all__ = ["CudaDevice", "Launch", "ThreadDevice"]
