"""The scheduler, compiled: ``dlfp.backends.sim.scheduler.Scheduler`` over arrays (same decisions, same order),
with the free-block queue of prefix caching and the waiting and running queues."""
from __future__ import annotations

import numpy as np
from numba import njit

from dlfp.backends.sim.compiled.device import ceil_div
from dlfp.backends.sim.compiled.layout import (
    C_ASYNC, C_BS, C_BUDGET, C_FIXCAP, C_MAXLEN, C_MAXSEQ, C_POLICY, C_PREFIX, FINISHED, FIXED,
    G_CNT, G_NEXT, G_OWNER, G_PREV, NOCAP, PREEMPTED, RUNNING, R_BLK, R_CFULL, R_COMP, R_FSEG, R_M,
    R_OUT, R_P, R_PH, R_PRE, R_ST, S_CAP, S_FREE, S_HIT, S_NPREEMPT, S_NRUN, S_NWAIT, S_QHEAD, S_QTAIL,
    S_SEGTOP, S_WHEAD
)


@njit(cache=True)
def seg_unlink(si, seg, stack, j):
    """Drop segment ``j`` from the queue and return its slot."""
    p, n = seg[j, G_PREV], seg[j, G_NEXT]
    if p >= 0:
        seg[p, G_NEXT] = n
    else:
        si[S_QHEAD] = n
    if n >= 0:
        seg[n, G_PREV] = p
    else:
        si[S_QTAIL] = p
    si[S_SEGTOP] += 1
    stack[si[S_SEGTOP]] = j


@njit(cache=True)
def seg_append(si, seg, stack, owner, cnt):
    """A new segment ``[owner, cnt]`` at the queue's tail; returns its index."""
    j = stack[si[S_SEGTOP]]
    si[S_SEGTOP] -= 1
    seg[j, G_OWNER] = owner
    seg[j, G_CNT] = cnt
    seg[j, G_PREV] = si[S_QTAIL]
    seg[j, G_NEXT] = -1
    if si[S_QTAIL] >= 0:
        seg[si[S_QTAIL], G_NEXT] = j
    else:
        si[S_QHEAD] = j
    si[S_QTAIL] = j
    return j


@njit(cache=True)
def release(si, rq, seg, stack, n, owner):
    """``Scheduler._release``: ``n`` freed blocks to the queue's tail, cached for request ``owner`` (-1: none)."""
    if n <= 0:
        return
    tail = si[S_QTAIL]
    if owner < 0 and tail >= 0 and seg[tail, G_OWNER] < 0:
        seg[tail, G_CNT] += n
        return
    j = seg_append(si, seg, stack, owner, n)
    if owner >= 0:
        rq[owner, R_FSEG] = j


@njit(cache=True)
def take(si, rq, seg, stack, n):
    """``Scheduler._take``: ``n`` blocks from the queue's head, evicting what they cached."""
    while n > 0:
        j = si[S_QHEAD]
        k = seg[j, G_CNT] if seg[j, G_CNT] <= n else n
        seg[j, G_CNT] -= k
        n -= k
        if seg[j, G_CNT] == 0:
            seg_unlink(si, seg, stack, j)
            if seg[j, G_OWNER] >= 0:
                rq[seg[j, G_OWNER], R_FSEG] = -1


@njit(cache=True)
def cache_hit(ci, rq, seg, r):
    """``Scheduler._cache_hit``: blocks of ``r``'s cached prefix still free."""
    j = rq[r, R_FSEG]
    if j < 0:
        return 0
    return min(rq[r, R_CFULL], seg[j, G_CNT], (rq[r, R_P] + rq[r, R_OUT] - 1) // ci[C_BS])


@njit(cache=True)
def touch(ci, si, rq, seg, stack, r, hits):
    """``Scheduler._touch``: ``r``'s ``hits`` cached blocks leave the free queue."""
    j = rq[r, R_FSEG]
    if j < 0:
        return
    seg[j, G_CNT] -= hits
    seg[j, G_OWNER] = -1
    rq[r, R_FSEG] = -1
    if seg[j, G_CNT] == 0:
        seg_unlink(si, seg, stack, j)
    si[S_FREE] -= hits
    rq[r, R_BLK] += hits
    rq[r, R_COMP] = hits * ci[C_BS]
    si[S_HIT] += hits * ci[C_BS]


# ---------------------------------------------------------------- the waiting and running queues
@njit(cache=True)
def wait_at(si, wq, k):
    """The ``k``-th request of the waiting queue (a ring buffer of ``len(wq)`` slots)."""
    return wq[(si[S_WHEAD] + k) % wq.shape[0]]


@njit(cache=True)
def wait_push(si, wq, r, front):
    """Append ``r`` to the waiting queue, at its head when ``front``."""
    cap = wq.shape[0]
    if front:
        si[S_WHEAD] = (si[S_WHEAD] - 1) % cap
        wq[si[S_WHEAD]] = r
    else:
        wq[(si[S_WHEAD] + si[S_NWAIT]) % cap] = r
    si[S_NWAIT] += 1


@njit(cache=True)
def wait_remove(si, wq, r):
    """``deque.remove(r)`` of the waiting queue (the first occurrence)."""
    cap = wq.shape[0]
    n = si[S_NWAIT]
    k = 0
    while k < n and wait_at(si, wq, k) != r:
        k += 1
    for m in range(k, n - 1):
        wq[(si[S_WHEAD] + m) % cap] = wq[(si[S_WHEAD] + m + 1) % cap]
    si[S_NWAIT] = n - 1


@njit(cache=True)
def run_remove(si, running, r):
    """``list.remove(r)`` of the running list."""
    n = si[S_NRUN]
    k = 0
    while k < n and running[k] != r:
        k += 1
    for m in range(k, n - 1):
        running[m] = running[m + 1]
    si[S_NRUN] = n - 1


# ---------------------------------------------------------------- the scheduler
@njit(cache=True)
def preempt(ci, si, rq, seg, stack, wq, r):
    """``Scheduler._preempt``: recompute; ``r`` goes to the waiting queue's head."""
    if ci[C_PREFIX]:
        known = rq[r, R_P] + rq[r, R_OUT]
        rq[r, R_CFULL] = min(rq[r, R_COMP], known) // ci[C_BS]
        release(si, rq, seg, stack, rq[r, R_BLK], r)
    si[S_FREE] += rq[r, R_BLK]
    rq[r, R_BLK] = 0
    rq[r, R_ST] = PREEMPTED
    rq[r, R_COMP] = 0
    rq[r, R_PRE] += 1
    si[S_NPREEMPT] += 1
    wait_push(si, wq, r, True)


@njit(cache=True)
def finish(ci, si, rq, seg, stack, wq, running, r):
    """``Scheduler.finish``: free a finished request's blocks and drop it from its queue."""
    if ci[C_PREFIX]:
        release(si, rq, seg, stack, rq[r, R_BLK], -1)
        j = rq[r, R_FSEG]
        if j >= 0:
            seg[j, G_OWNER] = -1
            rq[r, R_FSEG] = -1
    si[S_FREE] += rq[r, R_BLK]
    rq[r, R_BLK] = 0
    if rq[r, R_ST] == RUNNING:
        run_remove(si, running, r)
    elif rq[r, R_ST] == PREEMPTED:
        wait_remove(si, wq, r)
    rq[r, R_ST] = FINISHED


@njit(cache=True)
def in_decode(rq, r):
    c = rq[r, R_COMP]
    return c >= rq[r, R_P] and c + 1 >= rq[r, R_P] + rq[r, R_OUT] + rq[r, R_PH]


@njit(cache=True)
def prefill_cap(ci, si, rq, running):
    """The policy's cap (-1: none) for the decodes now running: NoCap, FixedCap or DLFP."""
    kind = ci[C_POLICY]
    if kind == NOCAP:
        return -1
    ndec = 0
    for m in range(si[S_NRUN]):
        if in_decode(rq, running[m]):
            ndec += 1
    if ndec == 0:
        return -1
    return ci[C_FIXCAP] if kind == FIXED else si[S_CAP]


@njit(cache=True)
def schedule_running(ci, si, rq, seg, stack, wq, running, ent, budget, pcap):
    """``Scheduler._schedule_running``: fills ``ent`` (rows ``request, tokens, computed, decode``); returns
    ``(entries, budget left, cap left, preempted)``."""
    ne = 0
    preempted = False
    i = 0
    asy = ci[C_ASYNC]
    while i < si[S_NRUN] and budget > 0:
        r = running[i]
        P, comp, out, ph = rq[r, R_P], rq[r, R_COMP], rq[r, R_OUT], rq[r, R_PH]
        if asy and ph > 0 and comp + 2 - ph >= P + rq[r, R_M]:
            i += 1
            continue
        n = min(P + out + ph - comp, budget, ci[C_MAXLEN] - 1 - comp)
        dec = comp >= P and comp + 1 >= P + out + ph
        if not dec and n > pcap:
            n = pcap
        if n <= 0:
            i += 1
            continue
        need = ceil_div(comp + n, ci[C_BS]) - rq[r, R_BLK]
        ok = True
        while need > si[S_FREE]:
            si[S_NRUN] -= 1
            victim = running[si[S_NRUN]]
            preempt(ci, si, rq, seg, stack, wq, victim)
            preempted = True
            if victim == r:
                ok = False
                break
        if not ok:
            break
        si[S_FREE] -= need
        if ci[C_PREFIX]:
            take(si, rq, seg, stack, need)
        rq[r, R_BLK] += need
        ent[ne, 0], ent[ne, 1], ent[ne, 2], ent[ne, 3] = r, n, comp, dec
        ne += 1
        budget -= n
        if not dec:
            pcap -= n
        i += 1
    return ne, budget, pcap, preempted


@njit(cache=True)
def schedule_waiting(ci, si, rq, seg, stack, wq, running, ent, ne, budget, pcap):
    """``Scheduler._schedule_waiting``: admit waiting requests first come, first served; returns the entries."""
    bs = ci[C_BS]
    while si[S_NWAIT] > 0 and budget > 0 and pcap > 0:
        if si[S_NRUN] == ci[C_MAXSEQ]:
            break
        r = wq[si[S_WHEAD]]
        hits = cache_hit(ci, rq, seg, r) if ci[C_PREFIX] else 0
        c = hits * bs if hits else rq[r, R_COMP]
        n = min(rq[r, R_P] + rq[r, R_OUT] - c, budget, pcap)
        need = ceil_div(c + n, bs) - (hits if hits else rq[r, R_BLK])
        if need + hits > si[S_FREE]:
            break
        si[S_WHEAD] = (si[S_WHEAD] + 1) % wq.shape[0]
        si[S_NWAIT] -= 1
        if ci[C_PREFIX]:
            touch(ci, si, rq, seg, stack, r, hits)
            take(si, rq, seg, stack, need)
        si[S_FREE] -= need
        rq[r, R_BLK] += need
        rq[r, R_ST] = RUNNING
        running[si[S_NRUN]] = r
        si[S_NRUN] += 1
        ent[ne, 0], ent[ne, 1], ent[ne, 2], ent[ne, 3] = r, n, rq[r, R_COMP], 0
        ne += 1
        budget -= n
        pcap -= n
    return ne


@njit(cache=True)
def schedule_inputs(si, rq, wq, running, arrival, now):
    """What ``Scheduler._prefill_cap`` and ``_context`` give a policy with ``wants_context``: ``(decodes, waited,
    remaining, prefill context, decode context)``; ``waited`` (s) is NaN when no request waits for a first token."""
    ndec = 0
    dctx = 0
    pctx = -1
    oldest = wq[si[S_WHEAD]] if si[S_NWAIT] > 0 else -1
    for m in range(si[S_NRUN]):
        r = running[m]
        if in_decode(rq, r):
            ndec += 1
            dctx += rq[r, R_COMP]
        else:
            if pctx < 0:
                pctx = rq[r, R_COMP]
            if rq[r, R_OUT] == 0 and (oldest < 0 or arrival[r] < arrival[oldest]):
                oldest = r
    if pctx < 0:
        pctx = rq[wq[si[S_WHEAD]], R_COMP] if si[S_NWAIT] > 0 else 0
    if oldest < 0:
        return ndec, np.nan, 0, pctx, dctx
    return ndec, now - arrival[oldest], max(0, rq[oldest, R_P] - rq[oldest, R_COMP]), pctx, dctx


@njit(cache=True)
def scheduler_step(ci, si, rq, seg, stack, wq, running, ent, cap):
    """``Scheduler.schedule`` under the policy's ``cap`` (-1: none): fills ``ent`` (``request, tokens, computed,
    decode, samples``) and returns the number of entries."""
    pcap = cap if cap >= 0 else np.int64(1) << 62
    ne, budget, pcap, preempted = schedule_running(ci, si, rq, seg, stack, wq, running, ent, ci[C_BUDGET], pcap)
    if not preempted:
        ne = schedule_waiting(ci, si, rq, seg, stack, wq, running, ent, ne, budget, pcap)
    asy = ci[C_ASYNC]
    for j in range(ne):  # _update_after_schedule
        r = ent[j, 0]
        rq[r, R_COMP] = ent[j, 2] + ent[j, 1]
        smp = rq[r, R_COMP] >= rq[r, R_P] + rq[r, R_OUT] + rq[r, R_PH]
        if smp and asy:
            rq[r, R_PH] += 1
        ent[j, 4] = smp
    return ne
