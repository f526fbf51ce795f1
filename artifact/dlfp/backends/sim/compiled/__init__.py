"""The simulator's compiled core (numba): one ``SimEngine.run`` as compiled array code, bit-identical to the Python
reference path (``dlfp.backends.sim.engine._Run``), which stays the specification and is what the tests compare it to.

Covered: both engine loops, the scheduler with prefix caching, the API server's queue, the kernel-level device model
(``dlfp.devices.kernel_model``) and the policies NoCap, FixedCap, DLFP and DLFP-G. Anything else (DLFP-S, a
policy of one's own, the roofline or a fitted CPU device model) runs on the reference path, and the first such run in
a process says so on standard error. ``DLFP_SIM_CORE=reference`` in the environment forces the reference path.

The device model's per-token-count parts (one layer's projections, elementwise kernels and all-reduces; the LM head;
the sampler) are tabulated from the reference's own functions once per device model and token budget, so the
compiled path reads the very same floats; attention and the decode split are recomputed in compiled code.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dlfp.backends.sim.compiled import layout as L
from dlfp.policies.base import Decision

def _drop_stale_cache() -> None:
    """Delete numba's cached machine code of this package when any of its sources changed since it was compiled.

    numba keys a cached function by its own file alone, while these functions read constants from ``layout`` and
    the DLFP-G estimator and call each other across files: an edit there would leave stale code in use. The sha256
    of all of them is kept beside the cache (``__pycache__/dlfp-compiled.sha256``); unreadable or unwritable, the
    cache is left as numba keeps it.
    """
    from dlfp.fingerprint import file_sha256, listing_sha256
    from dlfp.policies.dlfpg import estimator

    here = Path(__file__).resolve().parent
    sources = sorted(here.glob("*.py")) + [Path(estimator.__file__).resolve()]
    digest = listing_sha256((p.name, file_sha256(p)) for p in sources)
    cache = here / "__pycache__"
    stamp = cache / "dlfp-compiled.sha256"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    try:
        for f in cache.glob("*.nb[ci]"):
            f.unlink(missing_ok=True)
        cache.mkdir(exist_ok=True)
        tmp = cache / f"dlfp-compiled.sha256.{os.getpid()}"
        tmp.write_text(digest)
        tmp.replace(stamp)
    except OSError:
        pass


_drop_stale_cache()

#: environment variable that picks the path: ``compiled`` (default) or ``reference``
CORE_ENV = "DLFP_SIM_CORE"
CORES = ("compiled", "reference")
_NOTICED: set[str] = set()


def requested_core() -> str:
    """The path ``DLFP_SIM_CORE`` asks for (default ``compiled``).

    Raises:
        ValueError: an unknown value, naming the variable and the known values.
    """
    v = os.environ.get(CORE_ENV, "compiled").strip() or "compiled"
    if v not in CORES:
        raise ValueError(f"environment variable {CORE_ENV}: unknown core {v!r}; known: {', '.join(CORES)}")
    return v


def policy_kind(policy) -> int | None:
    """The compiled form of ``policy`` (``layout.NOCAP``, ``FIXED``, ``DLFP``), or ``None`` without one.

    Exact classes only: a subclass may change what ``prefill_cap`` or ``observe`` do."""
    from dlfp.policies.baselines import FixedCap, NoCap
    from dlfp.policies.dlfp import DLFP
    from dlfp.policies.dlfpg import DLFPG

    return {NoCap: L.NOCAP, FixedCap: L.FIXED, DLFP: L.DLFP, DLFPG: L.DLFPG}.get(type(policy))


def unsupported(engine) -> str | None:
    """Why ``engine`` cannot run compiled (one phrase), or ``None`` when it can."""
    from dlfp.devices.kernel_model import KernelDeviceModel

    if policy_kind(engine.policy) is None:
        return f"policy {getattr(engine.policy, 'name', type(engine.policy).__name__)!r} has no compiled form"
    dm = engine.dm
    if type(dm) is not KernelDeviceModel:
        return f"device model {type(dm).__name__} has no compiled form"
    if dm.att.c.gemm.blend_p != dm.ops.c.gemm.blend_p:
        return "attention and GEMM blend exponents differ"
    return None


def notice_once(reason: str) -> None:
    """Say once per process and reason that a run takes the reference path."""
    if reason not in _NOTICED:
        _NOTICED.add(reason)
        print(f"dlfp: {reason}; simulating it on the reference path (slower, same results)", file=sys.stderr)


def _tables(dm, budget: int, max_seqs: int) -> np.ndarray:
    """``(3, max(budget, max_seqs) + 1)``: one layer's per-token part by tokens, the LM head and the sampler by
    sampled rows (seconds), from the device model's own cached functions; kept on the model per size."""
    cache = dm.__dict__.setdefault("_compiled_tables", {})
    key = (budget, max_seqs)
    tab = cache.get(key)
    if tab is None:
        tab = np.zeros((3, max(budget, max_seqs) + 1))
        tab[0, 1:budget + 1] = [dm._per_token(t) for t in range(1, budget + 1)]
        tab[1, :max_seqs + 1] = [dm._head(s) for s in range(max_seqs + 1)]
        tab[2, :max_seqs + 1] = [dm._sampler(s) for s in range(max_seqs + 1)]
        cache[key] = tab
    return tab


def _int_config(engine, kind: int, concurrency: int | None) -> np.ndarray:
    s, h, dm, pol = engine.sched, engine.host, engine.dm, engine.policy
    ci = np.zeros(L.NUM_C, np.int64)
    nq, nkv = dm.shape.heads(dm.tp)
    gmax = h.cudagraph_max_tokens
    vals = {L.C_BUDGET: s.budget, L.C_MAXSEQ: s.max_num_seqs, L.C_BS: s.bs, L.C_MAXLEN: s.max_model_len,
            L.C_ASYNC: engine.async_, L.C_PREFIX: s.prefix_caching, L.C_CONC: concurrency or 0,
            L.C_MAXSTEPS: min(engine.max_steps, 2**62), L.C_POLICY: kind, L.C_HOSTSIG: engine._host_sig,
            L.C_FIXCAP: pol.cap if kind == L.FIXED else 0, L.C_FE: engine.frontend_costs is not None,
            L.C_GMAX: min(math.floor(gmax), 2**62) if math.isfinite(gmax) else 2**62,
            L.C_LAYERS: dm.layers, L.C_TP: dm.tp, L.C_NQ: nq, L.C_NKV: nkv, L.C_SMS: dm.att.sms}
    if kind == L.DLFP:
        vals.update({L.C_MINCAP: pol.min_cap, L.C_MAXCAP: pol.max_cap, L.C_QUANTUM: pol.quantum})
    if kind == L.DLFPG:
        o = pol.options
        vals.update({L.C_G_MIN: pol.min_chunk, L.C_G_MAX: pol.max_chunk, L.C_G_Q: pol.quantum,
                     L.C_G_WARM: o.warmup_samples, L.C_G_CTX: pol.estimator.use_context, L.C_G_EST: o.use_estimate,
                     L.C_G_GUARD: o.use_ttft_guard, L.C_G_BUDGET: pol.ttft_budget_s is not None})
    for k, v in vals.items():
        ci[k] = int(v)
    return ci


def _float_config(engine, kind: int) -> np.ndarray:
    h, dm, pol, fe = engine.host, engine.dm, engine.policy, engine.frontend_costs
    from dlfp.devices.frontend import TOKENIZE_WINDOW_S

    cf = np.zeros(L.NUM_F)
    launch = engine._launch  # the reference's own rule, evaluated at its three outcomes
    vals = {L.F_INGEST: h.ingest_s, L.F_SCHED_BASE: h.schedule_base_s, L.F_SCHED_REQ: h.schedule_per_req_s,
            L.F_PREP_BASE: h.prep_base_s, L.F_PREP_REQ: h.prep_per_req_s, L.F_PREP_TOK: h.prep_per_token_s,
            L.F_SAMPLE_LAUNCH: h.sample_launch_s, L.F_BK_BASE: h.bookkeeping_base_s,
            L.F_BK_REQ: h.bookkeeping_per_req_s, L.F_UP_BASE: h.update_base_s, L.F_UP_REQ: h.update_per_req_s,
            L.F_FE_OUT: h.frontend_output_s, L.F_LOOP: h.engine_loop_s, L.F_GRAPH: launch(0, 0),
            L.F_PIECEWISE: launch(0, 1), L.F_EAGER: launch(2**62, 0), L.F_TOK_WINDOW: TOKENIZE_WINDOW_S,
            L.F_LIN_FLOPS: dm.lin_flops_tok, L.F_HEAD_FLOPS: dm.head_flops_tok, L.F_PAIR_FLOPS: dm.attn_flops_pair,
            L.F_PEAK: dm.gpu.peak_flops, L.F_WEIGHT: dm.weight_bytes, L.F_ACT: dm.act_bytes_tok,
            L.F_KV_TOK: dm.kv_bytes_tok, L.F_HBM: dm.gpu.hbm_bw, L.F_IDLE: dm.idle_w, L.F_TDP: dm.tdp_w,
            L.F_HD: dm.shape.hd, L.F_BM: dm.att.a.block_m, L.F_BN: dm.att.a.block_n, L.F_SM_FLOPS: dm.att.sm_flops,
            L.F_ATT_BW: dm.att.bw, L.F_ATT_LAUNCH: dm.att.c.gemm.launch_s, L.F_DEC_LAUNCH: dm.ops.c.gemm.launch_s,
            L.F_BLEND: dm.ops.c.gemm.blend_p, L.F_SKV_N: dm.att.a.splitkv_block_n,
            L.F_SKV_M: dm.att.a.splitkv_block_m, L.F_ATT_KV_TOK: dm._kv_bytes_tok, L.F_DTYPE: dm.shape.dtype_bytes}
    if fe is not None:
        vals.update({L.F_REQ_S: fe.request_s, L.F_REQ_TOK: fe.request_per_token_s,
                     L.F_TOKENIZE: fe.tokenize_per_token_s, L.F_OUT_S: fe.output_s,
                     L.F_OUT_TOK: fe.output_per_token_s})
    if kind == L.DLFP:
        vals.update({L.F_TARGET: pol.target_s, L.F_GAIN: pol.gain})
    if kind == L.DLFPG:
        vals.update({L.F_G_ITL: pol.itl_target_s, L.F_G_AIM: pol.aim_s, L.F_G_TTFT: pol.ttft_budget_s or 0.0,
                     L.F_G_TRUST: pol.options.trust_factor, L.F_G_GUARDF: pol.options.ttft_guard_factor,
                     L.F_G_LAM: pol.estimator.lam})
    for k, v in vals.items():
        cf[k] = float(v)
    return cf


def _state(engine, P: np.ndarray, M: np.ndarray, arrival: np.ndarray, concurrency: int | None):
    """The per-run arrays (``dlfp.backends.sim.compiled.engine``'s ``st``) and the scalars ``si``, ``sf``."""
    n, s = len(P), engine.sched
    rq = np.zeros((n, 10), np.int64)
    rq[:, L.R_P], rq[:, L.R_M], rq[:, L.R_FSEG] = P, M, -1
    nseg = s.num_gpu_blocks + 2
    seg = np.full((nseg, 4), -1, np.int64)
    stack = np.zeros(nseg, np.int64)  # free segment slots, a stack; slot 0 holds the initial segment
    stack[:nseg - 1] = np.arange(nseg - 1, 0, -1)
    si = np.zeros(L.NUM_S, np.int64)
    si[[L.S_LAST, L.S_QHEAD, L.S_QTAIL]] = -1
    si[L.S_UNFIN], si[L.S_FREE], si[L.S_SEGTOP] = n, s.free_blocks, nseg - 2
    if s.prefix_caching:
        seg[0, L.G_CNT], seg[0, L.G_PREV], seg[0, L.G_NEXT] = s.num_gpu_blocks, -1, -1
        si[L.S_QHEAD] = si[L.S_QTAIL] = 0
    if policy_kind(engine.policy) == L.DLFP:
        si[L.S_CAP] = engine.policy.cap
    width = s.max_num_seqs + 1
    send, release = arrival.copy(), arrival.copy()
    vis = arrival + engine.host.ingest_s if engine.frontend_costs is None else np.full(n, np.inf)
    if concurrency is not None:  # closed loop: only the first `concurrency` requests are sent at t = 0
        send[concurrency:] = np.inf
        vis[concurrency:] = np.inf
        si[L.S_NEXT_SEND] = min(concurrency, n)
    toff = np.concatenate(([0], np.cumsum(M)[:-1])).astype(np.int64)
    st = (rq, seg, stack, np.zeros(n + 1, np.int64), np.zeros(n + 1, np.int64), np.zeros((width, 5), np.int64),
          np.zeros((L.NSLOT, width, 2), np.int64), np.zeros((L.NSLOT, 2), np.int64), np.zeros(L.NSLOT), send, vis,
          release, np.full(int(M.sum()), np.nan), toff, _dlfpg_state(engine.policy))
    return st, si, np.zeros(L.NUM_T)


def _dlfpg_state(policy) -> tuple:
    """DLFP-G's state as arrays (``dlfp.backends.sim.compiled.dlfpg``), from the policy as it is; placeholders of
    the same types for any other policy (one compiled signature for all)."""
    from dlfp.policies.dlfpg import REASONS

    gi = np.zeros(L.NUM_GI, np.int64)
    ich, irs = np.zeros(L.G_ISSUED, np.int64), np.zeros(L.G_ISSUED, np.int64)
    if policy_kind(policy) != L.DLFPG:
        return np.zeros(1), np.zeros((1, 1)), gi, np.zeros(1), ich, irs
    e = policy.estimator
    gi[[L.GI_SAMPLES, L.GI_PREFILL_SAMPLES, L.GI_LARGEST, L.GI_CHUNK, L.GI_GRANTS, L.GI_LEN]] = (
        e.samples, e.prefill_samples, e.largest_prefill, policy.chunk, policy.guard_grants, len(policy._issued))
    for j, (c, r) in enumerate(policy._issued):
        ich[j], irs[j] = c, REASONS.index(r)
    return np.array(e.theta, float), np.array(e.P, float), gi, np.array([e.largest_prefill_s], float), ich, irs


_ERRORS = {L.ERR_STUCK: "engine cannot schedule any request (KV cache too small?)",
           L.ERR_IDLE: "engine idle with unfinished requests (internal error)"}


def _raise(err: int, engine, si: np.ndarray) -> None:
    """The reference path's exception for error code ``err``."""
    if err == L.ERR_STEPS:
        raise RuntimeError(f"simulation exceeded {engine.max_steps} engine steps without finishing")
    if err == L.ERR_INTERVAL:
        k = int(si[L.S_LAST]) if si[L.S_LAST] >= 0 else int(si[L.S_IT]) - 1
        raise ValueError(f"observed interval must be a positive finite number of seconds (iteration {k})")
    raise RuntimeError(_ERRORS[err])


def run(engine, requests, progress=None, concurrency: int | None = None):
    """``SimEngine.run`` on the compiled core: the same ``SimResult``, bit for bit; the policy's ``decisions`` and
    cap end as the reference path leaves them. ``progress`` is called once, at the end.

    Raises:
        RuntimeError, ValueError: as the reference path, for the same runs.
    """
    from dlfp.backends.sim.compiled.engine import simulate
    from dlfp.backends.sim.engine import SimResult

    kind = policy_kind(engine.policy)
    n = len(requests)
    P = np.fromiter((int(r.prompt_tokens) for r in requests), np.int64, n)
    M = np.fromiter((int(r.output_tokens) for r in requests), np.int64, n)
    arrival = np.fromiter((float(r.arrival_s) for r in requests), float, n)
    st, si, sf = _state(engine, P, M, arrival, concurrency)
    s = engine.sched
    tab = _tables(engine.dm, s.budget, s.max_num_seqs)
    rows = np.empty((max(1024, int(M.sum()) // 4), L.NUM_W))
    rows = simulate(_int_config(engine, kind, concurrency), _float_config(engine, kind), si, sf, tab, st, rows)
    if si[L.S_ERR]:
        _raise(int(si[L.S_ERR]), engine, si)
    rows = rows[:si[L.S_IT]]
    _finish_policy(engine.policy, kind, rows, si, st[14])
    rq, times, toff = st[0], st[12], st[13]
    token_times = [t.tolist() for t in np.split(times, toff[1:])] if n else []
    end_s = max((t[-1] for t in token_times if t), default=float(sf[L.T_NOW]))
    dm = engine.dm
    busy_e, busy_t = float(sf[L.T_BUSYE]), float(sf[L.T_BUSYT])
    energy = busy_e + max(0.0, end_s - busy_t) * dm.idle_w * dm.tp
    if progress is not None:
        progress(n, n)
    return SimResult(token_times=token_times, finished=rq[:, L.R_ST] == L.FINISHED,
                     iterations=iteration_frame(rows, engine.policy.signal), energy_j=energy, busy_energy_j=busy_e,
                     end_s=end_s, num_preemptions=int(si[L.S_NPREEMPT]), num_gpu_blocks=s.num_gpu_blocks,
                     num_schedule_calls=int(si[L.S_CALLS]), sent=st[9].tolist() if concurrency is not None else None,
                     extra={"num_cached_tokens_hit": int(si[L.S_HIT])})


def _caps(col: np.ndarray):
    """A cap column (``-1``: none) as nullable ``Int64``, as the reference path's ``None``/int list gives it."""
    return pd.arrays.IntegerArray(np.where(col < 0, 0, col).astype(np.int64), col < 0)


#: the row field of each iteration-frame column (``dlfp.backends.sim.engine.iteration_frame``)
_FRAME_COLUMNS = {"iteration": L.W_IT, "schedule_s": L.W_SCHED, "prefill_tokens": L.W_PTOK, "num_prefills": L.W_NPF,
                  "num_decodes": L.W_ND, "guarded": L.W_GUARDED, "observed_interval_s": L.W_OBS_IV,
                  "host_interval_s": L.W_HOST_IV, "device_time_s": L.W_DEV, "issue_s": L.W_ISSUE,
                  "device_start_s": L.W_START, "device_end_s": L.W_END, "energy_j": L.W_ENERGY}


def iteration_frame(rows: np.ndarray, signal: str) -> pd.DataFrame:
    """The ``ITERATION_COLUMNS`` frame of compiled iteration rows."""
    from dlfp.backends.sim.engine import iteration_frame as frame

    return frame({name: rows[:, w] for name, w in _FRAME_COLUMNS.items()}, _caps(rows[:, L.W_CAP]),
                 _caps(rows[:, L.W_CAP_AFTER]), signal)


def _finish_dlfpg(policy, g: tuple) -> None:
    """DLFP-G's state back from its arrays (estimator, proportional chunk, guard grants, issued chunks)."""
    from dlfp.policies.dlfpg import REASONS

    th, P, gi, lp, ich, irs = g
    e = policy.estimator
    e.theta, e.P, e.largest_prefill_s = th.tolist(), P.tolist(), float(lp[0])
    e.samples, e.prefill_samples, e.largest_prefill = (int(gi[k]) for k in (L.GI_SAMPLES, L.GI_PREFILL_SAMPLES,
                                                                            L.GI_LARGEST))
    policy.chunk, policy.guard_grants = int(gi[L.GI_CHUNK]), int(gi[L.GI_GRANTS])
    policy._issued.clear()
    for m in range(int(gi[L.GI_LEN])):
        j = (int(gi[L.GI_HEAD]) + m) % L.G_ISSUED
        policy._issued.append((int(ich[j]), REASONS[int(irs[j])]))


def _finish_policy(policy, kind: int, rows: np.ndarray, si: np.ndarray, g: tuple) -> None:
    """Leave ``policy`` as the reference path would: its final cap and one ``Decision`` per observation."""
    if kind == L.DLFP:
        policy.cap = int(si[L.S_CAP])
    if kind == L.DLFPG:
        _finish_dlfpg(policy, g)
    obs = rows[rows[:, L.W_REASON] >= 0]
    if not len(obs):
        return

    def cap(v):
        return None if v < 0 else int(v)

    sig = policy.signal
    policy.decisions.extend(
        Decision(int(it), t, cap(b), cap(a), iv, sig, int(pt), int(nd), bool(gd), L.REASONS[int(rs)])
        for it, t, b, a, iv, pt, nd, gd, rs in obs[:, [L.W_IT, L.W_OBS_T, L.W_CAP_BEFORE, L.W_CAP_AFTER, L.W_OBS_IV,
                                                   L.W_PTOK, L.W_ND, L.W_GUARDED, L.W_REASON]].tolist())
