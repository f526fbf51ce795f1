"""The engine loops, compiled: ``dlfp.backends.sim.engine._Run`` (schedule and update half-steps, the API server's
queue, the sync and async loops) and the policies NoCap, FixedCap and DLFP (DLFP-G in ``dlfpg``), over arrays (same
arithmetic, same order). ``st`` is the tuple of per-run arrays that ``dlfp.backends.sim.compiled.run`` builds:
``(rq, seg, stack, wq, running, ent, bent, bmeta, bdone, send, vis, release, times, toff, g)``, ``g`` DLFP-G's
state."""
from __future__ import annotations

import numpy as np
from numba import njit

from dlfp.backends.sim.compiled import dlfpg
from dlfp.backends.sim.compiled.device import device_time
from dlfp.backends.sim.compiled.layout import (
    C_ASYNC, C_CONC, C_FE, C_FIXCAP, C_GMAX, C_HOSTSIG, C_MAXCAP, C_MAXSTEPS, C_MINCAP,
    C_POLICY, C_QUANTUM, C_TP, DLFP, DLFPG, W_DCTX, W_PPAIRS,
    ERR_IDLE, ERR_INTERVAL, ERR_STEPS, ERR_STUCK, FINISHED, FIXED,
    F_BK_BASE, F_BK_REQ, F_EAGER, F_FE_OUT, F_GAIN, F_GRAPH, F_IDLE, F_INGEST, F_LOOP, F_OUT_S,
    F_OUT_TOK, F_PIECEWISE, F_PREP_BASE, F_PREP_REQ, F_PREP_TOK, F_REQ_S, F_REQ_TOK, F_SAMPLE_LAUNCH,
    F_SCHED_BASE, F_SCHED_REQ, F_TARGET, F_TDP, F_TOKENIZE, F_TOK_WINDOW, F_UP_BASE, F_UP_REQ, INF,
    NSLOT, NUM_W, R_M, R_OUT, R_P, R_PH, R_ST, S_CALLS, S_CAP, S_ERR, S_FE_NEXT, S_IT, S_LAST,
    S_NEXT_ARR, S_NEXT_SEND, S_NRUN, S_NWAIT, S_QLEN, S_UNFIN, T_BUSYE, T_BUSYT, T_DEVFREE, T_LOOPFREE,
    T_NOW, T_TOKFREE, W_CAP, W_CAP_AFTER, W_CAP_BEFORE, W_DEV, W_END, W_ENERGY, W_GUARDED, W_HOST_IV,
    W_ISSUE, W_IT, W_ND, W_NPF, W_OBS_IV, W_OBS_T, W_PROCESSED, W_PTOK, W_REASON, W_SCHED, W_START
)
from dlfp.backends.sim.compiled.scheduler import (
    finish, prefill_cap, schedule_inputs, scheduler_step, wait_push,
)


@njit(cache=True)
def fe_request(cf, sf, send_s, prompt):
    """``FrontEnd.request``: when a request sent at ``send_s`` reaches the engine (s)."""
    start = send_s if send_s > sf[T_LOOPFREE] else sf[T_LOOPFREE]
    done = start + cf[F_REQ_S] + cf[F_REQ_TOK] * prompt
    sf[T_LOOPFREE] = done
    if cf[F_TOKENIZE] > 0:
        ready = done + cf[F_TOK_WINDOW]
        start = ready if ready > sf[T_TOKFREE] else sf[T_TOKFREE]
        done = start + cf[F_TOKENIZE] * prompt
        sf[T_TOKFREE] = done
    return done + cf[F_INGEST]


@njit(cache=True)
def frontend_until(ci, cf, si, sf, rq, send, vis, t):
    """``_Run.frontend_until``: the API server takes every request sent by ``t``."""
    if not ci[C_FE]:
        return
    k = si[S_FE_NEXT]
    n = send.shape[0]
    while k < n and send[k] <= t:
        vis[k] = fe_request(cf, sf, send[k], rq[k, R_P])
        k += 1
    si[S_FE_NEXT] = k


# ---------------------------------------------------------------- the policy's observation
@njit(cache=True)
def observe(ci, cf, si, g, rows, k, now):
    """``_Run.observe`` of iteration ``k`` at ``now``, with the policy's update and decision in ``rows[k]``."""
    host_sig = ci[C_HOSTSIG]
    if host_sig:
        iv = rows[k, W_HOST_IV]
    else:
        iv = rows[k, W_END] - rows[k, W_START] if rows[k, W_PROCESSED] else np.nan
    kind = ci[C_POLICY]
    if kind == DLFPG:
        if not dlfpg.observe(ci, cf, g, rows[k], iv):
            si[S_ERR] = ERR_INTERVAL
        rows[k, W_OBS_IV] = iv
        rows[k, W_OBS_T] = now
        return
    before = -1
    after = -1
    reason = 0
    if kind == FIXED:
        before = after = ci[C_FIXCAP]
        reason = 1
    elif kind == DLFP:
        before = after = si[S_CAP]
        reason = 2
        if rows[k, W_GUARDED]:
            if not (np.isfinite(iv) and iv > 0.0):
                si[S_ERR] = ERR_INTERVAL
                return
            raw = before * (1.0 + cf[F_GAIN] * (cf[F_TARGET] / iv - 1.0))
            q = ci[C_QUANTUM]
            after = min(ci[C_MAXCAP], max(ci[C_MINCAP], np.int64(np.floor(raw / q + 0.5)) * q))
            si[S_CAP] = after
            reason = 3
    rows[k, W_OBS_IV] = iv
    rows[k, W_CAP_AFTER] = after
    rows[k, W_OBS_T] = now
    rows[k, W_CAP_BEFORE] = before
    rows[k, W_REASON] = reason


# ---------------------------------------------------------------- the engine's two half-steps
@njit(cache=True)
def batch_row(ci, cf, sf, tab, ent, ne, rows, k, now, tnow, cap):
    """Features, device time, launch and energy of a non-empty schedule, written to ``rows[k]`` (``_Run.schedule``
    after ``Scheduler.schedule``); returns when the host is free again (s)."""
    tokens = sampled = ptok = npf = nd = dctx = 0
    pairs = kv = ppairs = 0.0
    for j in range(ne):
        kk, c = ent[j, 1], ent[j, 2]
        tokens += kk
        if ent[j, 4]:
            sampled += 1
        if ent[j, 3]:
            nd += 1
            pairs += c + 1
            kv += c
            dctx += c
        else:
            npf += 1
            ptok += kk
            pairs += kk * c + kk * (kk + 1) * 0.5
            ppairs += kk * c + kk * (kk + 1) * 0.5
            kv += c
    dt, util = device_time(ci, cf, tab, ent[:, 1], ent[:, 2], ent[:, 3], ne, tokens, sampled, pairs, kv, npf, nd)
    issue = tnow + cf[F_PREP_BASE] + cf[F_PREP_REQ] * ne + cf[F_PREP_TOK] * tokens
    if tokens > ci[C_GMAX]:  # HostCosts.launch_rule at its three outcomes (all eager with enforce_eager)
        launch = cf[F_EAGER]
    else:
        launch = cf[F_GRAPH] if npf == 0 else cf[F_PIECEWISE]
    start = issue if issue > sf[T_DEVFREE] else sf[T_DEVFREE]
    end = start + dt
    if end < issue + launch:
        util *= dt / (issue + launch - start)
        end = issue + launch
    sf[T_DEVFREE] = end
    span = end - start
    energy = span * (cf[F_IDLE] + (cf[F_TDP] - cf[F_IDLE]) * util) * ci[C_TP]
    sf[T_BUSYE] += energy
    sf[T_BUSYT] += span
    row = rows[k]
    row[:] = np.nan
    row[W_IT], row[W_SCHED], row[W_PTOK], row[W_NPF], row[W_ND] = k, now, ptok, npf, nd
    row[W_CAP], row[W_CAP_AFTER], row[W_GUARDED] = cap, -1, cap >= 0 and nd > 0 and ptok > 0
    row[W_DEV], row[W_ISSUE], row[W_START], row[W_END], row[W_ENERGY] = span, issue, start, end, energy
    row[W_PROCESSED], row[W_CAP_BEFORE], row[W_REASON], row[W_PPAIRS], row[W_DCTX] = 0, -1, -1, ppairs, dctx
    return issue + launch + cf[F_SAMPLE_LAUNCH]


@njit(cache=True)
def schedule(ci, cf, si, sf, tab, st, rows, now, slot):
    """``_Run.schedule`` at ``now`` into batch slot ``slot``; returns whether anything was scheduled."""
    rq, seg, stack, wq, running, ent, bent, bmeta, bdone, send, vis, release, times, toff, g = st
    si[S_CALLS] += 1
    last = si[S_LAST]
    if last >= 0:
        rows[last, W_HOST_IV] = now - rows[last, W_SCHED]
        if ci[C_HOSTSIG]:
            observe(ci, cf, si, g, rows, last, now)
        si[S_LAST] = -1
    if ci[C_POLICY] == DLFPG:
        ndec, waited, remaining, pctx, dctx = schedule_inputs(si, rq, wq, running, send, now)
        cap = dlfpg.cap(ci, cf, g, ndec, waited, remaining, pctx, dctx)
    else:
        cap = prefill_cap(ci, si, rq, running)
    ne = scheduler_step(ci, si, rq, seg, stack, wq, running, ent, cap)
    tnow = now + cf[F_SCHED_BASE] + cf[F_SCHED_REQ] * (si[S_NRUN] + ne)
    for j in range(ne):
        bent[slot, j, 0] = ent[j, 0]
        bent[slot, j, 1] = ent[j, 4]
    bmeta[slot, 0] = ne
    if ne == 0:
        bmeta[slot, 1] = -1
        bdone[slot] = tnow
        sf[T_NOW] = tnow
        return False
    k = si[S_IT]
    si[S_IT] = k + 1
    sf[T_NOW] = batch_row(ci, cf, sf, tab, ent, ne, rows, k, now, tnow, cap)
    bmeta[slot, 1] = k
    bdone[slot] = rows[k, W_END]
    si[S_LAST] = k
    return True


@njit(cache=True)
def free_slot(ci, cf, si, st, now):
    """``_Run.free_slot``: a closed loop's client slot freed at ``now`` sends the next request."""
    rq, seg, stack, wq, running, ent, bent, bmeta, bdone, send, vis, release, times, toff, g = st
    j = si[S_NEXT_SEND]
    if j < send.shape[0]:
        sent = release[j] if release[j] > now else now
        send[j] = sent
        if not ci[C_FE]:
            vis[j] = sent + cf[F_INGEST]
        si[S_NEXT_SEND] = j + 1


@njit(cache=True)
def update(ci, cf, si, sf, st, rows, slot):
    """``_Run.update`` of batch slot ``slot``: emit its sampled tokens, finish completed requests."""
    rq, seg, stack, wq, running, ent, bent, bmeta, bdone, send, vis, release, times, toff, g = st
    n = bmeta[slot, 0]
    tend = sf[T_NOW] + cf[F_BK_BASE] + cf[F_BK_REQ] * n + cf[F_UP_BASE] + cf[F_UP_REQ] * n
    if not ci[C_FE]:
        emit = tend + cf[F_FE_OUT]
    else:
        frontend_until(ci, cf, si, sf, rq, send, vis, tend)
        ntok = 0
        for j in range(n):
            if bent[slot, j, 1] and rq[bent[slot, j, 0], R_ST] != FINISHED:
                ntok += 1
        emit = tend
        if ntok:  # FrontEnd.output
            start = tend if tend > sf[T_LOOPFREE] else sf[T_LOOPFREE]
            done = start + cf[F_OUT_S] + cf[F_OUT_TOK] * ntok
            sf[T_LOOPFREE] = done
            emit = done + cf[F_FE_OUT]
    for j in range(n):
        r = bent[slot, j, 0]
        if rq[r, R_ST] == FINISHED or not bent[slot, j, 1]:
            continue
        if ci[C_ASYNC]:
            rq[r, R_PH] -= 1
        rq[r, R_OUT] += 1
        times[toff[r] + rq[r, R_OUT] - 1] = emit
        if rq[r, R_OUT] >= rq[r, R_M]:
            finish(ci, si, rq, seg, stack, wq, running, r)
            si[S_UNFIN] -= 1
            if ci[C_CONC] > 0:
                free_slot(ci, cf, si, st, emit)
    sf[T_NOW] = tend + cf[F_LOOP]
    k = bmeta[slot, 1]
    if k >= 0:
        rows[k, W_PROCESSED] = 1
        if not ci[C_HOSTSIG]:
            observe(ci, cf, si, g, rows, k, tend)


# ---------------------------------------------------------------- the loops
@njit(cache=True)
def next_visible(ci, cf, si, sf, st):
    """``_Run.next_visible``: when the next request not yet admitted reaches the engine (s)."""
    rq, seg, stack, wq, running, ent, bent, bmeta, bdone, send, vis, release, times, toff, g = st
    a = si[S_NEXT_ARR]
    if ci[C_FE] and si[S_FE_NEXT] == a and send[a] != INF:
        frontend_until(ci, cf, si, sf, rq, send, vis, send[a])
    return vis[a]


@njit(cache=True)
def admit(ci, cf, si, sf, st):
    """``_Run.admit``: every request visible by now joins the waiting queue."""
    rq, seg, stack, wq, running, ent, bent, bmeta, bdone, send, vis, release, times, toff, g = st
    frontend_until(ci, cf, si, sf, rq, send, vis, sf[T_NOW])
    a = si[S_NEXT_ARR]
    n = send.shape[0]
    while a < n and vis[a] <= sf[T_NOW]:
        wait_push(si, wq, a, False)
        a += 1
    si[S_NEXT_ARR] = a


@njit(cache=True)
def wait_for_next_arrival(ci, cf, si, sf, st):
    """``_Run.wait_for_next_arrival``; sets ``ERR_STUCK`` when no arrival can unblock the engine."""
    n = st[9].shape[0]
    if si[S_NEXT_ARR] < n and next_visible(ci, cf, si, sf, st) != INF:
        v = st[10][si[S_NEXT_ARR]]
        sf[T_NOW] = v if v > sf[T_NOW] else sf[T_NOW]
    elif si[S_UNFIN] > 0:
        si[S_ERR] = ERR_STUCK


@njit(cache=True)
def has_requests(si):
    return si[S_NWAIT] > 0 or si[S_NRUN] > 0


@njit(cache=True)
def sync_step(ci, cf, si, sf, tab, st, rows):
    """``EngineCore.step``: schedule, execute, block on the result, update (batch slot 0)."""
    if not has_requests(si):
        return
    if schedule(ci, cf, si, sf, tab, st, rows, sf[T_NOW], 0):
        end = st[8][0]
        sf[T_NOW] = end if end > sf[T_NOW] else sf[T_NOW]
    else:
        wait_for_next_arrival(ci, cf, si, sf, st)
    update(ci, cf, si, sf, st, rows, 0)


@njit(cache=True)
def async_step(ci, cf, si, sf, tab, st, rows, qs):
    """``EngineCore.step_with_batch_queue`` with a queue of depth 2 and early return; ``qs[:S_QLEN]`` holds the
    queue's batch slots, newest first."""
    bdone = st[8]
    if has_requests(si):
        slot = 0
        while slot in qs[:si[S_QLEN]]:
            slot += 1
        executed = schedule(ci, cf, si, sf, tab, st, rows, sf[T_NOW], slot)
        for m in range(si[S_QLEN], 0, -1):  # appendleft
            qs[m] = qs[m - 1]
        qs[0] = slot
        si[S_QLEN] += 1
        if executed and si[S_QLEN] < 2 and bdone[qs[si[S_QLEN] - 1]] > sf[T_NOW]:
            return  # early return: schedule again while the oldest batch runs
        if not executed and si[S_QLEN] == 1:
            si[S_QLEN] = 0  # nothing in flight and nothing schedulable: wait for the next arrival
            update(ci, cf, si, sf, st, rows, slot)
            wait_for_next_arrival(ci, cf, si, sf, st)
            return
    elif si[S_QLEN] == 0:
        return
    si[S_QLEN] -= 1
    ob = qs[si[S_QLEN]]
    if bdone[ob] > sf[T_NOW]:
        sf[T_NOW] = bdone[ob]
    update(ci, cf, si, sf, st, rows, ob)


@njit(cache=True)
def simulate(ci, cf, si, sf, tab, st, rows):
    """``_Run.loop``: engine steps until every request has finished or an error is set (``si[S_ERR]``).

    Returns the iteration rows (``rows``, grown as needed; the first ``si[S_IT]`` are filled)."""
    vis = st[10]
    n = vis.shape[0]
    qs = np.zeros(NSLOT + 1, np.int64)
    steps = 0
    while si[S_UNFIN] > 0 and si[S_ERR] == 0:
        steps += 1
        if steps > ci[C_MAXSTEPS]:
            si[S_ERR] = ERR_STEPS
            break
        if si[S_IT] >= rows.shape[0]:
            grown = np.empty((2 * rows.shape[0], NUM_W))
            grown[:rows.shape[0]] = rows
            rows = grown
        if not has_requests(si) and si[S_QLEN] == 0:  # idle: block until the next arrival
            if si[S_NEXT_ARR] >= n:
                si[S_ERR] = ERR_IDLE
                break
            if next_visible(ci, cf, si, sf, st) > sf[T_NOW]:
                sf[T_NOW] = vis[si[S_NEXT_ARR]]
        a = si[S_NEXT_ARR]
        if a < n and (vis[a] <= sf[T_NOW] or (ci[C_FE] and si[S_FE_NEXT] == a)):
            admit(ci, cf, si, sf, st)
        if ci[C_ASYNC]:
            async_step(ci, cf, si, sf, tab, st, rows, qs)
        else:
            sync_step(ci, cf, si, sf, tab, st, rows)
    return rows
