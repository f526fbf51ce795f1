"""Device time of one schedule: ``dlfp.devices.kernel_model.KernelDeviceModel.time_scheduled`` and the attention
model (``dlfp.devices.attention``), compiled, with the same arithmetic in the same order (seconds)."""
from __future__ import annotations

import numpy as np
from numba import njit

from dlfp.backends.sim.compiled.layout import (
    C_LAYERS, C_NKV, C_NQ, C_SMS, F_ACT, F_ATT_BW, F_ATT_KV_TOK, F_ATT_LAUNCH, F_BLEND, F_BM, F_BN,
    F_DEC_LAUNCH, F_DTYPE, F_HBM, F_HD, F_HEAD_FLOPS, F_KV_TOK, F_LIN_FLOPS, F_PAIR_FLOPS, F_PEAK,
    F_SKV_M, F_SKV_N, F_SM_FLOPS, F_WEIGHT
)


@njit(cache=True)
def ceil_div(a, b):
    return -(-a // b)


@njit(cache=True)
def blend(a, b, p):
    """``dlfp.devices.operators.blend``."""
    m = b if b > a else a  # max(a, b)
    if m <= 0:
        return 0.0
    return m * ((a / m) ** p + (b / m) ** p) ** (1.0 / p)


@njit(cache=True)
def makespan_desc(durations, workers):
    """``dlfp.devices.attention.makespan`` of durations already sorted longest first (CPython's heapreplace)."""
    n = durations.shape[0]
    if n == 0:
        return 0.0
    if n <= workers:
        return durations[0]
    heap = np.zeros(workers)
    for d in durations:
        item = heap[0] + d
        pos = 0
        limit = workers >> 1
        while pos < limit:  # _siftup: bubble the smaller child up to a leaf
            child = 2 * pos + 1
            if child + 1 < workers and not heap[child] < heap[child + 1]:
                child += 1
            heap[pos] = heap[child]
            pos = child
        while pos > 0:  # _siftdown from the leaf
            parent = (pos - 1) >> 1
            if item < heap[parent]:
                heap[pos] = heap[parent]
                pos = parent
                continue
            break
        heap[pos] = item
    return heap.max()


@njit(cache=True)
def prefill_time(ci, cf, c, p):
    """``AttentionModel.prefill_time(c, p, tp)`` (s): a chunk of ``c`` tokens after ``p`` cached ones."""
    bm = np.int64(cf[F_BM])
    bn = np.int64(cf[F_BN])
    nqb = ceil_div(c, bm)
    nq = ci[C_NQ]
    tile_s = 4.0 * cf[F_BM] * cf[F_BN] * cf[F_HD] / cf[F_SM_FLOPS]
    durs = np.empty(nqb * nq)
    k = 0
    for i in range(nqb - 1, -1, -1):  # longest first: a later query block sees more keys
        rows = min(bm, c - i * bm)
        d = ceil_div(p + i * bm + rows, bn) * tile_s
        for _h in range(nq):
            durs[k] = d
            k += 1
    t_c = makespan_desc(durs, ci[C_SMS])
    nbytes = (p + c) * cf[F_ATT_KV_TOK] + 2.0 * c * nq * cf[F_HD] * cf[F_DTYPE]
    t_m = nbytes / cf[F_ATT_BW]
    return cf[F_ATT_LAUNCH] + blend(t_c, t_m, cf[F_BLEND])


@njit(cache=True)
def decode_time(ci, cf, d, context):
    """``KernelDeviceModel._decode_time(d, context)`` (s): split-KV decode of ``d`` requests."""
    kv_blocks = ceil_div(context, np.int64(cf[F_SKV_N]))
    nkv = ci[C_NKV]
    sms = ci[C_SMS]
    splits = max(1, min(ceil_div(sms, d * nkv), kv_blocks, 128))
    blocks = ceil_div(kv_blocks, splits)
    cta_s = 4.0 * cf[F_SKV_M] * cf[F_SKV_N] * cf[F_HD] * blocks / cf[F_SM_FLOPS]
    t_c = ceil_div(d * nkv * splits, sms) * cta_s
    t_m = d * context * cf[F_ATT_KV_TOK] / cf[F_ATT_BW]
    return 2 * cf[F_DEC_LAUNCH] + blend(t_c, t_m, cf[F_BLEND])


@njit(cache=True)
def device_time(ci, cf, tab, ek, ec, edec, ne, tokens, sampled, pairs, kv, npf, nd):
    """``KernelDeviceModel.time_scheduled``: ``(seconds, utilisation)`` of one schedule.

    ``tab[0]``, ``tab[1]``, ``tab[2]``: one layer's per-token part by token count, the LM head and the sampler by
    sampled rows (the reference's cached values, filled by the caller)."""
    att = 0.0
    csum = 0
    if npf:
        for j in range(ne):
            if not edec[j]:
                att += prefill_time(ci, cf, ek[j], ec[j])
                csum += ec[j]
    if nd:
        dec_ctx = kv - csum + nd
        ctx = np.int64(np.ceil(dec_ctx / nd))
        att += decode_time(ci, cf, nd, max(1, ctx))
    total = ci[C_LAYERS] * (tab[0, tokens] + att) + tab[1, sampled] + tab[2, sampled]
    lin = cf[F_LIN_FLOPS] * tokens + cf[F_HEAD_FLOPS] * sampled
    ideal = ((lin + cf[F_PAIR_FLOPS] * pairs) / cf[F_PEAK]
             + (cf[F_WEIGHT] + cf[F_ACT] * tokens + cf[F_KV_TOK] * (kv + tokens)) / cf[F_HBM])
    return total, min(1.0, ideal / total)
