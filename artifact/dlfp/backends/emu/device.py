"""The emulated device: a single thread that runs batches in order, each for a modelled time.

This module imports nothing from vLLM; ``dlfp.backends.emu.executor`` wraps it in a
vLLM 0.17.1 ``Executor``. Times are seconds on ``time.monotonic()``
(``CLOCK_MONOTONIC``, the same clock in every process of the machine, the one
``dlfp.backends.vllm.scheduler`` and the client harness use).

Pieces:

* ``EmuBatch``: what the device time of one iteration depends on (prefill chunks
  with the context before them, decodes with their context lengths).
* ``LinearDeviceTime``: a transparent ``a + b * tokens + c * decodes`` model, for
  tests and hand-worked examples. The experiments use the project's cost model
  (``dlfp.devices.roofline``) through ``device_time_fn_from_spec``.
* the modelled host time of the GPU model runner (input preparation, kernel
  launch, sampler launch) is ``dlfp.devices.host.HostCosts``, the simulator's own,
  spent synchronously on the engine thread by ``dlfp.backends.emu.executor``.
* ``token_id`` (from ``dlfp.traces.token_ids``): the deterministic output token of (request id, output index).
* ``EmulatedDevice``: the device thread.

KV-cache capacity comes from ``dlfp.devices.roofline.kv_cache_blocks`` (the
simulator's rule), computed by ``dlfp.backends.emu.runner``.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

DeviceTimeFn = Callable[["EmuBatch"], float]


@dataclass(frozen=True)
class EmuBatch:
    """One iteration as the device sees it.

    Attributes:
        prefill_chunks: ``(num_tokens, num_computed_before)`` per prefilling
            request: the chunk's token count and the tokens already in that
            request's KV cache before the chunk (its attention context).
        decode_contexts: per decoding request, its context length in tokens
            including the token processed in this step.
        sampled: tokens sampled (LM-head rows): decodes plus final prefill
            chunks; ``None`` = every chunk counted as final.
    """

    prefill_chunks: tuple[tuple[int, int], ...] = ()
    decode_contexts: tuple[int, ...] = ()
    sampled: int | None = None

    @property
    def prefill_tokens(self) -> int:
        """Total prefill tokens of the iteration."""
        return sum(n for n, _ in self.prefill_chunks)

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_chunks)

    @property
    def num_decodes(self) -> int:
        return len(self.decode_contexts)

    @property
    def num_tokens(self) -> int:
        """Tokens processed: prefill tokens plus one per decode."""
        return self.prefill_tokens + self.num_decodes


@dataclass(frozen=True)
class LinearDeviceTime:
    """Device time ``base_s + per_token_s * num_tokens + per_decode_s * num_decodes`` (seconds).

    A hand-checkable stand-in for the cost model (the model of an earlier
    emulated-device prototype). No published source: tests
    pick the constants so that batches are easy to tell apart.

    Raises:
        ValueError: a negative coefficient, or all of them zero.
    """

    base_s: float
    per_token_s: float = 0.0
    per_decode_s: float = 0.0

    def __post_init__(self) -> None:
        vals = (self.base_s, self.per_token_s, self.per_decode_s)
        if any(not math.isfinite(v) or v < 0 for v in vals) or not any(vals):
            raise ValueError(f"LinearDeviceTime needs finite non-negative coefficients, not all zero; got {vals}")

    def __call__(self, batch: EmuBatch) -> float:
        return self.base_s + self.per_token_s * batch.num_tokens + self.per_decode_s * batch.num_decodes


def device_time_fn_from_spec(spec: dict[str, Any]) -> DeviceTimeFn:
    """Build the device-time function a JSON spec names (resolved inside the engine-core process).

    Specs:
        ``{"kind": "linear", "base_s": .., "per_token_s": .., "per_decode_s": ..}``;
        ``{"kind": "cost_model", "model": .., "gpu": .., "tp": ..}``: the project's
        cost model (``dlfp.devices.roofline``), the one the simulator uses.

    Raises:
        ValueError: unknown kind or bad fields (message names them).
    """
    if not isinstance(spec, dict) or "kind" not in spec:
        raise ValueError(f"emulated device spec must be a mapping with a 'kind', got {spec!r}")
    kind = spec["kind"]
    rest = {k: v for k, v in spec.items() if k != "kind"}
    if kind == "linear":
        try:
            return LinearDeviceTime(**rest)
        except TypeError as e:
            raise ValueError(f"emulated device spec (linear): {e}") from None
    if kind == "cost_model":
        try:
            return CostModelDeviceTime(**rest)
        except TypeError as e:
            raise ValueError(f"emulated device spec (cost_model): {e}") from None
    raise ValueError(f"unknown emulated device kind {kind!r}; expected 'linear' or 'cost_model'")


class CostModelDeviceTime:
    """Device time of a batch from the project's cost model (``dlfp.devices.roofline``), as the simulator uses it.

    ``model``/``gpu`` are registry keys (``qwen3-0.6b``, ``a100-sxm4-80gb``),
    ``tp`` the modelled tensor-parallel degree, ``assumptions`` overrides of
    ``dlfp.devices.roofline.DeviceAssumptions`` fields (as ``backend_options.sim.device``).

    Raises:
        dlfp.devices.roofline.CostModelError: unknown model or GPU, or a TP degree the model cannot split.
    """

    def __init__(self, model: str, gpu: str, tp: int = 1, assumptions: dict[str, Any] | None = None) -> None:
        from dlfp.devices import roofline as cm

        self._cm = cm
        self.model, self.gpu, self.tp = model, gpu, int(tp)
        a = cm.DeviceAssumptions(**(assumptions or {}))
        self._dm = cm.DeviceModel(cm.load_model(model), cm.load_gpu(gpu), self.tp, a)

    def _batch(self, batch: EmuBatch):
        return self._cm.Batch(prefill=batch.prefill_chunks, decodes=batch.decode_contexts, sampled=batch.sampled)

    def __call__(self, batch: EmuBatch) -> float:
        return self._dm.time_batch(self._batch(batch))[0]

    def energy_j(self, batch: EmuBatch) -> float:
        """Modelled energy (joules, all ``tp`` GPUs) of the batch."""
        return self._dm.breakdown(self._batch(batch)).energy_j


@dataclass
class DeviceRecord:
    """Timing of one batch on the emulated device (seconds, ``monotonic`` clock)."""

    seq: int
    issue_s: float
    device_start_s: float = math.nan
    device_end_s: float = math.nan
    signal_s: float = math.nan
    modelled_s: float = math.nan
    meta: dict[str, Any] = field(default_factory=dict)


class EmulatedDevice:
    """A strictly serial device: one thread runs batches in submission order.

    ``submit(duration_s, result, record)`` returns a ``Future`` that the device
    thread completes with ``result`` once the batch has "run": it starts when
    the device is free (``max(submit time, previous end)``) and ends
    ``duration_s`` later. Start and end follow this device timeline exactly; a
    late wake-up of the thread (GIL hand-over, CPU contention) delays only when
    the completion becomes visible (``record.signal_s``), never the next batch.
    The thread sleeps (releasing the GIL) so the engine thread keeps
    scheduling meanwhile, as the host does while a GPU computes. ``on_done``
    (if given) is called on the device thread with the finished record before
    the future completes.
    """

    # The last SPIN_S seconds of a wait are spun, not slept: time.sleep
    # overshoots by ~0.1 ms on Linux.
    SPIN_S = 0.0003

    def __init__(self, on_done: Callable[[DeviceRecord], None] | None = None, name: str = "EmuDevice") -> None:
        self._q: queue.Queue = queue.Queue()
        self._on_done = on_done
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @staticmethod
    def wait_until(deadline: float, spin_s: float = SPIN_S) -> None:
        """Block until ``monotonic() >= deadline`` (sleep, then spin the last ``spin_s``)."""
        while True:
            rem = deadline - time.monotonic()
            if rem <= 0:
                return
            time.sleep(rem - spin_s if rem > spin_s else 0)

    def submit(self, duration_s: float, result: Any, record: DeviceRecord, not_before_s: float = 0.0) -> Future:
        """Queue a batch; return the future of its result.

        The batch ends ``duration_s`` after it starts, but not before
        ``not_before_s`` (``monotonic`` seconds: the end of its kernel launch).

        Raises:
            ValueError: negative or non-finite duration.
            RuntimeError: the device was shut down.
        """
        if not math.isfinite(duration_s) or duration_s < 0:
            raise ValueError(f"device time must be a finite non-negative number of seconds, got {duration_s!r}")
        if self._closed:
            raise RuntimeError("emulated device is shut down")
        record.modelled_s = float(duration_s)
        fut: Future = Future()
        self._q.put((duration_s, result, record, fut, not_before_s, time.monotonic()))
        return fut

    def _loop(self) -> None:
        prev_end = -math.inf
        while True:
            item = self._q.get()
            if item is None:
                return
            duration_s, result, record, fut, not_before_s, submitted_s = item
            # The device's own timeline: a batch starts when it was submitted or when the previous one ended,
            # whichever is later, even if this thread woke up late (GIL, CPU contention): a GPU runs the next
            # queued batch at once, whenever the host notices the previous completion.
            start = max(submitted_s, prev_end)
            end = max(start + duration_s, not_before_s)
            self.wait_until(end)
            record.device_start_s, record.device_end_s = start, end
            record.signal_s = time.monotonic()  # when the completion became visible (>= end)
            prev_end = end
            try:
                if self._on_done is not None:
                    self._on_done(record)
            except BaseException as e:  # never kill the device thread; surface on the future
                fut.set_exception(e)
                continue
            fut.set_result(result)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the thread after the queued batches have run."""
        if not self._closed:
            self._closed = True
            self._q.put(None)
            self._thread.join(timeout_s)
