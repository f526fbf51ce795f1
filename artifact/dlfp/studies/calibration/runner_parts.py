"""Timing the model runner's parts of one engine step, inside the engine-core process.

vLLM 0.17.1's CPU model runner (``vllm.v1.worker.cpu_model_runner.CPUModelRunner``) inherits its step from
``vllm.v1.worker.gpu_model_runner.GPUModelRunner``. In the synchronous ``EngineCore.step`` one step calls, in
order, ``execute_model`` (which calls ``_update_states``, ``_prepare_inputs``, ``_model_forward`` and the LM
head) and ``sample_tokens`` (which calls ``_sample`` and ``_bookkeeping_sync``). ``install()`` wraps these
methods of the class so that each call adds its wall time to a per-step record; ``take()`` returns and
clears the record. ``CalibrationScheduler`` calls ``take()`` at the end of ``schedule()`` (dropping anything
timed outside a step) and in ``update_from_output`` (the step's parts).

Record keys: ``<part>_s`` (seconds inside the method, summed over calls in the step) and, for
``execute_model`` and ``sample_tokens``, ``<part>_start_s`` / ``<part>_end_s`` (``time.monotonic()``, the
scheduler log's clock). Parts: ``TIMED``.

The wrapping costs two ``time.monotonic()`` calls per method call (well under a microsecond each).
"""
from __future__ import annotations

import functools
import time

#: (GPUModelRunner method, part name) timed per step
TIMED: tuple[tuple[str, str], ...] = (
    ("execute_model", "execute_model"),
    ("_update_states", "update_states"),
    ("_prepare_inputs", "prepare_inputs"),
    ("_model_forward", "model_forward"),
    ("sample_tokens", "sample_tokens"),
    ("_sample", "sample"),
    ("_bookkeeping_sync", "bookkeeping_sync"),
)
#: parts whose first start and last end are recorded too
MARKED = ("execute_model", "sample_tokens")

_record: dict[str, float] = {}


def _timed(orig, part: str):
    """``orig`` wrapped to add its duration to ``_record[part + "_s"]``."""
    mark = part in MARKED

    @functools.wraps(orig)
    def timed(self, *args, **kwargs):
        t0 = time.monotonic()
        try:
            return orig(self, *args, **kwargs)
        finally:
            t1 = time.monotonic()
            key = part + "_s"
            _record[key] = _record.get(key, 0.0) + (t1 - t0)
            if mark:
                _record.setdefault(part + "_start_s", t0)
                _record[part + "_end_s"] = t1

    timed.__dlfp_timed__ = True
    return timed


def install(cls=None) -> list[str]:
    """Wrap the ``TIMED`` methods of ``cls`` (default ``GPUModelRunner``, which the CPU runner inherits).

    Idempotent. Returns the methods wrapped by this call.

    Raises:
        ImportError: vLLM is not installed (when ``cls`` is None).
        AttributeError: ``cls`` lacks one of the methods (a different vLLM version).
    """
    if cls is None:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner as cls  # noqa: N813
    done = []
    for meth, part in TIMED:
        orig = getattr(cls, meth)
        if getattr(orig, "__dlfp_timed__", False):
            continue
        setattr(cls, meth, _timed(orig, part))
        done.append(meth)
    return done


def take() -> dict[str, float]:
    """The parts timed since the last call (see the module docstring), and clear them."""
    out = dict(_record)
    _record.clear()
    return out


__all__ = ["MARKED", "TIMED", "install", "take"]
