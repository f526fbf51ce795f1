"""Discrete-event engine: vLLM 0.17.1's EngineCore loops with separate host and device timelines.

Two clocks run side by side:

* the HOST timeline (the EngineCore thread): process the input queue,
  ``schedule()``, prepare inputs, launch kernels, wait, ``update_from_output``;
* the DEVICE timeline: batches run one after another in issue order; a batch starts at ``max(issue, previous
  batch's end)`` and lasts the cost model's time (but cannot end before the host has launched its last kernel).

Loops (``vllm/v1/engine/core.py``):

* ``sync`` = ``EngineCore.step``: schedule -> execute -> block on the result ->
  update. The host interval between scheduler calls equals device time plus
  host cost.
* ``async`` = ``EngineCore.step_with_batch_queue`` with a queue of depth 2
  (``UniProcExecutor.max_concurrent_batches``): schedule and launch; if a batch
  was executed, the queue is not full and the OLDEST batch is not done, return
  at once and schedule again (early return); otherwise block on the oldest
  batch and update from its output. An empty schedule still takes a queue slot.
  The host interval then tracks the previous batch's completion, not its own.

Policy signals: ``host_cadence`` is observed at the next scheduler call;
``device_completion`` when the batch's output has been processed.
Times are seconds from the trial start.

Closed loop (``SimEngine.run(..., concurrency=N)``): the client of ``vllm bench serve --max-concurrency N``
(vLLM 0.17.1, ``vllm/benchmarks/serve.py``, ``benchmark``: ``limited_request_func`` acquires an
``asyncio.Semaphore(N)`` before it sends a request and releases it when the response stream has ended). Requests
acquire in order (the semaphore is FIFO), so request ``i`` is sent at ``max(release_i, c_(i-N))``, where
``release_i`` is its ``arrival_s`` and ``c_k`` the time the client receives the last token of the ``k``-th
request to finish (0-based, in time order); the first ``N`` are sent at their release. The send time becomes the
request's arrival (TTFT counts from it, as bench serve's ``start_time``) and it reaches the engine
``HostCosts.ingest_s`` later, as an open-loop arrival does.
"""
from __future__ import annotations

from collections import deque
from operator import attrgetter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from dlfp.backends.sim.scheduler import FINISHED, Scheduler, SimRequest
from dlfp.devices.batch import chunk_pairs, scheduled_features
from dlfp.devices.frontend import FrontEnd, FrontendCosts
from dlfp.devices.host import HostCosts
from dlfp.devices.roofline import DeviceModel
from dlfp.policies import base as ctl
from dlfp.traces.format import ITERATION_COLUMNS

_NAN = float("nan")
_INF = float("inf")


class _Iteration:
    """One scheduled batch; once executed (``iteration >= 0``) also its row of ``ITERATION_COLUMNS``.

    Times are seconds from the trial start; ``done_at`` is when the host may consume its output.
    """

    __slots__ = ("iteration", "entries", "schedule_s", "cap", "cap_after", "prefill_tokens", "num_prefills",
                 "num_decodes", "guarded", "observed_interval_s", "host_interval_s", "device_time_s", "issue_s",
                 "device_start_s", "device_end_s", "energy_j", "done_at", "processed")

    def __init__(self, entries: list, schedule_s: float, cap: int | None):
        self.entries = entries
        self.schedule_s = schedule_s
        self.cap = cap
        self.cap_after = None
        self.processed = False
        self.host_interval_s = None
        self.observed_interval_s = _NAN


@dataclass
class SimResult:
    """Output of one engine run.

    ``token_times[i]`` lists emission times (s) of request ``i``'s tokens;
    ``iterations`` follows ``dlfp.traces.ITERATION_COLUMNS``; ``sent`` is ``None`` for an open loop.
    """

    token_times: list[list[float]]
    finished: np.ndarray
    iterations: pd.DataFrame
    energy_j: float
    busy_energy_j: float
    end_s: float
    num_preemptions: int
    num_gpu_blocks: int
    num_schedule_calls: int
    extra: dict = field(default_factory=dict)
    sent: list[float] | None = None  # closed loop: each request's send time (s), its arrival in the trace


class _Run:
    """The mutable state of one ``SimEngine.run``: the host clock ``t``, the device's free time, the
    iterations executed so far, and the two halves of an engine step (``schedule`` and ``update``)."""

    def __init__(self, engine: "SimEngine", reqs: list[SimRequest], progress: Callable[[int, int], None] | None,
                 concurrency: int | None = None):
        self.e = engine
        self.reqs = reqs
        self.progress = progress
        self.n = self.unfinished = len(reqs)
        self.fe = engine.frontend()  # None: no API server, a request is visible ``ingest_s`` after it is sent
        self.vis = [r.arrival + engine.host.ingest_s for r in reqs] if self.fe is None else [_INF] * self.n
        self.send = [r.arrival for r in reqs]  # when each request leaves the client (closed loop: once sent)
        self.fe_next = 0  # the first request the front end has not taken yet
        self.sent: list[float] | None = None
        if concurrency is not None:  # closed loop: only the first `concurrency` requests hold a slot at t = 0
            self.release = [r.arrival for r in reqs]
            self.sent = self.release[:concurrency] + [_INF] * max(0, self.n - concurrency)
            self.send = self.sent
            self.vis[concurrency:] = [_INF] * max(0, self.n - concurrency)
            self.next_send = min(concurrency, self.n)
        self.t = 0.0
        self.dev_free = 0.0
        self.next_arrival = 0
        self.it = 0
        self.calls = 0
        self.busy_e = 0.0
        self.busy_t = 0.0
        self.rows: list[_Iteration] = []
        self.last: _Iteration | None = None  # last executed batch whose host interval is still unknown

    # ------------------------------------------------------------------ observation
    def observe(self, b: _Iteration, now: float) -> None:
        """Feed ``b``'s observation to the policy at ``now`` and record the interval and cap it used."""
        e = self.e
        pol = e.policy
        obs = ctl.Observation(iteration=b.iteration, time_s=now, prefill_tokens=b.prefill_tokens,
                              num_decodes=b.num_decodes, cap=b.cap, host_interval_s=b.host_interval_s,
                              device_time_s=(b.device_end_s - b.device_start_s) if b.processed else None)
        if e._wants_context:
            pairs = dctx = 0
            for _r, k, c, dec, _s in b.entries:
                if dec:
                    dctx += c
                else:
                    pairs += chunk_pairs(k, c)
            obs.prefill_pairs, obs.decode_context_tokens = float(pairs), dctx
        decs = e._decisions
        nd = len(decs) if decs is not None else 0
        pol.observe(obs)
        iv = b.host_interval_s if e._host_sig else obs.device_time_s
        b.observed_interval_s = _NAN if iv is None else iv
        if decs is not None and len(decs) > nd:
            b.cap_after = decs[-1].cap_after
        else:
            b.cap_after = getattr(pol, "cap", None)

    # ------------------------------------------------------------------ the two halves of a step
    def frontend_until(self, t: float) -> None:
        """The API server takes every request sent by ``t`` (s), in send order, and fixes when it reaches the engine.

        Called before any output processed at or after ``t``, so the event loop serves work in arrival order.
        """
        fe, send, k, n = self.fe, self.send, self.fe_next, self.n
        if fe is None:
            return
        while k < n and send[k] <= t:
            self.vis[k] = fe.request(send[k], self.reqs[k].P)
            k += 1
        self.fe_next = k

    def next_visible(self) -> float:
        """When the next request not yet admitted reaches the engine (s; infinity for a closed loop's unsent one).

        Only asked while nothing is in flight, so no output can come before that request's own front-end work.
        """
        a = self.next_arrival
        if self.fe is not None and self.fe_next == a and self.send[a] != _INF:
            self.frontend_until(self.send[a])
        return self.vis[a]

    def admit(self) -> None:
        """``_process_input_queue``: every request visible by now joins the waiting queue."""
        self.frontend_until(self.t)
        reqs, vis, a, n, t = self.reqs, self.vis, self.next_arrival, self.n, self.t
        waiting = self.e.sched.waiting
        while a < n and vis[a] <= t:
            waiting.append(reqs[a])
            a += 1
        self.next_arrival = a

    def schedule(self, now: float) -> tuple[_Iteration, bool]:
        """``Scheduler.schedule`` at ``now``, then input preparation and kernel launch of the batch.

        The batch starts on the device when issued and the device is free, lasts the device model's time, and
        cannot end before its last kernel is launched (then its utilisation is diluted). Returns the batch and
        whether anything was scheduled (an empty schedule only costs host time).
        """
        e = self.e
        h = e.host
        self.calls += 1
        last = self.last
        if last is not None:
            last.host_interval_s = now - last.schedule_s
            if e._host_sig:
                self.observe(last, now)
            self.last = None
        sched = e.sched
        entries, cap = sched.schedule(now, e.policy)
        b = _Iteration(entries, now, cap)
        tnow = now + h.schedule_base_s + h.schedule_per_req_s * (len(sched.running) + len(entries))
        if not entries:
            b.iteration = -1
            b.done_at = tnow
            self.t = tnow
            return b, False
        feats = scheduled_features(entries)
        tokens, sampled, pairs, kv, ptok, npf, nd = feats
        if e._time_scheduled is not None:  # a device model that sees every chunk
            dt, util = e._time_scheduled(entries, feats)
        else:
            dt, util = e._device_time(tokens, sampled, pairs, kv)
        # input preparation (HostCosts.prep_s), added term by term to the clock
        issue = tnow + h.prep_base_s + h.prep_per_req_s * len(entries) + h.prep_per_token_s * tokens
        launch = e._launch(tokens, npf)
        dev_free = self.dev_free
        start = issue if issue > dev_free else dev_free
        end = start + dt
        if end < issue + launch:
            util *= dt / (issue + launch - start)
            end = issue + launch
        self.dev_free = end
        span = end - start
        energy = span * e._power(util) * e.dm.tp
        self.busy_e += energy
        self.busy_t += span
        b.iteration = self.it
        self.it += 1
        b.issue_s, b.device_start_s, b.device_end_s, b.done_at = issue, start, end, end
        b.device_time_s, b.energy_j = span, energy
        b.prefill_tokens, b.num_prefills, b.num_decodes = ptok, npf, nd
        b.guarded = cap is not None and nd > 0 and ptok > 0
        self.rows.append(b)
        self.last = b
        self.t = issue + launch + h.sample_launch_s
        return b, True

    def update(self, b: _Iteration) -> None:
        """``Scheduler.update_from_output`` of ``b``: emit its sampled tokens and finish completed requests."""
        e = self.e
        h = e.host
        n = len(b.entries)
        # the runner's bookkeeping after the sampler, then update_from_output; the outputs go to the frontend
        tend = self.t + h.bookkeeping_base_s + h.bookkeeping_per_req_s * n + h.update_base_s + h.update_per_req_s * n
        if self.fe is None:
            emit = tend + h.frontend_output_s
        else:  # the API server's output handler takes this output after the requests sent before it
            self.frontend_until(tend)
            ntok = sum(1 for r, _k, _c, _dec, smp in b.entries if smp and r.status != FINISHED)
            emit = self.fe.output(tend, ntok) if ntok else tend
        asy = e.async_
        for r, _k, _c, _dec, smp in b.entries:
            if r.status == FINISHED or not smp:
                continue
            if asy:
                r.ph -= 1
            r.out += 1
            r.times.append(emit)
            if r.out >= r.M:
                e.sched.finish(r)
                self.unfinished -= 1
                if self.sent is not None:
                    self.free_slot(emit)
                if self.progress is not None:
                    self.progress(self.n - self.unfinished, self.n)
        self.t = tend + h.engine_loop_s  # _process_engine_step's output put and _process_input_queue
        if b.iteration >= 0:
            b.processed = True
            if not e._host_sig:
                self.observe(b, tend)

    def free_slot(self, now: float) -> None:
        """Closed loop: a request's last token reached the client at ``now`` (s); its slot goes to the next
        request in order, sent at ``max(its release, now)`` and visible ``ingest_s`` later."""
        j = self.next_send
        if j < self.n:
            sent = self.release[j] if self.release[j] > now else now
            self.sent[j] = sent
            self.reqs[j].arrival = sent  # the client's send time: TTFT counts from it
            if self.fe is None:
                self.vis[j] = sent + self.e.host.ingest_s
            self.next_send = j + 1

    # ------------------------------------------------------------------ loops
    def wait_for_next_arrival(self) -> None:
        """Nothing can be scheduled until the next arrival; without one the engine is stuck (KV cache too small).

        A closed loop's unsent request (visible at infinity) is no arrival: only a finish would send it.
        """
        if self.next_arrival < self.n and self.next_visible() != _INF:
            self.t = max(self.t, self.vis[self.next_arrival])
        elif self.unfinished > 0:
            raise RuntimeError("engine cannot schedule any request (KV cache too small?)")

    def sync_step(self) -> None:
        """``EngineCore.step``: schedule, execute, block on the result, update."""
        if not self.e.sched.has_requests():
            return
        b, executed = self.schedule(self.t)
        if executed:
            self.t = max(self.t, b.device_end_s)
        else:
            self.wait_for_next_arrival()
        self.update(b)

    def async_step(self, queue: deque) -> None:
        """``EngineCore.step_with_batch_queue`` with a queue of depth 2 and early return."""
        if self.e.sched.has_requests():
            b, executed = self.schedule(self.t)
            queue.appendleft(b)
            if executed and len(queue) < 2 and queue[-1].done_at > self.t:
                return  # early return: schedule again while the oldest batch runs
            if not executed and len(queue) == 1 and queue[-1] is b:
                queue.pop()  # nothing in flight and nothing schedulable: wait for the next arrival
                self.update(b)
                self.wait_for_next_arrival()
                return
        elif not queue:
            return
        ob = queue.pop()
        if ob.done_at > self.t:
            self.t = ob.done_at
        self.update(ob)

    def loop(self) -> None:
        """Engine steps until every request has finished."""
        e = self.e
        sched = e.sched
        queue: deque[_Iteration] = deque()
        step = self.async_step if e.async_ else None
        steps = 0
        while self.unfinished > 0:
            steps += 1
            if steps > e.max_steps:
                raise RuntimeError(f"simulation exceeded {e.max_steps} engine steps without finishing")
            if not sched.has_requests() and not queue:  # idle: block until the next arrival
                if self.next_arrival >= self.n:
                    raise RuntimeError("engine idle with unfinished requests (internal error)")
                if self.next_visible() > self.t:
                    self.t = self.vis[self.next_arrival]
            a = self.next_arrival
            if a < self.n and (self.vis[a] <= self.t or (self.fe is not None and self.fe_next == a)):
                self.admit()  # an arrival is due, or one the API server has not taken yet may be
            if step is None:
                self.sync_step()
            else:
                step(queue)


_FRAME_FIELDS = ("iteration", "schedule_s", "prefill_tokens", "num_prefills", "num_decodes", "cap", "cap_after",
                 "guarded", "observed_interval_s", "host_interval_s", "device_time_s", "issue_s", "device_start_s",
                 "device_end_s", "energy_j")


#: dtype of every ``ITERATION_COLUMNS`` column but the caps and the signal
_FRAME_DTYPES = (("iteration", np.int64), ("schedule_s", float), ("prefill_tokens", np.int64),
                 ("num_prefills", np.int64), ("num_decodes", np.int64), ("guarded", bool),
                 ("observed_interval_s", float), ("host_interval_s", float), ("device_time_s", float),
                 ("issue_s", float), ("device_start_s", float), ("device_end_s", float), ("energy_j", float))


def iteration_frame(columns, cap, cap_after, signal: str) -> pd.DataFrame:
    """The ``ITERATION_COLUMNS`` frame of one run, from its columns (both paths build it here).

    Args:
        columns: a sequence of values per ``_FRAME_DTYPES`` name (``host_interval_s`` NaN where unknown).
        cap, cap_after: the two cap columns as nullable ``Int64`` arrays (missing: no cap).
        signal: the policy's signal, repeated on every row.
    """
    data = {name: np.asarray(columns[name], dtype=dtype) for name, dtype in _FRAME_DTYPES}
    data["cap"], data["cap_after"] = cap, cap_after
    data["signal"] = pd.array([signal] * len(data["iteration"]), dtype="string")
    return pd.DataFrame(data)[list(ITERATION_COLUMNS)]


def _iteration_frame(rows: list[_Iteration], signal: str) -> pd.DataFrame:
    """The ``ITERATION_COLUMNS`` frame of the executed iterations, in execution order."""
    cols = dict(zip(_FRAME_FIELDS, zip(*map(attrgetter(*_FRAME_FIELDS), rows)) if rows else [()] * 15))

    def caps(name: str):
        return pd.array([None if v is None else int(v) for v in cols[name]], dtype="Int64")

    cols["host_interval_s"] = [_NAN if v is None else v for v in cols["host_interval_s"]]
    return iteration_frame(cols, caps("cap"), caps("cap_after"), signal)


def check_engine_args(policy, scheduling: str, **limits: int) -> None:
    """The engine arguments every engine loop shares: ``scheduling`` is sync or async, every limit is positive and
    the policy's signal is known.

    Raises:
        ValueError: naming the field.
    """
    if scheduling not in ("sync", "async"):
        raise ValueError(f"field scheduling: expected 'sync' or 'async', got {scheduling!r}")
    for nm, v in limits.items():
        if v <= 0:
            raise ValueError(f"field {nm}: must be positive, got {v}")
    if policy.signal not in ctl.SIGNALS:
        raise ValueError(f"policy signal {policy.signal!r} unknown; expected one of {ctl.SIGNALS}")


class SimEngine:
    """One serving engine instance (model x GPU x TP) driven by a request list.

    Args:
        device: ``dlfp.devices.roofline.DeviceModel`` of the configuration.
        policy: a ``dlfp.policies.base.Policy``.
        scheduling: ``"sync"`` or ``"async"``.
        num_gpu_blocks: KV-cache blocks (see ``dlfp.devices.roofline.kv_cache_blocks``).
        host: host costs (``HostCosts``).
        prefix_caching: a preempted request hits its own blocks still cached when it resumes
            (``dlfp.backends.sim.scheduler``); off by default, as a caller with a real KV pool needs.
        enforce_eager: no CUDA graphs, every batch's kernels launched one by one (``HostCosts.launch_rule``).
        frontend: the API server's costs (``dlfp.devices.frontend``); ``None`` or all zero: no API server, a request
            reaches the engine ``host.ingest_s`` after it is sent and a token the client ``host.frontend_output_s``
            after its output is processed.

    Raises:
        ValueError: bad scheduling mode, non-positive limits or an unknown policy signal.
    """

    def __init__(self, device: DeviceModel, policy, *, scheduling: str = "async", max_num_batched_tokens: int = 8192,
                 max_num_seqs: int = 256, block_size: int = 16, num_gpu_blocks: int, max_model_len: int = 40960,
                 host: HostCosts | None = None, max_steps: int = 50_000_000, prefix_caching: bool = False,
                 enforce_eager: bool = False, frontend: FrontendCosts | None = None):
        check_engine_args(policy, scheduling, max_num_batched_tokens=max_num_batched_tokens,
                          max_num_seqs=max_num_seqs, block_size=block_size, num_gpu_blocks=num_gpu_blocks)
        self.dm = device
        self.policy = policy
        self.async_ = scheduling == "async"
        self.host = host or HostCosts()
        self.sched = Scheduler(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                               block_size=block_size, num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len,
                               async_scheduling=self.async_, prefix_caching=prefix_caching)
        self.max_steps = max_steps
        self._decisions = getattr(policy, "decisions", None)
        self._wants_context = bool(getattr(policy, "wants_context", False))
        self._host_sig = policy.signal == "host_cadence"
        self._device_time = device.time
        self._time_scheduled = getattr(device, "time_scheduled", None)
        self._power = device.power_w
        self._launch = self.host.launch_rule(device.model.num_hidden_layers, device.a.kernels_per_layer,
                                             enforce_eager)
        self.frontend_costs = frontend if frontend is not None and frontend.enabled else None

    def frontend(self) -> FrontEnd | None:
        """A fresh API-server queue for one run, or ``None`` without one."""
        if self.frontend_costs is None:
            return None
        return FrontEnd(self.frontend_costs, self.host.ingest_s, self.host.frontend_output_s)

    def run(self, requests: Sequence, progress: Callable[[int, int], None] | None = None,
            concurrency: int | None = None, core: str | None = None) -> SimResult:
        """Simulate ``requests`` (objects with ``request_id``, ``arrival_s``, ``prompt_tokens``,
        ``output_tokens``; sorted by arrival) until all finish.

        ``concurrency`` (a positive int) runs them as a closed loop of that many clients (module docstring), their
        ``arrival_s`` being release times; ``None`` (default) sends each at its ``arrival_s`` (open loop).
        ``core``: ``"compiled"`` (``dlfp.backends.sim.compiled``; a run it does not cover takes the reference path
        and says so once) or ``"reference"`` (this module); default: ``DLFP_SIM_CORE``, else compiled. Both give
        the same result bit for bit.

        Raises:
            ValueError: ``concurrency`` is not positive, or an unknown ``core``.
            RuntimeError: the engine cannot make progress (a configuration error upstream).
        """
        if concurrency is not None and concurrency <= 0:
            raise ValueError(f"field workload.concurrency: must be positive, got {concurrency}")
        from dlfp.backends.sim import compiled

        if core is None:
            core = compiled.requested_core()
        elif core not in compiled.CORES:
            raise ValueError(f"core: unknown {core!r}; known: {', '.join(compiled.CORES)}")
        if core == "compiled":
            why = compiled.unsupported(self)
            if why is None:
                return compiled.run(self, requests, progress, concurrency)
            compiled.notice_once(why)
        reqs = [SimRequest(i, r.request_id, float(r.arrival_s), int(r.prompt_tokens), int(r.output_tokens))
                for i, r in enumerate(requests)]
        run = _Run(self, reqs, progress, concurrency)
        run.loop()
        dm, tp = self.dm, self.dm.tp
        end_s = max((r.times[-1] for r in reqs if r.times), default=run.t)
        energy = run.busy_e + max(0.0, end_s - run.busy_t) * dm.idle_w * tp
        finished = np.array([r.status == FINISHED for r in reqs], dtype=bool)
        return SimResult(token_times=[r.times for r in reqs], finished=finished,
                         iterations=_iteration_frame(run.rows, self.policy.signal), energy_j=energy,
                         busy_energy_j=run.busy_e, end_s=end_s, num_preemptions=self.sched.num_preemptions,
                         num_gpu_blocks=self.sched.num_gpu_blocks, num_schedule_calls=run.calls, sent=run.sent,
                         extra={"num_cached_tokens_hit": self.sched.num_cached_tokens_hit})
