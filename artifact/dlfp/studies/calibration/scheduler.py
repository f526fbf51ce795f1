"""``CalibrationScheduler``: the DLFP vLLM scheduler plus a JSON-lines log of per-step times and batch features.

vLLM builds it from the import string ``SCHEDULER_CLS`` (``scheduler_cls`` engine argument) in the engine-core
process. The class subclasses ``dlfp.backends.vllm.scheduler.DLFPScheduler`` and so needs vLLM: it is created
on first attribute access (module ``__getattr__``), so importing this module does not import vLLM.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

from dlfp.studies.calibration import runner_parts
from dlfp.studies.calibration.features import chunk_counts

#: environment variable naming the JSON-lines log the scheduler appends to
ENV_LOG = "DLFP_CAL_LOG"
#: import string vLLM resolves to the scheduler class
SCHEDULER_CLS = f"{__name__}.CalibrationScheduler"
#: buffered log lines written at once
FLUSH_LINES = 256


def step_chunks(num_scheduled_tokens: Mapping[str, int], requests: Mapping[str, Any]):
    """The chunks of one scheduled step: ``(chunks, sampled_ids, num_prefills, num_decodes)``.

    Args:
        num_scheduled_tokens: ``{request id: tokens scheduled this step}`` (``SchedulerOutput``).
        requests: ``{request id: vLLM Request}`` after ``schedule()``, whose ``num_computed_tokens``
            already counts this step's tokens; also read: ``num_prompt_tokens``, ``num_tokens``.

    Returns:
        ``chunks`` as ``chunk_counts`` takes them (``(new_tokens, computed_before, sampled)``), the ids of the
        requests that sample a token, and the numbers of prefill and decode chunks.
    """
    chunks, sampled_ids = [], []
    npf = nd = 0
    for rid, n in num_scheduled_tokens.items():
        r = requests[rid]
        before = r.num_computed_tokens - n
        prefill = before < max(r.num_prompt_tokens, r.num_tokens - 1)
        samp = r.num_computed_tokens >= r.num_tokens
        chunks.append((n, before, samp))
        npf += prefill
        nd += not prefill
        if samp:
            sampled_ids.append(rid)
    return chunks, sampled_ids, npf, nd


def _make_scheduler_class():
    """Build ``CalibrationScheduler`` (needs vLLM)."""
    from dlfp.backends.vllm.scheduler import DLFPScheduler

    class CalibrationScheduler(DLFPScheduler):
        """``DLFPScheduler`` (run with ``NoCap``) plus a log of per-step times and exact batch features.

        Log (JSON lines, path from ``DLFP_CAL_LOG``): ``{"event": "add", "request_id", "t"}`` when a
        request enters the scheduler; ``{"event": "step", "step", "schedule_start_s",
        "schedule_end_s", "update_start_s", "update_end_s", "busy_after", "num_running",
        "num_prefills", "num_decodes", "sampled_ids", + chunk_counts(...)}`` per non-empty step.
        Times: ``time.monotonic()``. Written from ``update_from_output`` (buffered) and at shutdown.
        Each step row also carries the model runner's parts of that step (``runner_parts.take()``: the time
        inside ``execute_model``, ``_update_states``, ``_prepare_inputs``, ``_model_forward``,
        ``sample_tokens``, ``_sample``, ``_bookkeeping_sync``), timed by wrapping those methods in this
        process (``runner_parts.install``).
        """

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._cal_path = os.environ.get(ENV_LOG)
            self._cal_buf: list[str] = []
            self._cal_step = 0
            self._cal_rows: dict[int, dict] = {}
            runner_parts.install()

        def add_request(self, request):
            self._cal_buf.append(json.dumps({"event": "add", "request_id": request.request_id,
                                             "t": time.monotonic()}))
            return super().add_request(request)

        def schedule(self):
            t0 = time.monotonic()
            out = super().schedule()
            t1 = time.monotonic()
            runner_parts.take()  # drop anything the runner timed outside a step (warm-up, profiling)
            if out.total_num_scheduled_tokens > 0:
                chunks, sampled_ids, npf, nd = step_chunks(out.num_scheduled_tokens, self.requests)
                row = {"event": "step", "step": self._cal_step, "schedule_start_s": t0, "schedule_end_s": t1,
                       "num_running": len(self.running), "num_prefills": npf, "num_decodes": nd,
                       "sampled_ids": sampled_ids, **chunk_counts(chunks)}
                self._cal_step += 1
                self._cal_rows[id(out)] = row
            return out

        def update_from_output(self, scheduler_output, model_runner_output):
            t2 = time.monotonic()
            row = self._cal_rows.pop(id(scheduler_output), None)
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            parts = runner_parts.take()
            if row is not None:
                row.update(parts)
                row["update_start_s"] = t2
                row["update_end_s"] = time.monotonic()
                row["busy_after"] = bool(self.has_requests())
                self._cal_buf.append(json.dumps(row))
            if len(self._cal_buf) >= FLUSH_LINES or not self.has_unfinished_requests():
                self._cal_flush()
            return outputs

        def _cal_flush(self):
            if self._cal_path and self._cal_buf:
                with open(self._cal_path, "a", encoding="utf-8") as f:
                    f.write("\n".join(self._cal_buf) + "\n")
            self._cal_buf.clear()

        def shutdown(self):
            try:
                self._cal_flush()
            finally:
                super().shutdown()

    CalibrationScheduler.__module__ = __name__
    CalibrationScheduler.__qualname__ = "CalibrationScheduler"
    return CalibrationScheduler


_SCHED_CLS = None


def __getattr__(name: str):
    """``CalibrationScheduler``, built on first access (``SCHEDULER_CLS`` names it)."""
    global _SCHED_CLS
    if name == "CalibrationScheduler":
        if _SCHED_CLS is None:
            _SCHED_CLS = _make_scheduler_class()
        return _SCHED_CLS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
