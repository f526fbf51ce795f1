"""A vLLM 0.17.1 V1-style scheduler (``vllm/v1/core/sched/scheduler.py`` + ``async_scheduler.py``).

Decision order, as in ``Scheduler.schedule()``:

1. RUNNING requests in order (decodes and continuing prefill chunks):
   ``num_new = num_tokens + num_output_placeholders - num_computed`` limited by
   the token budget (and ``max_model_len - 1 - num_computed``); KV blocks
   allocated; when blocks run out, the LAST running request is preempted
   (recompute: its blocks are freed, ``num_computed = 0``, it goes to the head
   of the waiting queue) until the request fits or is itself preempted.
   Async only: a request is skipped when the step already in flight reaches
   ``max_tokens`` (``num_computed + 2 - placeholders >= prompt + max_tokens``).
2. WAITING requests first come, first served, only if nothing was preempted in
   this step, while ``len(running) < max_num_seqs`` and budget remains; a
   request whose first chunk's blocks do not fit stops the loop.

After scheduling, ``num_computed`` advances by the scheduled tokens; a request
that is not left mid-prefill samples one token. The async scheduler adds an
output placeholder for it, so it can be scheduled again for a decode before
that token is known (``AsyncScheduler._update_after_schedule``).

The DLFP hook (the only change to vLLM's order): before step 1 the policy is
asked ``prefill_cap(num_decoding, now_s=, oldest_waiting_s=)``, where
``num_decoding`` counts running requests in the decode phase and
``oldest_waiting_s`` is how long (seconds) the oldest request without a first
token (waiting-queue head or a running request mid-prefill) has waited, and
``oldest_remaining_tokens`` its prompt tokens still to prefill (both omitted
when there is none); a policy with ``wants_context`` also gets the step's
``ScheduleContext``. The cap limits the TOTAL prefill tokens
(continuing chunks and new requests) of the step; decodes never count against
it, so they are never starved.
"""
from __future__ import annotations

from collections import deque

from dlfp.policies.base import ScheduleContext

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3


class SimRequest:
    """Scheduler state of one request (token counts, KV blocks, emitted token times)."""

    __slots__ = ("idx", "rid", "arrival", "P", "M", "computed", "out", "ph", "blocks", "status",
                 "times", "preemptions")

    def __init__(self, idx: int, rid: str, arrival: float, prompt_tokens: int, max_tokens: int):
        self.idx, self.rid, self.arrival = idx, rid, arrival
        self.P, self.M = prompt_tokens, max_tokens
        self.computed = 0  # num_computed_tokens (includes placeholders' positions in async mode)
        self.out = 0  # output tokens known to the scheduler
        self.ph = 0  # num_output_placeholders (async)
        self.blocks = 0
        self.status = WAITING
        self.times: list[float] = []
        self.preemptions = 0

    @property
    def num_tokens(self) -> int:
        return self.P + self.out

    def in_decode(self) -> bool:
        """True when the request's next step is a decode (prompt and known outputs computed)."""
        return self.computed >= self.P and self.computed + 1 >= self.P + self.out + self.ph


class Scheduler:
    """Continuous-batching scheduler with a token budget, ``max_num_seqs`` and paged KV blocks.

    ``schedule(now, policy)`` returns ``(entries, cap, stats)`` where ``entries``
    is a list of ``(request, num_tokens, context_before, is_decode, samples)``.
    """

    def __init__(self, *, max_num_batched_tokens: int, max_num_seqs: int, block_size: int,
                 num_gpu_blocks: int, max_model_len: int, async_scheduling: bool):
        self.budget = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.bs = block_size
        self.free_blocks = num_gpu_blocks
        self.num_gpu_blocks = num_gpu_blocks
        self.max_model_len = max_model_len
        self.async_ = async_scheduling
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.num_preemptions = 0

    def has_requests(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def _need(self, r: SimRequest, n: int) -> int:
        return -(-(r.computed + n) // self.bs) - r.blocks

    def _preempt(self, r: SimRequest) -> None:
        self.free_blocks += r.blocks
        r.blocks = 0
        r.status = PREEMPTED
        r.computed = 0
        r.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(r)

    def schedule(self, now: float, policy) -> tuple[list[tuple], int | None]:
        """``Scheduler.schedule()``: running requests first (decodes and chunked prefills), then waiting ones.

        Returns ``(entries, cap)``: ``(request, new_tokens, computed_before, is_decode, sampled)`` per scheduled
        request, and the policy's prefill cap for this iteration (``None``: uncapped).
        """
        cap = self._prefill_cap(now, policy)
        pcap = cap if cap is not None else 1 << 62
        entries: list[tuple] = []
        budget, pcap, preempted = self._schedule_running(entries, self.budget, pcap)
        if not preempted:
            self._schedule_waiting(entries, budget, pcap)
        return self._update_after_schedule(entries), cap

    def _prefill_cap(self, now: float, policy) -> int | None:
        """Ask the policy for the cap, given the decodes running and the oldest request still without a token."""
        ndec = 0
        oldest = self.waiting[0] if self.waiting else None
        for r in self.running:  # inlined SimRequest.in_decode()
            c = r.computed
            if c >= r.P and c + 1 >= r.P + r.out + r.ph:
                ndec += 1
            elif r.out == 0 and (oldest is None or r.arrival < oldest.arrival):
                oldest = r  # mid-prefill, still without a first token
        kw = {"context": self._context()} if getattr(policy, "wants_context", False) else {}
        if oldest is None:
            return policy.prefill_cap(ndec, now_s=now, **kw)
        return policy.prefill_cap(ndec, now_s=now, oldest_waiting_s=now - oldest.arrival,
                                  oldest_remaining_tokens=max(0, oldest.P - oldest.computed), **kw)

    def _context(self) -> ScheduleContext:
        """The ``ScheduleContext`` of the next step: the KV context of the request its first prefill chunk
        continues (first running request mid-prompt, else the waiting head) and the decodes' summed context."""
        dctx = 0
        pctx = None
        for r in self.running:
            c = r.computed
            if c >= r.P and c + 1 >= r.P + r.out + r.ph:
                dctx += c
            elif pctx is None:
                pctx = c
        if pctx is None:
            pctx = self.waiting[0].computed if self.waiting else 0
        return ScheduleContext(pctx, dctx)

    def _schedule_running(self, entries: list, budget: int, pcap: int) -> tuple[int, int, bool]:
        """Running requests in order, within the token budget and the prefill cap; preempt from the back when
        KV blocks run out. Returns the budget and cap left and whether anything was preempted."""
        running = self.running
        preempted = False
        i = 0
        asy = self.async_
        while i < len(running) and budget > 0:
            r = running[i]
            if asy and r.ph > 0 and r.computed + 2 - r.ph >= r.P + r.M:
                i += 1
                continue
            n = r.P + r.out + r.ph - r.computed
            if n > budget:
                n = budget
            lim = self.max_model_len - 1 - r.computed
            if n > lim:
                n = lim
            c = r.computed
            dec = c >= r.P and c + 1 >= r.P + r.out + r.ph
            if not dec and n > pcap:
                n = pcap
            if n <= 0:
                i += 1
                continue
            need = self._need(r, n)
            ok = True
            while need > self.free_blocks:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is r:
                    ok = False
                    break
            if not ok:
                break
            self.free_blocks -= need
            r.blocks += need
            entries.append((r, n, r.computed, dec))
            budget -= n
            if not dec:
                pcap -= n
            i += 1
        return budget, pcap, preempted

    def _schedule_waiting(self, entries: list, budget: int, pcap: int) -> None:
        """Admit waiting requests (FCFS) while budget, cap, ``max_num_seqs`` and KV blocks allow."""
        waiting, running = self.waiting, self.running
        while waiting and budget > 0 and pcap > 0:
            if len(running) == self.max_num_seqs:
                break
            r = waiting[0]
            n = r.P + r.out - r.computed
            if n > budget:
                n = budget
            if n > pcap:
                n = pcap
            need = self._need(r, n)
            if need > self.free_blocks:
                break
            waiting.popleft()
            self.free_blocks -= need
            r.blocks += need
            r.status = RUNNING
            running.append(r)
            entries.append((r, n, r.computed, False))
            budget -= n
            pcap -= n

    def _update_after_schedule(self, entries: list) -> list[tuple]:
        """``_update_after_schedule`` (+ the AsyncScheduler's output placeholders): advance computed tokens and
        mark which entries sample a token."""
        out = []
        asy = self.async_
        for r, n, c, dec in entries:
            r.computed = c + n
            samples = r.computed >= r.P + r.out + r.ph
            if samples and asy:
                r.ph += 1
            out.append((r, n, c, dec, samples))
        return out

    def finish(self, r: SimRequest) -> None:
        """Free a finished request's blocks and drop it from the queues."""
        self.free_blocks += r.blocks
        r.blocks = 0
        if r.status == RUNNING:
            self.running.remove(r)
        elif r.status == PREEMPTED:
            self.waiting.remove(r)
        r.status = FINISHED
