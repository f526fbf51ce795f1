"""DLFP-G, compiled: ``dlfp.policies.dlfpg.controller.DLFPG`` and its estimator over arrays, with the same arithmetic
in the same order (seconds, tokens).

``g`` is the policy's state: ``(theta (k,), P (k, k), gi (NUM_GI,) int64, lp (1,) the largest prefill's seconds,
issued chunks (G_ISSUED,), issued reasons (G_ISSUED,))`` with ``k`` 5 features with context, 3 without; the issued
chunks are a ring buffer of ``gi[GI_LEN]`` entries from ``gi[GI_HEAD]`` (the controller's ``deque(maxlen=64)``).
Reasons are codes of ``dlfp.policies.dlfpg.controller.REASONS`` (``layout.G_*``); a chunk of -1 is "no cap".
"""
from __future__ import annotations

import numpy as np
from numba import njit

from dlfp.backends.sim.compiled.device import ceil_div
from dlfp.backends.sim.compiled.layout import (
    C_G_BUDGET, C_G_CTX, C_G_EST, C_G_GUARD, C_G_MAX, C_G_MIN, C_G_Q, C_G_WARM, F_G_AIM, F_G_GUARDF, F_G_ITL,
    F_G_LAM, F_G_TRUST, F_G_TTFT, G_ESTIMATE, G_INFEASIBLE, G_ISSUED, G_MAX_CHUNK, G_NO_CAP, G_NO_PREFILL,
    G_PROPORTIONAL, G_REASON0, G_TRUST_LIMIT, G_TTFT_GUARD, G_WARMUP, GI_CHUNK, GI_GRANTS, GI_HEAD, GI_LARGEST,
    GI_LEN, GI_PREFILL_SAMPLES, GI_SAMPLES, W_CAP, W_CAP_AFTER, W_CAP_BEFORE, W_DCTX, W_GUARDED, W_ND, W_PPAIRS,
    W_PTOK, W_REASON,
)
from dlfp.policies.dlfpg.estimator import _MAX_TRACE, _SCALES_CONTEXT, _SCALES_PLAIN


@njit(cache=True)
def features(ci, pt, pairs, nd, dctx):
    """``CostEstimator.features``: the scaled regressor."""
    if ci[C_G_CTX]:
        sc = _SCALES_CONTEXT
        x = np.empty(5)
        x[0], x[1], x[2], x[3], x[4] = 1.0 / sc[0], pt / sc[1], pairs / sc[2], nd / sc[3], dctx / sc[4]
    else:
        sc = _SCALES_PLAIN
        x = np.empty(3)
        x[0], x[1], x[2] = 1.0 / sc[0], pt / sc[1], nd / sc[2]
    return x


@njit(cache=True)
def dot(a, b):
    """``dlfp.policies.dlfpg.estimator._dot``: left to right, no fused multiply-add."""
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


@njit(cache=True)
def est_update(ci, cf, g, pt, pairs, nd, dctx, seconds):
    """``CostEstimator.update``: one completed iteration of ``seconds``."""
    th, P, gi, lp = g[0], g[1], g[2], g[3]
    x = features(ci, pt, pairs, nd, dctx)
    n = x.shape[0]
    Px = np.empty(n)
    for i in range(n):
        Px[i] = dot(P[i], x)
    err = seconds - dot(th, x)
    trace = 0.0
    for i in range(n):
        trace += P[i, i]
    lam = cf[F_G_LAM] if trace / cf[F_G_LAM] <= _MAX_TRACE else 1.0
    den = lam + dot(x, Px)
    k = Px / den
    for i in range(n):
        th[i] = th[i] + k[i] * err
    Q = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            Q[i, j] = (P[i, j] - k[i] * Px[j]) / lam
    for i in range(n):
        for j in range(n):
            P[i, j] = 0.5 * (Q[i, j] + Q[j, i])
    gi[GI_SAMPLES] += 1
    if pt > 0:
        gi[GI_PREFILL_SAMPLES] += 1
        if pt >= gi[GI_LARGEST]:
            gi[GI_LARGEST] = pt
            lp[0] = seconds


@njit(cache=True)
def ready(ci, g):
    """``DLFPG.estimate_ready``."""
    sc = _SCALES_CONTEXT if ci[C_G_CTX] else _SCALES_PLAIN
    return ci[C_G_EST] and g[2][GI_PREFILL_SAMPLES] >= ci[C_G_WARM] and g[0][1] / sc[1] > 0


@njit(cache=True)
def predict_s(ci, g, chunk, pc, nd, dc):
    """``DLFPG.predict_s`` (s)."""
    t = dot(g[0], features(ci, chunk, chunk * pc + chunk * (chunk + 1) * 0.5, nd, dc))
    lg = g[2][GI_LARGEST]
    if chunk > lg > 0:
        v = g[3][0] * chunk / lg
        t = v if v > t else t
    return t


@njit(cache=True)
def floor_q(ci, tokens):
    q = ci[C_G_Q]
    return np.int64(np.floor(tokens / q + 1e-9)) * q


@njit(cache=True)
def choose(ci, cf, g, nd, pc, dc):
    """``DLFPG.choose``: ``(chunk, reason)`` before the TTFT guard."""
    if not ready(ci, g):
        return g[2][GI_CHUNK], (G_PROPORTIONAL if not ci[C_G_EST] else G_WARMUP)
    aim = cf[F_G_AIM]
    lo = ci[C_G_MIN]
    if predict_s(ci, g, lo, pc, nd, dc) > aim:
        return lo, G_INFEASIBLE
    trust = max(lo, floor_q(ci, cf[F_G_TRUST] * g[2][GI_LARGEST]))
    hi = min(ci[C_G_MAX], trust)
    if predict_s(ci, g, hi, pc, nd, dc) <= aim:
        return hi, (G_MAX_CHUNK if hi == ci[C_G_MAX] else G_TRUST_LIMIT)
    q = ci[C_G_Q]
    a, b = lo // q, hi // q
    while b - a > 1:
        m = (a + b) // 2
        if predict_s(ci, g, m * q, pc, nd, dc) <= aim:
            a = m
        else:
            b = m
    return a * q, G_ESTIMATE


@njit(cache=True)
def iter_s(ci, cf, g, chunk, nd, pc, dc):
    """``DLFPG._iter_s`` (s)."""
    if ready(ci, g):
        t = predict_s(ci, g, chunk, pc, nd, dc)
        return 1e-9 if 1e-9 > t else t
    return cf[F_G_AIM] * chunk / g[2][GI_CHUNK]


@njit(cache=True)
def ttft_guard(ci, cf, g, chunk, nd, pc, dc, waited, remaining):
    """``DLFPG.ttft_guard``: the larger chunk granted, or -1."""
    slack = cf[F_G_TTFT] - waited
    if slack <= 0 or remaining <= chunk:
        return -1
    if ceil_div(remaining, chunk) * iter_s(ci, cf, g, chunk, nd, pc, dc) <= slack:
        return -1
    limit_s = cf[F_G_GUARDF] * cf[F_G_ITL]
    q, mx = ci[C_G_Q], ci[C_G_MAX]
    for k in range(ceil_div(remaining, chunk) - 1, 0, -1):
        c = min(mx, ceil_div(ceil_div(remaining, k), q) * q)
        t = iter_s(ci, cf, g, c, nd, pc, dc)
        if t > limit_s:
            return -1
        if k * t <= slack:
            return c
        if c == mx:
            return -1
    return -1


@njit(cache=True)
def cap(ci, cf, g, ndec, waited, remaining, pc, dc):
    """``DLFPG.prefill_cap``: the chunk (-1: none); ``waited`` NaN when no request waits for a first token."""
    if ndec == 0:
        return -1
    chunk, reason = choose(ci, cf, g, ndec, pc, dc)
    if ci[C_G_GUARD] and ci[C_G_BUDGET] and not np.isnan(waited):
        granted = ttft_guard(ci, cf, g, chunk, ndec, pc, dc, waited, remaining)
        if granted > chunk:
            chunk, reason = granted, G_TTFT_GUARD
            g[2][GI_GRANTS] += 1
    gi, ich, irs = g[2], g[4], g[5]
    if gi[GI_LEN] == G_ISSUED:  # deque(maxlen=64).append drops the oldest
        gi[GI_HEAD] = (gi[GI_HEAD] + 1) % G_ISSUED
        gi[GI_LEN] -= 1
    j = (gi[GI_HEAD] + gi[GI_LEN]) % G_ISSUED
    ich[j], irs[j] = chunk, reason
    gi[GI_LEN] += 1
    return chunk


@njit(cache=True)
def reason_of(ci, g, capv):
    """``DLFPG._reason_of``: the reason of the chunk an observed iteration ran under (issued chunks in order)."""
    if capv < 0:
        return G_NO_CAP
    gi, ich, irs = g[2], g[4], g[5]
    while gi[GI_LEN] > 0:
        c, r = ich[gi[GI_HEAD]], irs[gi[GI_HEAD]]
        gi[GI_HEAD] = (gi[GI_HEAD] + 1) % G_ISSUED
        gi[GI_LEN] -= 1
        if c == capv:
            return r
    if not ci[C_G_EST]:
        return G_PROPORTIONAL
    return G_ESTIMATE if ready(ci, g) else G_WARMUP


@njit(cache=True)
def proportional(ci, cf, g, prefill, nd, iv):
    """``DLFPG._proportional``: the proportional law's update from a timed iteration with prefill."""
    gi = g[2]
    chunk = gi[GI_CHUNK]
    aim = cf[F_G_AIM]
    if iv > aim:
        raw = min(chunk, prefill) * aim / iv
    elif prefill >= chunk and nd > 0:
        a = chunk * aim / iv
        b = 2.0 * chunk
        raw = b if b < a else a
    else:
        return
    gi[GI_CHUNK] = min(ci[C_G_MAX], max(ci[C_G_MIN], floor_q(ci, raw)))


@njit(cache=True)
def observe(ci, cf, g, row, iv):
    """``DLFPG.observe`` of one iteration row with its signal's interval ``iv`` (NaN: unknown); writes the decision
    into the row. Returns False where the reference raises (a guarded iteration without a valid interval)."""
    guarded = row[W_GUARDED] != 0
    ivu = iv
    if not np.isnan(iv) and not (np.isfinite(iv) and iv > 0):
        if guarded:
            return False
        ivu = np.nan
    if guarded and np.isnan(ivu):
        return False
    p = np.int64(row[W_PTOK])
    nd = np.int64(row[W_ND])
    pairs = row[W_PPAIRS]
    dctx = np.int64(row[W_DCTX])
    known = not np.isnan(ivu)
    if known and (p > 0 or nd > 0):
        est_update(ci, cf, g, p, pairs, nd, dctx, ivu)
    if known and p > 0:
        proportional(ci, cf, g, p, nd, ivu)
    capv = np.int64(row[W_CAP])
    reason = reason_of(ci, g, capv)
    if capv >= 0 and p == 0:
        reason = G_NO_PREFILL
    after = -1
    if nd > 0:
        ctx_before = (pairs - p * (p + 1) * 0.5) / p if p else 0.0
        after = choose(ci, cf, g, nd, np.int64(ctx_before) + p, dctx + nd)[0]
    row[W_CAP_BEFORE] = capv
    row[W_CAP_AFTER] = after
    row[W_REASON] = G_REASON0 + reason
    return True
