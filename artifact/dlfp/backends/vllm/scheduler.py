"""DLFP inside vLLM 0.17.1's V1 scheduler, plugged in through ``scheduler_cls``.

Use in any vLLM 0.17.1 server (no harness needed)::

    vllm serve MODEL --scheduler-cls dlfp.backends.vllm.scheduler.DLFPScheduler \\
        --additional-config '{"dlfp": {"policy": "dlfp", "target_s": 0.08, "log_path": "/tmp/dlfp.jsonl"}}'

``DLFPScheduler`` picks its asynchronous-scheduling twin (``DLFPAsyncScheduler``,
a subclass of vLLM's ``AsyncScheduler``) by itself when the engine runs with
``async_scheduling``: a custom ``scheduler_cls`` replaces vLLM's own
Scheduler/AsyncScheduler choice, so the choice is redone here from the engine
config. Both share :class:`DLFPSchedulerMixin`; the controller code is the same.

Settings (validated when the engine core starts; a bad value raises
:class:`DLFPConfigError` with one line naming the field):

* ``additional_config["dlfp"]``: the fields of :class:`dlfp.config.PolicyConfig`
  (``policy`` nocap|fixed|dlfp|dlfps, ``signal`` host_cadence|device_completion,
  ``cap``, ``target_s``, ``initial_cap``, ``min_cap``, ``max_cap``, ``quantum``,
  ``gain``, ``options``) plus ``log_path`` (per-iteration JSONL log, optional);
* else the environment: ``DLFP_POLICY_JSON`` (the same JSON object) and
  ``DLFP_SCHED_LOG`` (log path); ``DLFP_SCHED_LOG`` also fills a missing
  ``log_path`` of ``additional_config`` (the harness passes the per-run path
  this way, so the path does not enter vLLM's compile-cache hash);
* neither: the paper's DLFP (target 80 ms, initial cap 3,072, clamp
  1,024..6,144, 128-token quantum, host_cadence signal).

How the cap is enforced (one hook, no copy of ``schedule()``)
-------------------------------------------------------------
While at least one running request is decoding, the policy's cap ``C`` limits
the TOTAL prefill tokens of the step. ``schedule()`` of vLLM 0.17.1 computes
each request's ``num_new_tokens`` (after ``long_prefill_token_threshold`` and
the shared ``token_budget``) and then, in BOTH its running-request loop and
its waiting-request loop, passes that number through the per-request hook
``_mamba_block_aligned_split(request, num_new_tokens, ...)`` right before KV
allocation whenever ``need_mamba_block_aligned_split`` is set. A result of 0
makes the running loop skip the request (``continue``) and the waiting loop
stop admitting (``break``), exactly what an exhausted prefill allowance needs.
So, for a capped step only, this class sets that flag and overrides the hook:
a request in its prefill phase (vLLM's own test, the one the stock hook uses:
``num_computed_tokens < max(num_prompt_tokens, num_tokens - 1)``, which also
covers preempted-and-resumed requests) gets ``min(num_new_tokens, left)``
tokens and ``left`` drops by that many; decodes pass untouched. The stock
hook still runs first for models that need it (hybrid Mamba models).

Why not the alternatives: lowering ``max_num_scheduled_tokens`` to
``decodes + C`` is not a prefill cap, because decodes and prefills share one
token budget in list order, so a prefill ahead of a decode in ``running``
could take the decode's share (and starve it) or exceed ``C``; setting
``long_prefill_token_threshold = C`` caps each request, not their sum, and
cannot express "0 more prefill tokens" (0 disables the threshold).

Exactness: the allowance is charged when a request's chunk size is decided;
if its KV allocation then fails, vLLM stops scheduling further requests in
that loop (running loop: ``break`` after self-preemption, and the waiting loop
is skipped after any preemption; waiting loop: ``break``), so nothing can
overspend it. Under the PRIORITY policy a preempted, already-scheduled request
returns its tokens to vLLM's budget but not to the prefill allowance (stays
conservative: never above ``C``). The allowance is also clamped to
``max_num_scheduled_tokens - num_decoding`` so a cap larger than the budget
left after the decodes can never starve a decode (never binds with the
paper's clamp of 6,144 and a budget >= 6,144 + max_num_seqs). With no
decoding request the policy returns no cap and ``schedule()`` is vLLM's,
untouched. KV-connector asynchronous loads (P/D disaggregation) are not
supported in a capped step (the hook's 0 would stop admission).

Feedback signals (``policy.observe`` exactly once per non-empty iteration)
--------------------------------------------------------------------------
* ``host_cadence`` (the paper's): seconds from this iteration's
  ``schedule()`` call to the next ``schedule()`` call; observed at that next
  call, before its cap is chosen.
* ``device_completion``: seconds from dispatch (end of ``schedule()``) until
  the iteration's output reaches ``update_from_output``, counted from the
  later of the dispatch and the previous iteration's completion (under async
  scheduling a batch queued behind a running one does not start before it
  finishes; in the synchronous loop this is dispatch -> output). Observed in
  ``update_from_output``.
  On a GPU, with the model runner in the engine-core process (one GPU,
  in-process executor), the forward pass of each batch is timed with CUDA
  events instead (:mod:`dlfp.backends.vllm.cuda_timing`; UNTESTED ON A GPU in
  this artifact, its bookkeeping is tested on CPU with fake events).
* Policies with ``wants_context`` (DLFP-G) also get the step's ``ScheduleContext``
  and the ``Observation``'s context fields; with ``logs_reasons`` each log row
  carries its decision's ``reason``.

Per-iteration log
-----------------
With a ``log_path`` the engine-core process appends JSON lines: one
``{"event": "start", ...}`` header per scheduler, then one
``{"event": "iteration", ...}`` per non-empty iteration with the keys of
``dlfp.traces.format.ITERATION_COLUMNS`` (times are ``time.monotonic()`` seconds,
CLOCK_MONOTONIC, the same clock in every process of the machine), and
``{"event": "end"}`` at shutdown. Rows are buffered, then JSON-encoded together and written from
``update_from_output`` (never from ``schedule()``) every 64 rows, when the engine goes idle
and at shutdown. Read it back with :func:`read_log`.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from dlfp.config import PolicyConfig, build_policy
from dlfp.backends.vllm.cuda_timing import install_forward_timer
from dlfp.devices.batch import chunk_pairs
from dlfp.policies.base import Observation, ScheduleContext

ENV_POLICY = "DLFP_POLICY_JSON"
ENV_LOG = "DLFP_SCHED_LOG"
CONFIG_KEY = "dlfp"
#: Buffered log rows written per flush (a crash loses at most this many).
FLUSH_EVERY = 64


class DLFPConfigError(ValueError):
    """DLFP scheduler settings that cannot run; the message is one line naming the field."""


@dataclass(frozen=True)
class DLFPSettings:
    """Parsed scheduler settings: the arm's policy and where to log (``None`` = no log)."""

    policy: PolicyConfig
    log_path: str | None
    source: str


def parse_settings(additional_config: Any = None, environ: dict[str, str] | None = None) -> DLFPSettings:
    """Settings from vLLM's ``additional_config["dlfp"]``, else ``DLFP_POLICY_JSON``, else paper defaults.

    Raises:
        DLFPConfigError: not a JSON object, an unknown field, or a bad value
            (one line naming the field and the source).
    """
    env = os.environ if environ is None else environ
    raw: Any = None
    source = "paper defaults"
    if isinstance(additional_config, dict) and CONFIG_KEY in additional_config:
        raw, source = additional_config[CONFIG_KEY], f"additional_config[{CONFIG_KEY!r}]"
    elif env.get(ENV_POLICY):
        source = ENV_POLICY
        try:
            raw = json.loads(env[ENV_POLICY])
        except json.JSONDecodeError as e:
            raise DLFPConfigError(f"DLFP settings ({source}): not valid JSON: {e}") from None
    else:
        raw = {"policy": "dlfp"}
    if not isinstance(raw, dict):  # includes an explicit null: settings were given, so they must be an object
        raise DLFPConfigError(f"DLFP settings ({source}): must be a JSON object, got "
                              f"{'null' if raw is None else type(raw).__name__}")
    raw = dict(raw)
    log_path = raw.pop("log_path", None)
    if log_path is not None and not isinstance(log_path, str):
        raise DLFPConfigError(f"DLFP settings ({source}): field log_path: must be a string (a file path), "
                              f"got {type(log_path).__name__} {log_path!r}")
    log_path = log_path or env.get(ENV_LOG) or None
    raw.setdefault("policy", "dlfp")
    from pydantic import ValidationError

    from dlfp.config import validation_message

    try:
        pc = PolicyConfig.model_validate(raw)
    except ValidationError as e:
        raise DLFPConfigError(f"DLFP settings ({source}): {validation_message(e)}") from None
    except (ValueError, ImportError) as e:  # controller checks, or a policy module that is missing
        raise DLFPConfigError(f"DLFP settings ({source}): {e}") from None
    return DLFPSettings(policy=pc, log_path=str(log_path) if log_path else None, source=source)


def is_prefilling(request) -> bool:
    """vLLM's own prefill-phase test for a request (fresh, chunked or resumed after preemption).

    True while ``num_computed_tokens < max(num_prompt_tokens, num_tokens - 1)``
    (``Scheduler._mamba_block_aligned_split`` in vLLM 0.17.1 uses the same test):
    a decoding request has computed all but its newest token (sync) or more,
    counting output placeholders (async).
    """
    return request.num_computed_tokens < max(request.num_prompt_tokens, request.num_tokens - 1)


_NAN = float("nan")
_IS_PREFILL_CHUNK = attrgetter("is_prefill_chunk")  # vLLM's flag for a running request still mid-prompt


class DLFPSchedulerMixin:
    """The DLFP delta on vLLM's scheduler: cap hook, both feedback signals, iteration log.

    Mixed into ``Scheduler`` (:class:`DLFPScheduler`) and ``AsyncScheduler``
    (:class:`DLFPAsyncScheduler`); see the module docstring.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        settings = parse_settings(getattr(self.vllm_config, "additional_config", None))
        self.dlfp_settings = settings
        self.dlfp_policy = build_policy(settings.policy)
        self._dlfp_signal = self.dlfp_policy.signal
        self._dlfp_host = self._dlfp_signal == "host_cadence"
        self._dlfp_model_split = bool(self.need_mamba_block_aligned_split)
        self._dlfp_context = bool(getattr(self.dlfp_policy, "wants_context", False))  # DLFP-G
        self._dlfp_reasons = bool(getattr(self.dlfp_policy, "logs_reasons", False))
        # on a GPU with the model runner in this process: the forward pass timed by CUDA events
        self._dlfp_timer = install_forward_timer(self.vllm_config) if not self._dlfp_host else None
        self._dlfp_left: int | None = None  # prefill allowance left in the step being scheduled
        self._dlfp_iteration = 0
        # a scheduled iteration is a record [row or None, SchedulerOutput, partial, t0, t1, cap, decoding, index]
        self._dlfp_prev: list | None = None  # last non-empty iteration, awaiting its host interval
        self._dlfp_inflight: dict[int, list] = {}  # id(SchedulerOutput) -> record, awaiting device completion
        self._dlfp_last_end = -math.inf
        self._dlfp_rows: list[dict] = []  # completed rows, encoded and written by the next flush
        self._dlfp_file = None
        if settings.log_path:
            os.makedirs(os.path.dirname(os.path.abspath(settings.log_path)), exist_ok=True)
            self._dlfp_file = open(settings.log_path, "a", encoding="utf-8")
            header = {"event": "start", "pid": os.getpid(), "scheduler": type(self).__name__,
                      "policy": self.dlfp_policy.params(), "settings_source": settings.source,
                      "max_num_scheduled_tokens": self.max_num_scheduled_tokens,
                      "max_num_running_reqs": self.max_num_running_reqs,
                      "async_scheduling": bool(self.scheduler_config.async_scheduling),
                      "clock": "time.monotonic", "time_s": time.monotonic()}
            self._dlfp_file.write(json.dumps(header) + "\n")
            self._dlfp_file.flush()

    # -- the cap ------------------------------------------------------------------------------
    def _mamba_block_aligned_split(self, request, num_new_tokens: int,
                                   num_new_local_computed_tokens: int = 0,
                                   num_external_computed_tokens: int = 0) -> int:
        """vLLM's per-request chunk hook, plus the prefill allowance while a cap is in force."""
        if self._dlfp_model_split:
            num_new_tokens = super()._mamba_block_aligned_split(
                request, num_new_tokens, num_new_local_computed_tokens, num_external_computed_tokens)
        left = self._dlfp_left
        if left is not None and (num_new_tokens > 1 or left == 0 or request.is_prefill_chunk
                                 or request.num_computed_tokens < request.num_prompt_tokens):
            computed = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
            if computed < max(request.num_prompt_tokens, request.num_tokens - 1):
                num_new_tokens = min(num_new_tokens, left)
                self._dlfp_left = left - num_new_tokens
        return num_new_tokens

    def schedule(self):
        t0 = time.monotonic()
        prev = self._dlfp_prev
        if prev is not None:  # host_cadence of the previous iteration is known now
            self._dlfp_prev = None
            row = prev[0] or self._dlfp_row(prev)  # counted already, unless its output is still due
            row["host_interval_s"] = t0 - row["schedule_s"]
            if self._dlfp_host:
                self._dlfp_observe(row, t0)
            self._dlfp_done(row)
        # Running requests still in their prompt: vLLM's own flag, set for every scheduled request in
        # _update_after_schedule (num_computed_tokens < num_tokens + placeholders). Preempted requests
        # wait in self.waiting and are prefills again when resumed.
        partial = list(filter(_IS_PREFILL_CHUNK, self.running))
        num_decoding = len(self.running) - len(partial)
        # the oldest request without a first token (waiting, or running mid-prompt): its wait so far (s)
        # and its prompt tokens still to prefill, for policies with a TTFT guard (DLFP-S)
        oldest = self.waiting.peek_request() if self.waiting else None
        for r in partial:
            if r.num_output_tokens == 0 and (oldest is None or r.arrival_time < oldest.arrival_time):
                oldest = r
        kw = {"context": self._dlfp_schedule_context(partial)} if self._dlfp_context else {}
        if oldest is None:
            cap = self.dlfp_policy.prefill_cap(num_decoding, now_s=t0, **kw)
        else:
            cap = self.dlfp_policy.prefill_cap(
                num_decoding, now_s=t0, oldest_waiting_s=max(0.0, time.time() - oldest.arrival_time),
                oldest_remaining_tokens=max(0, oldest.num_prompt_tokens - oldest.num_computed_tokens), **kw)
        if cap is None or not (partial or self.waiting):  # no cap, or no prefill it could bind
            out = super().schedule()
        else:
            self._dlfp_left = max(0, min(int(cap), self.max_num_scheduled_tokens - num_decoding))
            self.need_mamba_block_aligned_split = True
            try:
                out = super().schedule()
            finally:
                self._dlfp_left = None
                self.need_mamba_block_aligned_split = self._dlfp_model_split
        t1 = time.monotonic()
        if out.total_num_scheduled_tokens > 0:  # its row is counted later, see _dlfp_row
            rec = [None, out, partial, t0, t1, cap, num_decoding, self._dlfp_iteration]
            self._dlfp_iteration += 1
            self._dlfp_prev = rec
            self._dlfp_inflight[id(out)] = rec
        return out

    def _dlfp_schedule_context(self, partial: list) -> ScheduleContext:
        """The next step's ``ScheduleContext``: the KV context of the request the first prefill chunk continues
        (first running request mid-prompt, else the waiting head) and the decodes' summed context (tokens)."""
        mid = {id(r) for r in partial}
        dctx = sum(r.num_computed_tokens for r in self.running if id(r) not in mid)
        if partial:
            pctx = partial[0].num_computed_tokens
        else:
            head = self.waiting.peek_request() if self.waiting else None
            pctx = head.num_computed_tokens if head is not None else 0
        return ScheduleContext(pctx, dctx)

    def _dlfp_row(self, rec: list) -> dict:
        """The row of an iteration's record, counted from its ``SchedulerOutput`` at first use: its output
        (or the next ``schedule()``, if first), not the ``schedule()`` that made it (vLLM changes no counts later)."""
        if rec[0] is None:
            _, out, partial, t0, t1, cap, num_decoding, iteration = rec
            # prefills of this step: new and resumed requests, and running requests that were mid-prompt
            nst = out.num_scheduled_tokens
            prefill_tokens = num_prefills = 0
            for nr in out.scheduled_new_reqs:
                prefill_tokens += nst[nr.req_id]
                num_prefills += 1
            for rid in out.scheduled_cached_reqs.resumed_req_ids:
                if rid in nst:
                    prefill_tokens += nst[rid]
                    num_prefills += 1
            for r in partial:
                n = nst.get(r.request_id)
                if n:
                    prefill_tokens += n
                    num_prefills += 1
            num_decodes = len(nst) - num_prefills
            ctx = _batch_context(out, partial) if self._dlfp_context else (None, None)
            rec[:3] = [{
                "iteration": iteration, "schedule_s": t0, "prefill_tokens": prefill_tokens,
                "num_prefills": num_prefills, "num_decodes": num_decodes, "cap": cap, "cap_after": cap,
                "guarded": False, "signal": self._dlfp_signal, "observed_interval_s": _NAN,
                "host_interval_s": None, "device_time_s": None, "issue_s": t1,
                "device_start_s": _NAN, "device_end_s": _NAN, "energy_j": _NAN,
                "num_decoding_running": num_decoding, "_pending": 2, "_context": ctx,
            }, None, None]  # cap_after stays the cap unless observed; keys in log order, "event" added last
        return rec[0]

    # -- device completion --------------------------------------------------------------------
    def update_from_output(self, scheduler_output, model_runner_output):
        t = time.monotonic()
        rec = self._dlfp_inflight.pop(id(scheduler_output), None)
        row = None if rec is None else self._dlfp_row(rec)
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        if row is not None:
            row["device_end_s"] = t
            row["device_time_s"] = t - max(row["issue_s"], self._dlfp_last_end)
            if self._dlfp_timer is not None:  # the CUDA-event time of the batch's forward pass, in batch order
                gpu_s = self._dlfp_timer.pop_elapsed_s()
                if gpu_s is not None:
                    row["device_time_s"] = gpu_s
            self._dlfp_last_end = t
            if not self._dlfp_host:
                self._dlfp_observe(row, t)
            self._dlfp_done(row)
        if len(self._dlfp_rows) >= FLUSH_EVERY or (self._dlfp_rows and not self.has_unfinished_requests()):
            self._dlfp_flush()
        return outputs

    def _dlfp_observe(self, row: dict, now: float) -> None:
        pairs, dctx = row.pop("_context")
        obs = Observation(iteration=row["iteration"], time_s=now, prefill_tokens=row["prefill_tokens"],
                          num_decodes=row["num_decodes"], cap=row["cap"],
                          host_interval_s=row["host_interval_s"], device_time_s=row["device_time_s"],
                          prefill_pairs=pairs, decode_context_tokens=dctx)
        self.dlfp_policy.observe(obs)
        iv = row["host_interval_s" if self._dlfp_host else "device_time_s"]  # = obs.interval(signal)
        row["observed_interval_s"] = _NAN if iv is None else float(iv)
        row["guarded"] = obs.guarded
        decisions = self.dlfp_policy.decisions
        row["cap_after"] = decisions[-1].cap_after if decisions else row["cap"]
        if self._dlfp_reasons and decisions:
            row["reason"] = decisions[-1].reason
        if len(decisions) > 1024:  # the log file keeps the history; bound memory in long-running servers
            del decisions[:-1]

    def _dlfp_done(self, row: dict) -> None:
        """One of the two events of a row (next call, completion) happened; queue it, unencoded, when both have."""
        row["_pending"] -= 1
        if row["_pending"] == 0 and self._dlfp_file is not None:
            del row["_pending"]
            row.pop("_context", None)
            row["event"] = "iteration"
            for k in ("host_interval_s", "device_time_s"):
                if row[k] is None:
                    row[k] = _NAN
            self._dlfp_rows.append(row)

    def _dlfp_flush(self) -> None:
        # Take the rows first: a shutdown that interrupts the write must not leave them to be written twice.
        rows, self._dlfp_rows = self._dlfp_rows, []
        if self._dlfp_file is not None and rows:  # encoded in one go: a row encoded alone costs a few times more
            self._dlfp_file.write("\n".join(map(json.dumps, rows)) + "\n")
            self._dlfp_file.flush()

    def shutdown(self) -> None:
        """Write the rows still buffered (the last one without a next call gets host_interval NaN)."""
        try:
            if self._dlfp_file is not None:
                prev, self._dlfp_prev = self._dlfp_prev, None
                for rec in ([prev] if prev is not None else []) + list(self._dlfp_inflight.values()):
                    row = self._dlfp_row(rec)
                    row["_pending"] = 1
                    self._dlfp_done(row)
                self._dlfp_inflight.clear()
                self._dlfp_flush()
                self._dlfp_file.write(json.dumps({"event": "end", "time_s": time.monotonic(),
                                                  "iterations": self._dlfp_iteration}) + "\n")
                self._dlfp_file.close()
                self._dlfp_file = None
        finally:
            super().shutdown()


def _batch_context(out, partial: list) -> tuple[float, int]:
    """``(prefill_pairs, decode_context_tokens)`` of a ``SchedulerOutput`` (``Observation``'s context fields).

    The KV context before the step is each request's ``num_computed_tokens`` as the output records it (new
    requests: ``NewRequestData``; running ones: ``CachedRequestData``); prefills are the new, resumed and
    mid-prompt requests of the step, the rest are decodes.
    """
    nst = out.num_scheduled_tokens
    pairs = 0.0
    for nr in out.scheduled_new_reqs:
        pairs += chunk_pairs(nst[nr.req_id], nr.num_computed_tokens)
    cached = out.scheduled_cached_reqs
    prefill_ids = set(cached.resumed_req_ids) | {r.request_id for r in partial}
    dctx = 0
    for rid, c in zip(cached.req_ids, cached.num_computed_tokens):
        n = nst.get(rid)
        if not n:
            continue
        if rid in prefill_ids:
            pairs += chunk_pairs(n, c)
        else:
            dctx += c
    return pairs, dctx


class DLFPAsyncScheduler(DLFPSchedulerMixin, AsyncScheduler):
    """DLFP over vLLM's ``AsyncScheduler`` (engines with ``async_scheduling``)."""


class DLFPScheduler(DLFPSchedulerMixin, Scheduler):
    """DLFP over vLLM's ``Scheduler``; becomes :class:`DLFPAsyncScheduler` under async scheduling.

    vLLM builds the scheduler as ``scheduler_cls(vllm_config=..., ...)``; when
    ``vllm_config.scheduler_config.async_scheduling`` is true this returns a
    ``DLFPAsyncScheduler`` instead, so one ``--scheduler-cls`` works in both modes.
    """

    def __new__(cls, *args, **kwargs):
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        if cls is DLFPScheduler and getattr(getattr(vllm_config, "scheduler_config", None),
                                            "async_scheduling", False):
            obj = object.__new__(DLFPAsyncScheduler)
            obj.__init__(*args, **kwargs)  # not auto-called: the object is not a DLFPScheduler
            return obj
        return object.__new__(cls)


def read_log(path: str) -> tuple[list[dict], list[dict]]:
    """Parse a scheduler log: (start/end events, iteration rows), in file order.

    A torn last line (engine killed mid-write) is ignored.

    Raises:
        FileNotFoundError: no such log.
    """
    events, rows = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            (rows if d.get("event") == "iteration" else events).append(d)
    return events, rows


__all__ = ["DLFPAsyncScheduler", "DLFPConfigError", "DLFPScheduler", "DLFPSchedulerMixin", "DLFPSettings",
           "is_prefilling", "parse_settings", "read_log"]
