"""The array layout of the compiled core: field indices of its state arrays, codes and sizes.

Numba reads these module constants as compile-time constants. ``rq[i, R_*]`` per request (int64), ``ci[C_*]`` /
``cf[F_*]`` the run's configuration (int64 / float64), ``si[S_*]`` / ``sf[T_*]`` the mutable scalars, ``rows[k, W_*]``
one row per executed iteration (float64; ``-1`` is "no cap", NaN "unknown"), ``seg[j, G_*]`` the free-block queue
of prefix caching as a doubly linked list of segments (at most one per free block).
"""
from __future__ import annotations

import numpy as np

INF = np.inf
NOCAP, FIXED, DLFP, DLFPG = 0, 1, 2, 3  # policy kinds with a compiled form
RUNNING, PREEMPTED, FINISHED = 1, 2, 3  # as dlfp.backends.sim.scheduler (WAITING is 0)
# request fields
R_P, R_M, R_COMP, R_OUT, R_PH, R_BLK, R_ST, R_PRE, R_CFULL, R_FSEG = range(10)
# integer configuration
(C_BUDGET, C_MAXSEQ, C_BS, C_MAXLEN, C_ASYNC, C_PREFIX, C_CONC, C_MAXSTEPS, C_POLICY, C_HOSTSIG, C_FIXCAP,
 C_MINCAP, C_MAXCAP, C_QUANTUM, C_FE, C_GMAX, C_LAYERS, C_TP, C_NQ, C_NKV, C_SMS,
 C_G_MIN, C_G_MAX, C_G_Q, C_G_WARM, C_G_CTX, C_G_EST, C_G_GUARD, C_G_BUDGET) = range(29)
NUM_C = 29
# float configuration
(F_INGEST, F_SCHED_BASE, F_SCHED_REQ, F_PREP_BASE, F_PREP_REQ, F_PREP_TOK, F_SAMPLE_LAUNCH, F_BK_BASE, F_BK_REQ,
 F_UP_BASE, F_UP_REQ, F_FE_OUT, F_LOOP, F_GRAPH, F_PIECEWISE, F_EAGER, F_REQ_S, F_REQ_TOK, F_TOKENIZE, F_OUT_S,
 F_OUT_TOK, F_TOK_WINDOW, F_LIN_FLOPS, F_HEAD_FLOPS, F_PAIR_FLOPS, F_PEAK, F_WEIGHT, F_ACT, F_KV_TOK, F_HBM, F_IDLE,
 F_TDP, F_HD, F_BM, F_BN, F_SM_FLOPS, F_ATT_BW, F_ATT_LAUNCH, F_DEC_LAUNCH, F_BLEND, F_SKV_N, F_SKV_M, F_ATT_KV_TOK,
 F_TARGET, F_GAIN, F_DTYPE, F_G_ITL, F_G_AIM, F_G_TTFT, F_G_TRUST, F_G_GUARDF, F_G_LAM) = range(52)
NUM_F = 52
# mutable scalars
(S_NEXT_ARR, S_FE_NEXT, S_NEXT_SEND, S_UNFIN, S_IT, S_CALLS, S_LAST, S_WHEAD, S_NWAIT, S_NRUN, S_FREE, S_NPREEMPT,
 S_HIT, S_QHEAD, S_QTAIL, S_SEGTOP, S_CAP, S_ERR, S_QLEN) = range(19)
NUM_S = 19
T_NOW, T_DEVFREE, T_BUSYE, T_BUSYT, T_LOOPFREE, T_TOKFREE = range(6)
NUM_T = 6
# iteration row fields (the first 15 as dlfp.backends.sim.engine._FRAME_FIELDS), then the policy's decision
(W_IT, W_SCHED, W_PTOK, W_NPF, W_ND, W_CAP, W_CAP_AFTER, W_GUARDED, W_OBS_IV, W_HOST_IV, W_DEV, W_ISSUE, W_START,
 W_END, W_ENERGY, W_PROCESSED, W_OBS_T, W_CAP_BEFORE, W_REASON, W_PPAIRS, W_DCTX) = range(21)
NUM_W = 21
#: W_REASON codes, as the policies' ``Decision.reason``: NoCap, FixedCap, DLFP, then DLFP-G's from G_REASON0
#: (``dlfp.policies.dlfpg.controller.REASONS`` in order)
REASONS = ("nocap", "fixed", "unguarded", "proportional", "warmup", "proportional", "estimate", "max_chunk",
           "trust_limit", "infeasible", "ttft_guard", "no_cap", "no_prefill")
G_REASON0 = 4
(G_WARMUP, G_PROPORTIONAL, G_ESTIMATE, G_MAX_CHUNK, G_TRUST_LIMIT, G_INFEASIBLE, G_TTFT_GUARD, G_NO_CAP,
 G_NO_PREFILL) = range(9)
# DLFP-G's integer state (gi) and the length of its issued-chunk queue (deque maxlen)
GI_SAMPLES, GI_PREFILL_SAMPLES, GI_LARGEST, GI_CHUNK, GI_GRANTS, GI_HEAD, GI_LEN = range(7)
NUM_GI = 7
G_ISSUED = 64
# free-block segments
G_OWNER, G_CNT, G_PREV, G_NEXT = range(4)
# errors (S_ERR), raised by the caller with the reference path's messages
ERR_STUCK, ERR_STEPS, ERR_IDLE, ERR_INTERVAL = 1, 2, 3, 4
# batch slots of the in-flight queue (depth 2, plus the one being scheduled)
NSLOT = 3


