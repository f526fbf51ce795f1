"""Discrete-event engine: vLLM 0.17.1's EngineCore loops with separate host and device timelines.

Two clocks run side by side:

* the HOST timeline (the EngineCore thread): process the input queue,
  ``schedule()``, prepare inputs, launch kernels, wait, ``update_from_output``;
* the DEVICE timeline: batches run one after another in issue order; a batch
  starts at ``max(issue, previous batch's end)`` and lasts the cost model's time
  (but cannot end before the host has launched its last kernel).

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
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from dlfp.policies import base as ctl
from dlfp.devices.roofline import DeviceModel
from dlfp.traces.format import ITERATION_COLUMNS
from dlfp.devices.host import HostCosts
from dlfp.backends.sim.scheduler import FINISHED, Scheduler, SimRequest


class _Batch:
    __slots__ = ("it", "entries", "sched_s", "issue_s", "dev_start", "dev_end", "done_at", "cap", "ptok",
                 "nprefill", "ndec", "energy", "host_interval", "processed", "row")

    def __init__(self):
        self.processed = False
        self.host_interval = None


@dataclass
class SimResult:
    """Output of one engine run.

    ``token_times[i]`` lists emission times (s) of request ``i``'s tokens;
    ``iterations`` follows ``dlfp.traces.format.ITERATION_COLUMNS``.
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


class SimEngine:
    """One serving engine instance (model x GPU x TP) driven by a request list.

    Args:
        device: ``cost_model.DeviceModel`` of the configuration.
        policy: a ``dlfp.policies.base.Policy``.
        scheduling: ``"sync"`` or ``"async"``.
        num_gpu_blocks: KV-cache blocks (see ``cost_model.kv_cache_blocks``).
        host: host costs (``HostCosts``).

    Raises:
        ValueError: bad scheduling mode or non-positive limits.
    """

    def __init__(self, device: DeviceModel, policy, *, scheduling: str = "async", max_num_batched_tokens: int = 8192,
                 max_num_seqs: int = 256, block_size: int = 16, num_gpu_blocks: int, max_model_len: int = 40960,
                 host: HostCosts | None = None, max_steps: int = 50_000_000):
        if scheduling not in ("sync", "async"):
            raise ValueError(f"field scheduling: expected 'sync' or 'async', got {scheduling!r}")
        for nm, v in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs),
                      ("block_size", block_size), ("num_gpu_blocks", num_gpu_blocks)):
            if v <= 0:
                raise ValueError(f"field {nm}: must be positive, got {v}")
        self.dm = device
        self.policy = policy
        self.async_ = scheduling == "async"
        self.host = host or HostCosts()
        self.sched = Scheduler(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                               block_size=block_size, num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len,
                               async_scheduling=self.async_)
        self.max_steps = max_steps
        self._decisions = getattr(policy, "decisions", None)
        self._host_sig = policy.signal == "host_cadence"
        if policy.signal not in ctl.SIGNALS:
            raise ValueError(f"policy signal {policy.signal!r} unknown; expected one of {ctl.SIGNALS}")
        L = device.model.num_hidden_layers
        h = self.host
        self._launch_piecewise = h.launch_piecewise_per_layer_s * L
        self._launch_eager = h.launch_eager_per_kernel_s * L * device.a.kernels_per_layer

    # ------------------------------------------------------------------ observation
    def _observe(self, b: _Batch, now: float) -> None:
        pol = self.policy
        obs = ctl.Observation(iteration=b.it, time_s=now, prefill_tokens=b.ptok, num_decodes=b.ndec, cap=b.cap,
                              host_interval_s=b.host_interval,
                              device_time_s=(b.dev_end - b.dev_start) if b.processed else None)
        decs = self._decisions
        nd = len(decs) if decs is not None else 0
        pol.observe(obs)
        row = b.row
        iv = b.host_interval if self._host_sig else obs.device_time_s
        row[7] = float("nan") if iv is None else iv
        if decs is not None and len(decs) > nd:
            row[6] = decs[-1].cap_after
        else:
            row[6] = getattr(pol, "cap", None)

    # ------------------------------------------------------------------ run
    def run(self, requests: Sequence, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Simulate ``requests`` (objects with ``request_id``, ``arrival_s``, ``prompt_tokens``,
        ``output_tokens``; sorted by arrival) until all finish.

        Raises:
            RuntimeError: the engine cannot make progress (a configuration error upstream).
        """
        reqs = [SimRequest(i, r.request_id, float(r.arrival_s), int(r.prompt_tokens), int(r.output_tokens))
                for i, r in enumerate(requests)]
        n = len(reqs)
        h, dm, sched, pol = self.host, self.dm, self.sched, self.policy
        asy = self.async_
        signal = pol.signal
        host_sig = signal == "host_cadence"
        vis = [r.arrival + h.ingest_s for r in reqs]
        tp = dm.tp
        rows: list[list] = []  # per executed iteration: see _COLS below
        t = 0.0
        dev_free = 0.0
        a = 0
        unfinished = n
        queue: deque[_Batch] = deque()
        last: _Batch | None = None  # last executed batch whose host interval is unknown
        it = 0
        calls = 0
        busy_e = 0.0
        busy_t = 0.0
        gmax = h.cudagraph_max_tokens
        steps = 0
        sb, spr = h.schedule_base_s, h.schedule_per_req_s
        pb, ppr, ptk = h.prep_base_s, h.prep_per_req_s, h.prep_per_token_s
        lg, lpw, leg, sl = h.launch_graph_s, self._launch_piecewise, self._launch_eager, h.sample_launch_s
        ub, upr, fo = h.update_base_s, h.update_per_req_s, h.frontend_output_s
        dm_time, power = dm.time, dm.power_w
        observe = self._observe
        nan = float("nan")

        def schedule(now: float):
            nonlocal last, it, calls, t, dev_free, busy_e, busy_t
            calls += 1
            if last is not None:
                last.host_interval = now - last.sched_s
                last.row[10] = last.host_interval
                if host_sig:
                    observe(last, now)
                last = None
            entries, cap = sched.schedule(now, pol)
            b = _Batch()
            b.entries = entries
            b.sched_s = now
            b.cap = cap
            tnow = now + sb + spr * (len(sched.running) + len(entries))
            if not entries:
                b.it = -1
                b.done_at = tnow
                t = tnow
                return b, False
            tokens = 0
            ptok = 0
            npf = 0
            nd = 0
            sampled = 0
            pairs = 0.0
            kv = 0.0
            for r, k, c, dec, smp in entries:
                tokens += k
                if smp:
                    sampled += 1
                if dec:
                    nd += 1
                    pairs += c + 1
                    kv += c
                else:
                    npf += 1
                    ptok += k
                    pairs += k * c + k * (k + 1) * 0.5
                    kv += c
            dt, util = dm_time(tokens, sampled, pairs, kv)
            issue = tnow + pb + ppr * len(entries) + ptk * tokens
            if npf == 0 and tokens <= gmax:
                launch = lg
            elif tokens <= gmax:
                launch = lpw
            else:
                launch = leg
            start = issue if issue > dev_free else dev_free
            end = start + dt
            if end < issue + launch:
                util *= dt / (issue + launch - start)
                end = issue + launch
            dev_free = end
            span = end - start
            energy = span * power(util) * tp
            busy_e += energy
            busy_t += span
            b.it = it
            it += 1
            b.issue_s, b.dev_start, b.dev_end, b.done_at = issue, start, end, end
            b.ptok, b.nprefill, b.ndec = ptok, npf, nd
            guarded = cap is not None and nd > 0 and ptok > 0
            # iteration, schedule_s, prefill_tokens, num_prefills, num_decodes, cap, cap_after, observed, guarded,
            # (9) device_time, (10) host_interval, issue, dev_start, dev_end, energy
            row = [b.it, now, ptok, npf, nd, cap, None, nan, guarded, span, nan,
                   issue, start, end, energy]
            b.row = row
            rows.append(row)
            last = b
            t = issue + launch + sl
            return b, True

        def update(b: _Batch):
            nonlocal t, unfinished
            tend = t + ub + upr * len(b.entries)
            emit = tend + fo
            for r, k, c, dec, smp in b.entries:
                if r.status == FINISHED or not smp:
                    continue
                if asy:
                    r.ph -= 1
                r.out += 1
                r.times.append(emit)
                if r.out >= r.M:
                    sched.finish(r)
                    unfinished -= 1
                    if progress is not None:
                        progress(n - unfinished, n)
            t = tend
            if b.it >= 0:
                b.processed = True
                if not host_sig:
                    observe(b, tend)

        while unfinished > 0:
            steps += 1
            if steps > self.max_steps:
                raise RuntimeError(f"simulation exceeded {self.max_steps} engine steps without finishing")
            # _process_input_queue: block when idle, then drain arrivals
            if not sched.has_requests() and not queue:
                if a >= n:
                    raise RuntimeError("engine idle with unfinished requests (internal error)")
                if vis[a] > t:
                    t = vis[a]
            while a < n and vis[a] <= t:
                sched.waiting.append(reqs[a])
                a += 1
            if not asy:
                if not sched.has_requests():
                    continue
                b, executed = schedule(t)
                if executed:
                    t = max(t, b.dev_end)
                elif a < n:
                    t = max(t, vis[a])  # nothing schedulable until the next arrival
                else:
                    raise RuntimeError("engine cannot schedule any request (KV cache too small?)")
                update(b)
                continue
            # async: step_with_batch_queue
            if sched.has_requests():
                b, executed = schedule(t)
                queue.appendleft(b)
                if executed and len(queue) < 2 and queue[-1].done_at > t:
                    continue
                if not executed and len(queue) == 1 and queue[-1] is b:
                    # nothing in flight and nothing schedulable: wait for the next arrival
                    queue.pop()
                    update(b)
                    if a < n:
                        t = max(t, vis[a])
                    elif unfinished > 0:
                        raise RuntimeError("engine cannot schedule any request (KV cache too small?)")
                    continue
            elif not queue:
                continue
            ob = queue.pop()
            if ob.done_at > t:
                t = ob.done_at
            update(ob)

        end_s = max((r.times[-1] for r in reqs if r.times), default=t)
        idle_t = max(0.0, end_s - busy_t)
        energy = busy_e + idle_t * dm.idle_w * tp
        cols = list(ITERATION_COLUMNS)
        if rows:
            arr = list(zip(*rows))
        else:
            arr = [[] for _ in range(15)]
        cap_in = pd.array([None if v is None else int(v) for v in arr[5]], dtype="Int64")
        cap_after = pd.array([None if v is None else int(v) for v in arr[6]], dtype="Int64")
        it_df = pd.DataFrame({
            "iteration": np.asarray(arr[0], dtype=np.int64),
            "schedule_s": np.asarray(arr[1], dtype=float),
            "prefill_tokens": np.asarray(arr[2], dtype=np.int64),
            "num_prefills": np.asarray(arr[3], dtype=np.int64),
            "num_decodes": np.asarray(arr[4], dtype=np.int64),
            "cap": cap_in,
            "cap_after": cap_after,
            "guarded": np.asarray(arr[8], dtype=bool),
            "signal": pd.array([signal] * len(rows), dtype="string"),
            "observed_interval_s": np.asarray(arr[7], dtype=float),
            "host_interval_s": np.asarray(arr[10], dtype=float),
            "device_time_s": np.asarray(arr[9], dtype=float),
            "issue_s": np.asarray(arr[11], dtype=float),
            "device_start_s": np.asarray(arr[12], dtype=float),
            "device_end_s": np.asarray(arr[13], dtype=float),
            "energy_j": np.asarray(arr[14], dtype=float),
        })[cols]
        finished = np.array([r.status == FINISHED for r in reqs], dtype=bool)
        return SimResult(token_times=[r.times for r in reqs], finished=finished, iterations=it_df, energy_j=energy,
                         busy_energy_j=busy_e, end_s=end_s, num_preemptions=sched.num_preemptions,
                         num_gpu_blocks=sched.num_gpu_blocks, num_schedule_calls=calls)
