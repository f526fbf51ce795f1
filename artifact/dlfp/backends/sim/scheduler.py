"""A vLLM 0.17.1 V1-style scheduler (``vllm/v1/core/sched/scheduler.py`` + ``async_scheduler.py``).

Decision order, as in ``Scheduler.schedule()``:

1. RUNNING requests in order (decodes and continuing prefill chunks):
   ``num_new = num_tokens + num_output_placeholders - num_computed`` limited by
   the token budget (and ``max_model_len - 1 - num_computed``); KV blocks
   allocated; when blocks run out, the LAST running request is preempted
   (recompute: its blocks are freed, ``num_computed = 0``, it goes to the head
   of the waiting queue; ``Scheduler._preempt_request``) until the request fits
   or is itself preempted.
   Async only: a request is skipped when the step already in flight reaches
   ``max_tokens`` (``num_computed + 2 - placeholders >= prompt + max_tokens``).
2. WAITING requests first come, first served, only if nothing was preempted in
   this step, while ``len(running) < max_num_seqs`` and budget remains; a
   request whose first chunk's blocks do not fit stops the loop.

Prefix caching (``prefix_caching=True``, vLLM 0.17.1's default: ``CacheConfig.enable_prefix_caching``) as
``vllm/v1/core/block_pool.py`` keeps it: the free blocks form ONE queue (``FreeKVCacheBlockQueue``); new blocks
are taken from its head (``BlockPool.get_new_blocks``, evicting whatever a block cached) and freed blocks are
appended to its tail, a request's blocks in reverse order so that its tail blocks are evicted first
(``SingleTypeKVCacheManager.free``). A preempted request's full blocks of known tokens stay cached in that queue
until evicted; when it is admitted again, ``KVCacheManager.get_computed_blocks`` hits the longest cached prefix
of whole blocks, at most ``num_tokens - 1`` tokens, and those blocks leave the queue (``BlockPool.touch``), so the
request recomputes only what was evicted. Prompts never share a prefix in these workloads (fresh, nonmatching ids),
so the blocks of finished requests are never hit. Without prefix caching a resumed request recomputes everything.

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
                 "times", "preemptions", "cached_full", "free_seg")

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
        self.cached_full = 0  # full blocks of known tokens cached at the last preemption (prefix caching)
        self.free_seg: list | None = None  # its blocks' segment [owner, count] in the free-block queue

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
                 num_gpu_blocks: int, max_model_len: int, async_scheduling: bool, prefix_caching: bool = False):
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
        self.prefix_caching = prefix_caching
        #: the free-block queue as segments ``[owner, count]``, head first: ``owner`` a preempted request whose
        #: cached blocks they are (its tail blocks first), or None for blocks nothing will hit; prefix caching only
        self.free_queue: deque[list] = deque([[None, num_gpu_blocks]]) if prefix_caching else deque()
        self.num_cached_tokens_hit = 0

    def has_requests(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def _need(self, r: SimRequest, n: int) -> int:
        return -(-(r.computed + n) // self.bs) - r.blocks

    def _preempt(self, r: SimRequest) -> None:
        if self.prefix_caching:
            known = r.P + r.out  # placeholders' tokens are not known yet: their blocks are not hashed
            r.cached_full = min(r.computed, known) // self.bs
            self._release(r, r.blocks, r)
        self.free_blocks += r.blocks
        r.blocks = 0
        r.status = PREEMPTED
        r.computed = 0
        r.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(r)

    def _release(self, r: SimRequest, n: int, owner: SimRequest | None) -> None:
        """Append ``r``'s ``n`` freed blocks to the free queue's tail, cached for ``owner`` (None: never hit)."""
        if n <= 0:
            return
        q = self.free_queue
        if owner is None and q and q[-1][0] is None:
            q[-1][1] += n
            return
        seg = [owner, n]
        q.append(seg)
        if owner is not None:
            owner.free_seg = seg

    def _take(self, n: int) -> None:
        """Take ``n`` blocks from the free queue's head (``BlockPool.get_new_blocks``), evicting cached ones."""
        q = self.free_queue
        while n > 0:
            seg = q[0]
            k = seg[1] if seg[1] <= n else n
            seg[1] -= k
            n -= k
            if seg[1] == 0:
                q.popleft()
                if seg[0] is not None:
                    seg[0].free_seg = None

    def _cache_hit(self, r: SimRequest) -> int:
        """Blocks of ``r``'s cached prefix still in the free queue (``get_computed_blocks``): whole blocks of at most
        ``num_tokens - 1`` tokens; 0 without prefix caching or a preemption."""
        seg = r.free_seg
        if seg is None:
            return 0
        return min(r.cached_full, seg[1], (r.num_tokens - 1) // self.bs)

    def _touch(self, r: SimRequest, hits: int) -> None:
        """``BlockPool.touch``: ``r``'s ``hits`` prefix blocks leave the free queue; the rest of its segment stays
        there, no longer hit by anything."""
        seg = r.free_seg
        if seg is None:
            return
        seg[1] -= hits
        seg[0] = None
        r.free_seg = None
        if seg[1] == 0:
            self.free_queue.remove(seg)
        self.free_blocks -= hits
        r.blocks += hits
        r.computed = hits * self.bs
        self.num_cached_tokens_hit += hits * self.bs

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
            if self.prefix_caching:
                self._take(need)
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
            hits = self._cache_hit(r) if self.prefix_caching else 0
            c = hits * self.bs if hits else r.computed
            n = r.P + r.out - c
            if n > budget:
                n = budget
            if n > pcap:
                n = pcap
            need = -(-(c + n) // self.bs) - (hits if hits else r.blocks)
            if need + hits > self.free_blocks:
                break
            waiting.popleft()
            if self.prefix_caching:
                self._touch(r, hits)
                self._take(need)
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
        if self.prefix_caching:
            self._release(r, r.blocks, None)
            if r.free_seg is not None:  # finished while preempted: its cached blocks will never be hit
                r.free_seg[0] = None
                r.free_seg = None
        self.free_blocks += r.blocks
        r.blocks = 0
        if r.status == RUNNING:
            self.running.remove(r)
        elif r.status == PREEMPTED:
            self.waiting.remove(r)
        r.status = FINISHED
