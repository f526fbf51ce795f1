"""vLLM 0.17.1's two engine loops on real clocks, around a real forward pass.

The scheduler and the policies are the simulator's, unchanged (``dlfp.backends.sim.scheduler.Scheduler``, the
policy objects of ``dlfp.policies``); what differs from ``dlfp.backends.sim.engine`` is that nothing is modelled:
the host clock is the wall clock, each scheduled batch runs ``Qwen3.forward`` on a device (``CudaDevice`` or the
CPU's ``ThreadDevice``), and the device's start and end come from that device's own clock.

Loops (``vllm/v1/engine/core.py``), as in the simulator:

* ``sync`` = ``EngineCore.step``: schedule, launch, block on the output, update.
* ``async`` = ``EngineCore.step_with_batch_queue``, queue depth 2: schedule and launch; if the oldest batch in the
  queue has not finished and the queue is not full, return and schedule the next batch at once (its decode inputs
  are read on the device from the output buffer the previous batch's sampler writes); otherwise block on the
  oldest batch and update from its output.

Requests become visible at their arrival time on the trial clock (open loop, no front end). Signals: the policy
sees ``host_cadence`` (time from one scheduler call to the next) at the next call and ``device_completion`` (the
device's own time of the batch) when the batch's output has been processed, as in the simulator. A token's time is
when the host has its id (the end of the wait on its batch's output copy).

Per iteration the host records the scheduler call (``schedule_s``), the launch (``issue_s``: the forward handed
to the device; ``launched_s``: all its kernels enqueued) and the output seen (``seen_s``); the device its start and
end. Times are seconds from the trial start.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd
import torch

from dlfp.backends.sim.engine import _Iteration, _iteration_frame, check_engine_args
from dlfp.backends.sim.scheduler import FINISHED, Scheduler, SimRequest
from dlfp.backends.torch.model import Entry, KVPool, Qwen3
from dlfp.devices.batch import chunk_pairs, scheduled_features
from dlfp.policies import base as ctl

_NAN = float("nan")


class _TorchIteration(_Iteration):
    """The simulator's iteration record plus what a real run adds: the launch handle, the batch's chunks and
    decode context, and the host times of the launch's end and of the output seen."""

    __slots__ = ("_launch", "_chunks", "_decode_context", "_launched_s", "_seen_s")


@dataclass
class TorchResult:
    """One engine run: per request (in input order) its token times (s) and ids, and the iteration log.

    ``batches`` holds per executed iteration (same order as ``iterations``) the prefill chunks as
    ``[new_tokens, computed_before]`` pairs, the decodes' summed context, ``launched_s`` and ``seen_s``.
    """

    token_times: list[list[float]]
    token_ids: list[list[int]]
    finished: np.ndarray
    iterations: pd.DataFrame
    batches: dict
    num_preemptions: int
    num_schedule_calls: int
    end_s: float
    extra: dict = field(default_factory=dict)


class TorchEngine:
    """One engine over a real model (see module docstring).

    Args:
        model: the ``Qwen3`` to run.
        device: ``CudaDevice`` or ``ThreadDevice``.
        policy: a ``dlfp.policies.base.Policy``.
        scheduling: ``"sync"`` or ``"async"``.
        num_gpu_blocks: KV blocks the scheduler may hand out (``block_size`` tokens each).
        clock, sleep: the host clock (s) and sleep (s); injectable for tests.
        max_seconds: wall-clock limit of one run (s).

    Raises:
        ValueError: a bad scheduling mode, non-positive limits or an unknown policy signal.
    """

    def __init__(self, model: Qwen3, device, policy, *, scheduling: str, max_num_batched_tokens: int,
                 max_num_seqs: int, block_size: int, num_gpu_blocks: int, max_model_len: int,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                 max_seconds: float = 3600.0):
        check_engine_args(policy, scheduling, max_num_batched_tokens=max_num_batched_tokens,
                          max_num_seqs=max_num_seqs, block_size=block_size, num_gpu_blocks=num_gpu_blocks)
        self.model, self.device, self.policy = model, device, policy
        self.async_ = scheduling == "async"
        self.sched = Scheduler(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                               block_size=block_size, num_gpu_blocks=num_gpu_blocks, max_model_len=max_model_len,
                               async_scheduling=self.async_)
        self.max_num_seqs = max_num_seqs
        self.clock, self.sleep, self.max_seconds = clock, sleep, max_seconds
        self._host_sig = policy.signal == "host_cadence"
        self._wants_context = bool(getattr(policy, "wants_context", False))
        self._decisions = getattr(policy, "decisions", None)

    # ------------------------------------------------------------------ one run
    def run(self, requests: Sequence, progress: Callable[[int, int], None] | None = None) -> TorchResult:
        """Serve ``requests`` (``RequestSpec``-like: ``request_id``, ``arrival_s``, ``prompt_token_ids``,
        ``output_tokens``; sorted by arrival) until every one has finished.

        Raises:
            RuntimeError: the engine cannot make progress (KV cache too small) or the run exceeds
                ``max_seconds``.
        """
        m = self.model
        cuda = m.device.type == "cuda"
        self.reqs = [SimRequest(i, r.request_id, float(r.arrival_s), int(len(r.prompt_token_ids)),
                                int(r.output_tokens)) for i, r in enumerate(requests)]
        prompts = [torch.tensor(np.asarray(r.prompt_token_ids, dtype=np.int64)) for r in requests]
        self.prompts = [p.pin_memory() for p in prompts] if cuda else prompts
        self.ids: list[list[int]] = [[] for _ in self.reqs]
        self.slot: dict[int, int] = {}
        self.base: dict[int, int] = {}
        self.pool = KVPool(m.kv.shape[2])
        self.free_slots = list(range(self.max_num_seqs - 1, -1, -1))
        self.progress = progress
        self.n = self.unfinished = len(self.reqs)
        self.next_arrival = 0
        self.it = self.calls = 0
        self.rows: list[_TorchIteration] = []
        self.last: _Iteration | None = None
        self.t0 = self.clock()
        self.device.start(self.t0)
        try:
            self._loop()
        finally:
            self.device.close()
        end_s = max((r.times[-1] for r in self.reqs if r.times), default=self.now())
        keys = ("chunks", "decode_context", "launched_s", "seen_s")
        batches = {k: [getattr(b, "_" + k) for b in self.rows] for k in keys}
        return TorchResult(token_times=[r.times for r in self.reqs], token_ids=self.ids,
                           finished=np.array([r.status == FINISHED for r in self.reqs], dtype=bool),
                           iterations=_iteration_frame(self.rows, self.policy.signal), batches=batches,
                           num_preemptions=self.sched.num_preemptions, num_schedule_calls=self.calls, end_s=end_s)

    def now(self) -> float:
        """Seconds since the trial start."""
        return self.clock() - self.t0

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        sched = self.sched
        queue: deque[_Iteration] = deque()
        while self.unfinished > 0:
            t = self.now()
            if t > self.max_seconds:
                raise RuntimeError(f"torch engine: run exceeded {self.max_seconds:.0f} s without finishing")
            self._admit(t)
            if not sched.has_requests() and not queue:
                self._wait_for_next_arrival()
                continue
            if not self.async_:
                b = self._schedule(self.now())
                if b is None:
                    self._wait_for_next_arrival()
                else:
                    self._update(b)
                continue
            # EngineCore.step_with_batch_queue, depth 2
            if sched.has_requests():
                b = self._schedule(self.now())
                if b is not None:
                    queue.appendleft(b)
                    if len(queue) < 2 and not queue[-1]._launch.done():
                        continue  # early return: schedule the next batch while the oldest runs
                elif not queue:
                    self._wait_for_next_arrival()
                    continue
            if queue:
                self._update(queue.pop())

    def _admit(self, t: float) -> None:
        """``_process_input_queue``: every request that has arrived by ``t`` joins the waiting queue."""
        reqs, a = self.reqs, self.next_arrival
        while a < self.n and reqs[a].arrival <= t:
            self.sched.waiting.append(reqs[a])
            a += 1
        self.next_arrival = a

    def _wait_for_next_arrival(self) -> None:
        """Sleep until the next arrival; without one, the engine is stuck."""
        if self.next_arrival < self.n:
            dt = self.reqs[self.next_arrival].arrival - self.now()
            if dt > 0:
                self.sleep(dt)
        elif self.unfinished > 0:
            raise RuntimeError("torch engine cannot schedule any request (KV cache too small?)")

    # ------------------------------------------------------------------ the two halves of a step
    def _schedule(self, now: float) -> _Iteration | None:
        """``Scheduler.schedule`` at ``now`` and the launch of the batch; ``None`` when nothing was scheduled."""
        self.calls += 1
        last = self.last
        if last is not None:
            last.host_interval_s = now - last.schedule_s
            if self._host_sig:
                self._observe(last, now)
            self.last = None
        entries, cap = self.sched.schedule(now, self.policy)
        if not entries:
            return None
        batch = [self._entry(r, n, c, smp, dec) for r, n, c, dec, smp in entries]
        tokens, _sampled, _pairs, _kv, ptok, npf, nd = scheduled_features(entries)
        b = _TorchIteration(entries, now, cap)
        b.iteration = self.it
        self.it += 1
        b.prefill_tokens, b.num_prefills, b.num_decodes = ptok, npf, nd
        b.guarded = cap is not None and nd > 0 and ptok > 0
        b._chunks = [[int(n), int(c)] for _r, n, c, dec, _s in entries if not dec]
        b._decode_context = int(sum(c for _r, _n, c, dec, _s in entries if dec))
        model = self.model
        b.issue_s = self.now()
        b._launch = self.device.launch(lambda: model.forward(batch))
        b._launched_s = self.now()
        b.energy_j = _NAN
        self.rows.append(b)
        self.last = b
        return b

    def _entry(self, r: SimRequest, n: int, c: int, samples: bool, decode: bool) -> Entry:
        """The model's view of one scheduled request; a KV range and an output slot on its first chunk."""
        i = r.idx
        if i not in self.base:
            if not self.free_slots:
                raise RuntimeError("torch engine: more running requests than max_num_seqs output slots")
            self.slot[i] = self.free_slots.pop()
            self.base[i] = self.pool.alloc(r.P + r.M)
        return Entry(self.slot[i], self.prompts[i], c, n, samples, self.base[i], decode)

    def _update(self, b: _Iteration) -> None:
        """Block on ``b``'s output, then ``update_from_output``: emit its tokens and finish completed requests."""
        ids = b._launch.wait().tolist()
        seen = self.now()
        b.device_start_s, b.device_end_s = b._launch.device_times()
        b.device_time_s = b.device_end_s - b.device_start_s
        b._seen_s = b.done_at = seen
        b._launch = None
        j = 0
        for r, _n, _c, _dec, smp in b.entries:
            if not smp:
                continue
            tok = ids[j]
            j += 1
            if r.status == FINISHED:
                continue
            if self.async_:
                r.ph -= 1
            r.out += 1
            r.times.append(seen)
            self.ids[r.idx].append(int(tok))
            if r.out >= r.M:
                self.sched.finish(r)
                self.free_slots.append(self.slot.pop(r.idx))
                self.pool.release(self.base.pop(r.idx), r.P + r.M)
                self.unfinished -= 1
                if self.progress is not None:
                    self.progress(self.n - self.unfinished, self.n)
        b.processed = True
        if not self._host_sig:
            self._observe(b, seen)

    def _observe(self, b: _Iteration, now: float) -> None:
        """Feed ``b``'s observation to the policy at ``now``; record the interval and cap it used."""
        pol = self.policy
        obs = ctl.Observation(iteration=b.iteration, time_s=now, prefill_tokens=b.prefill_tokens,
                              num_decodes=b.num_decodes, cap=b.cap, host_interval_s=b.host_interval_s,
                              device_time_s=b.device_time_s if b.processed else None)
        if self._wants_context:
            obs.prefill_pairs = float(sum(chunk_pairs(k, c) for k, c in b._chunks))
            obs.decode_context_tokens = b._decode_context
        decs = self._decisions
        nd = len(decs) if decs is not None else 0
        pol.observe(obs)
        iv = b.host_interval_s if self._host_sig else obs.device_time_s
        b.observed_interval_s = _NAN if iv is None else iv
        b.cap_after = decs[-1].cap_after if decs is not None and len(decs) > nd else getattr(pol, "cap", None)


__all__ = ["TorchEngine", "TorchResult"]
