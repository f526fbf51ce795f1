"""GPU time of each batch's forward pass, from CUDA events, for the ``device_completion`` signal.

A start event is recorded on the current CUDA stream right before
``GPUModelRunner._model_forward`` and an end event right after it; the pair
goes into a FIFO that the scheduler drains once per executed batch, in
scheduling order, with :meth:`ForwardTimer.pop_elapsed_s` (seconds).

THIS GPU PATH IS UNTESTED ON A GPU in this artifact: only the bookkeeping
(wrapping, FIFO order, bound, install conditions) is tested, on CPU, with a
fake event source (``tests/test_cuda_timing.py``).

What vLLM 0.17.1 does (read in its source):

* ``v1/worker/gpu_model_runner.py``: ``GPUModelRunner.execute_model`` calls
  ``self._model_forward(input_ids=..., positions=..., intermediate_tensors=...,
  inputs_embeds=..., **model_kwargs)`` once per batch; the logits and the
  sampler (``sample_tokens``) run after it, so they are not in the measured
  span. A batch with zero scheduled tokens returns before the forward
  (``EMPTY_MODEL_RUNNER_OUTPUT`` or ``kv_connector_no_forward``) and records
  nothing, so pop only for batches with ``total_num_scheduled_tokens > 0``.
* ``GPUModelRunner._dummy_run`` (profiling, warm-up, CUDA-graph capture,
  ``Worker.execute_dummy_batch``) calls ``self.model(...)`` directly, not
  ``_model_forward``; so it records nothing. The wrapper still suppresses
  recording inside ``_dummy_run``, in case a subclass routes it through
  ``_model_forward``.
* The V2 runner (``VLLM_USE_V2_MODEL_RUNNER=1``, ``v1/worker/gpu/model_runner.py``)
  has no ``_model_forward``; :func:`install_forward_timer` returns None then.
"""
from __future__ import annotations

import functools
import threading
from collections import deque
from typing import Any, Callable

_ATTR = "_dlfp_forward_timer"  # set on the wrapped runner class: the timer in effect


class ForwardTimer:
    """FIFO of (start, end) event pairs, one per recorded forward pass.

    ``event_factory()`` returns a new event with ``.record()``,
    ``.synchronize()`` and ``.elapsed_time(other)`` (milliseconds from this
    event to ``other``), e.g. ``lambda: torch.cuda.Event(enable_timing=True)``.
    At most ``max_pending`` pairs are kept; a new pair beyond that drops the
    oldest and increments :attr:`dropped` (the scheduler is then out of step
    with the forwards). Raises ValueError when ``max_pending < 1``.
    """

    def __init__(self, event_factory: Callable[[], Any], max_pending: int = 4096) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.event_factory = event_factory
        self.max_pending = max_pending
        self.dropped = 0
        self._pairs: deque[tuple[Any, Any]] = deque()
        self._lock = threading.Lock()
        self._dummy_depth = 0  # > 0 while inside the runner's _dummy_run: forwards are not queued

    @property
    def pending(self) -> int:
        """Number of recorded pairs not popped yet."""
        return len(self._pairs)

    def push(self, start: Any, end: Any) -> None:
        """Queue a recorded (start, end) pair, dropping the oldest beyond ``max_pending``."""
        with self._lock:
            if len(self._pairs) >= self.max_pending:
                self._pairs.popleft()
                self.dropped += 1
            self._pairs.append((start, end))

    def pop_elapsed_s(self) -> float | None:
        """GPU seconds of the oldest queued forward, or None when the FIFO is empty.

        Blocks in ``end.synchronize()`` until that forward has finished on the
        device (when the batch's output already reached the scheduler, it has).
        Errors of the event source (torch's RuntimeError) propagate.
        """
        with self._lock:
            if not self._pairs:
                return None
            start, end = self._pairs.popleft()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def clear(self) -> None:
        """Drop every queued pair (``dropped`` is kept)."""
        with self._lock:
            self._pairs.clear()


def wrap_forward(runner_cls: type, timer: ForwardTimer) -> ForwardTimer:
    """Wrap ``runner_cls._model_forward`` so each call queues a (start, end) pair in ``timer``.

    The wrapper records ``start`` right before the original call and ``end``
    right after it, passes args/kwargs through and returns the original's
    value; a call that raises queues nothing. Calls made inside
    ``runner_cls._dummy_run`` (when the class has one) are not queued.
    Wrapping is done once per class hierarchy: if ``runner_cls`` (or a base)
    is already wrapped, nothing changes and the timer already in effect is
    returned; otherwise ``timer`` is returned. Raises TypeError when
    ``runner_cls`` has no callable ``_model_forward``.
    """
    existing = getattr(runner_cls, _ATTR, None)
    if existing is not None:
        return existing
    original = getattr(runner_cls, "_model_forward", None)
    if not callable(original):
        raise TypeError(f"{runner_cls!r} has no callable _model_forward to time")

    @functools.wraps(original)
    def _model_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if timer._dummy_depth:
            return original(self, *args, **kwargs)
        start, end = timer.event_factory(), timer.event_factory()
        start.record()
        out = original(self, *args, **kwargs)
        end.record()
        timer.push(start, end)
        return out

    runner_cls._model_forward = _model_forward
    dummy = getattr(runner_cls, "_dummy_run", None)
    if callable(dummy):

        @functools.wraps(dummy)
        def _dummy_run(self: Any, *args: Any, **kwargs: Any) -> Any:
            timer._dummy_depth += 1
            try:
                return dummy(self, *args, **kwargs)
            finally:
                timer._dummy_depth -= 1

        runner_cls._dummy_run = _dummy_run
    setattr(runner_cls, _ATTR, timer)
    return timer


def install_forward_timer(
    vllm_config: Any,
    *,
    runner_cls: type | None = None,
    event_factory: Callable[[], Any] | None = None,
    cuda_available: bool | None = None,
) -> ForwardTimer | None:
    """Time every forward of the in-process GPU model runner; the scheduler calls this in ``__init__``.

    Returns None, and patches nothing, unless CUDA exists
    (``torch.cuda.is_available()``, or ``cuda_available``) and the model
    runner lives in this (engine-core) process: ``parallel_config.world_size
    == 1`` and ``distributed_executor_backend`` in (None, "uni"). With "mp",
    "ray", "external_launcher" or a custom executor the forward runs in a
    worker process (or is not the one the scheduler feeds), and CUDA events
    recorded in another process cannot be synchronized or read here. Also
    None with the default ``runner_cls`` under ``VLLM_USE_V2_MODEL_RUNNER``.

    Idempotent: the runner method is wrapped once and every call returns the
    same timer. Every call clears the FIFO: in ``EngineCore.__init__``
    (vLLM 0.17.1, ``v1/engine/core.py``) the executor is created first, then
    ``_initialize_kv_caches`` (memory profiling, KV-cache allocation, warm-up
    and CUDA-graph capture via ``initialize_from_config``), and only then the
    scheduler, so anything queued before belongs to no scheduled batch.

    Defaults: ``runner_cls`` = vLLM's ``GPUModelRunner``, ``event_factory`` =
    ``torch.cuda.Event(enable_timing=True)``; the keywords exist for tests.
    Raises TypeError when ``runner_cls`` has no ``_model_forward``.
    """
    parallel = vllm_config.parallel_config
    if parallel.world_size != 1 or parallel.distributed_executor_backend not in (None, "uni"):
        return None
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if not cuda_available:
        return None
    if runner_cls is None:
        from vllm import envs

        if envs.VLLM_USE_V2_MODEL_RUNNER:
            return None
        from vllm.v1.worker import gpu_model_runner

        runner_cls = gpu_model_runner.GPUModelRunner
    if event_factory is None:
        import torch

        event_factory = functools.partial(torch.cuda.Event, enable_timing=True)
    timer = wrap_forward(runner_cls, ForwardTimer(event_factory))
    timer.clear()  # v1/engine/core.py EngineCore.__init__: scheduler built after _initialize_kv_caches
    return timer
