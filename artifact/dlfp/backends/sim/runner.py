"""Simulator backend: one trial (experiment x arm x seed) on ``dlfp.backends.sim`` -> ``Trial`` (backend="sim").

``backend_options`` understood (all optional)::

    enforce_eager: false                                # vLLM's --enforce-eager (the real backends read it too)

    sim:
      host: {<HostCosts field>: seconds, ...}          # override host costs
      device: {<DeviceAssumptions field>: value, ...}  # override device assumptions
      reserve_gib: 2.0                                  # non-KV memory per GPU besides the weights (GiB);
                                                        # default: profiled as vLLM 0.17.1 does (kv_sizing)
      num_gpu_blocks: <int>                             # force the KV-cache size (tests)
      prefix_caching: true                              # a resumed request hits its own cached blocks
                                                        # (vLLM 0.17.1's default, CacheConfig.enable_prefix_caching)
      frontend: completions                             # the API server the client talks to: completions (text
                                                        # prompts, as `vllm bench serve` sends them), completions_ids,
                                                        # chat, or none (no API server, as the real-engine trials
                                                        # here); default completions on a datasheet GPU, none on a
                                                        # fitted CPU profile (dlfp.devices.frontend)

Token ids are deterministic and identical in every arm: id = splitmix64(h(request_id) + index) mod vocab_size,
with h = the first 8 bytes of blake2b(request_id). Token time = when output processing of the iteration that
produced it has finished on the host plus the frontend delay (``HostCosts.frontend_output_s``).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from dlfp.devices import roofline as cm
from dlfp.config import ConfigError, ExperimentConfig, build_policy
from dlfp.policies.base import reason_runs
from dlfp.backends.sim import HostCosts, SimEngine
from dlfp.devices.frontend import FrontendCosts, frontend_costs
from dlfp.traces.format import (FORMAT_VERSION, REQUEST_COLUMNS, TOKEN_COLUMNS, Trial, coerce, git_commit,
                               package_versions)
from dlfp.traces.token_ids import token_ids

@lru_cache(maxsize=1)
def _provenance() -> tuple[dict, str]:
    """Package versions and git commit, looked up once per process (both fixed while it runs)."""
    return package_versions(), git_commit()


_OPTION_KEYS = {"host", "device", "reserve_gib", "num_gpu_blocks", "prefix_caching", "frontend"}
_DEVICE_MODELS: dict[tuple, cm.DeviceModel] = {}


def _device_model(model, gpu, tp: int, dev: cm.DeviceAssumptions) -> cm.DeviceModel:
    """One ``DeviceModel`` per (model spec, GPU spec, TP, assumptions) in this process.

    Its per-chunk caches are pure functions of their arguments, so the trials of one process share them: the same
    values, computed once (modelling the attention of one prefill chunk takes about 0.3 ms). Keyed by the specs'
    values (their ``repr``: every field), so an edited spec or assumption gets a model of its own.
    """
    key = (repr(model), repr(gpu), tp, repr(dev))
    dm = _DEVICE_MODELS.get(key)
    if dm is None:
        if len(_DEVICE_MODELS) >= 32:
            _DEVICE_MODELS.clear()
        dm = _DEVICE_MODELS[key] = cm.DeviceModel(model, gpu, tp, dev)
    return dm


def _sim_options(cfg: ExperimentConfig) -> dict:
    opts = dict(cfg.backend_options.get("sim", {}) or {})
    bad = sorted(set(opts) - _OPTION_KEYS)
    if bad:
        raise ConfigError(f"field backend_options.sim.{bad[0]}: unknown; known: {', '.join(sorted(_OPTION_KEYS))}")
    return opts


def prefix_caching(cfg: ExperimentConfig) -> bool:
    """``backend_options.sim.prefix_caching`` (default True, vLLM 0.17.1's ``CacheConfig.enable_prefix_caching``).

    Raises:
        ConfigError: not a boolean (naming the field).
    """
    v = _sim_options(cfg).get("prefix_caching", True)
    if not isinstance(v, bool):
        raise ConfigError(f"field backend_options.sim.prefix_caching: expected true or false, got {v!r}")
    return v


def frontend(cfg: ExperimentConfig, gpu) -> FrontendCosts:
    """The API server's costs: ``backend_options.sim.frontend`` (an endpoint of ``dlfp.devices.frontend.ENDPOINTS``),
    by default ``completions`` on a datasheet GPU (the paper's ``vllm bench serve`` client: text prompts to
    ``/v1/completions``, an inference from its metrics) and ``none`` on a fitted profile (``gpu.host`` set: the
    real-engine trials it describes drive ``AsyncLLM`` without an API server).

    Raises:
        ConfigError: an unknown endpoint (naming the field and the known ones).
    """
    name = _sim_options(cfg).get("frontend", "none" if gpu.host else "completions")
    try:
        return frontend_costs(str(name))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def enforce_eager(cfg: ExperimentConfig) -> bool:
    """``backend_options.enforce_eager`` (vLLM's ``--enforce-eager``; default false, as vLLM's on a GPU).

    Raises:
        ConfigError: not a boolean (naming the field).
    """
    v = cfg.backend_options.get("enforce_eager", False)
    if not isinstance(v, bool):
        raise ConfigError(f"field backend_options.enforce_eager: expected true or false, got {v!r}")
    return v


def build_engine_parts(cfg: ExperimentConfig):
    """Validate the engine side of ``cfg``: ``(model, gpu, device_model, host_costs, num_gpu_blocks)``.

    Raises:
        ConfigError: unknown model or GPU (lists the known ones), a TP degree the model cannot
            split, weights that do not fit, a bad backend option; message names the field.
    """
    opts = _sim_options(cfg)
    try:
        model = cm.load_model(cfg.model)
        gpu = cm.load_gpu(cfg.gpu)
        model.check_tp(cfg.tp)
        dev = cm.DeviceAssumptions(**(opts.get("device") or {}))
        frontend(cfg, gpu)  # an unknown endpoint is refused before anything runs
        dm = _device_model(model, gpu, cfg.tp, dev)
        # a measured profile (kind: fitted) carries its own host costs; backend_options.sim.host overrides them
        host = HostCosts.from_dict({**(gpu.host or {}), **(opts.get("host") or {})})
        blocks = opts.get("num_gpu_blocks")
        if blocks is None:
            reserve = opts.get("reserve_gib")
            blocks = cm.kv_cache_blocks(model, gpu, cfg.tp, gpu_memory_utilization=cfg.gpu_memory_utilization,
                                        block_size=cfg.block_size,
                                        reserve_gib=None if reserve is None else float(reserve),
                                        max_num_batched_tokens=cfg.max_num_batched_tokens,
                                        max_num_seqs=cfg.max_num_seqs)
    except (cm.CostModelError, ValueError, TypeError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"experiment {cfg.name!r}: {e}") from None
    return model, gpu, dm, host, int(blocks)


def check_requests(cfg: ExperimentConfig, requests: Sequence, num_gpu_blocks: int) -> None:
    """Reject a workload the engine cannot serve, before running.

    Raises:
        ConfigError: a request longer than ``max_model_len`` or than the KV cache
            (``num_gpu_blocks * block_size`` tokens), naming the field.
    """
    if not requests:
        raise ConfigError(f"experiment {cfg.name!r}: field workload: no requests")
    longest = max(int(r.prompt_tokens) + int(r.output_tokens) for r in requests)
    if longest > cfg.max_model_len:
        raise ConfigError(f"experiment {cfg.name!r}: field max_model_len: {cfg.max_model_len} is shorter than the "
                          f"longest request ({longest} prompt + output tokens)")
    cap_tokens = num_gpu_blocks * cfg.block_size
    if longest > cap_tokens:
        raise ConfigError(f"experiment {cfg.name!r}: field gpu_memory_utilization: KV cache holds {cap_tokens} "
                          f"tokens ({num_gpu_blocks} blocks), too small for one request of {longest} tokens")


_WORKLOADS: dict[tuple, object] = {}


def _file_stamps(workload) -> tuple | None:
    """``(path, size, mtime_ns)`` of the files a workload config reads; ``None`` when one cannot be stat'ed."""
    from dlfp.workload.replay import resolve_trace_path

    names = [getattr(getattr(workload, "trace", None), "path", None), getattr(workload, "requests_csv", None)]
    out = []
    for name in filter(None, names):
        try:
            st = resolve_trace_path(name).stat()
        except OSError:
            return None
        out.append((str(name), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _workload(cfg: ExperimentConfig, seed: int):
    """The workload instance of ``cfg`` and ``seed``, built once per process (every arm of a seed replays the
    same requests; building a trace-replay workload takes about 0.1 s). Keyed by the workload config, the seed and
    the size and modification time of the files it reads."""
    from dlfp.workload.generator import make_workload

    stamps = _file_stamps(cfg.workload)
    if stamps is None:
        return make_workload(cfg.workload, seed)
    key = (cfg.workload.model_dump_json(), int(seed), stamps)
    wi = _WORKLOADS.get(key)
    if wi is None:
        if len(_WORKLOADS) >= 16:
            _WORKLOADS.clear()
        wi = _WORKLOADS[key] = make_workload(cfg.workload, seed)
    return wi


def run_trial(cfg: ExperimentConfig, arm: str, seed: int, progress: Callable[[int, int], None] | None = None,
              workload=None) -> Trial:
    """Simulate one trial and return it (nothing written).

    ``workload`` (a ``WorkloadInstance``) may be passed to avoid rebuilding it.

    Raises:
        ValueError: unknown arm.
        ConfigError: see ``build_engine_parts`` and ``check_requests``.
    """
    cfg.require_arm(arm)
    model, gpu, dm, host, blocks = build_engine_parts(cfg)
    wi = workload if workload is not None else _workload(cfg, seed)
    reqs = wi.requests
    check_requests(cfg, reqs, blocks)
    policy = build_policy(cfg.arms[arm])
    fe = frontend(cfg, gpu)
    eng = SimEngine(dm, policy, scheduling=cfg.scheduling, max_num_batched_tokens=cfg.max_num_batched_tokens,
                    max_num_seqs=cfg.max_num_seqs, block_size=cfg.block_size, num_gpu_blocks=blocks,
                    max_model_len=cfg.max_model_len, host=host, prefix_caching=prefix_caching(cfg),
                    enforce_eager=enforce_eager(cfg), frontend=fe)
    res = eng.run(reqs, progress=progress, concurrency=wi.concurrency)
    rq = wi.requests_frame()
    rq["finished"] = res.finished
    if res.sent is not None:  # closed loop: the arrival is when the client sent it (bench serve's start_time)
        rq["arrival_s"] = res.sent
    # traces.validate wants one fingerprint for all rows (the workload's); requests_frame gives per-request ones
    rq["fingerprint"] = wi.fingerprint
    rq = coerce(rq, REQUEST_COLUMNS, "requests")
    counts = np.fromiter((len(t) for t in res.token_times), dtype=np.int64, count=len(reqs))
    rid_arr = np.array([r.request_id for r in reqs], dtype=object)
    rep = np.repeat(rid_arr, counts)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    idx = np.arange(int(counts.sum()), dtype=np.int64) - starts
    times = np.fromiter((x for t in res.token_times for x in t), dtype=float, count=int(counts.sum()))
    tk = pd.DataFrame({
        "request_id": pd.array(rep, dtype="string"),
        "index": idx,
        "token_id": token_ids(rep.astype(str), idx, model.vocab_size) if len(idx) else np.zeros(0, np.int64),
        "time_s": times,
    })
    tk = coerce(tk, TOKEN_COLUMNS, "tokens")
    params = policy.params() if hasattr(policy, "params") else {"name": getattr(policy, "name", "?")}
    md = {
        "format_version": FORMAT_VERSION,
        "experiment": cfg.name,
        "arm": arm,
        "seed": int(seed),
        "backend": "sim",
        "versions": dict(_provenance()[0]),
        "hardware": {"gpu": gpu.describe(), "tp": cfg.tp, "num_gpus": cfg.tp, "modelled": True,
                     "description": f"modelled {cfg.tp} x {gpu.name} (simulator, no GPU used)"},
        "git_commit": _provenance()[1],
        "workload_fingerprint": wi.fingerprint,
        "policy": params,
        "config": cfg.model_dump(mode="json"),
        "energy": {"joules": float(res.energy_j), "source": "modelled",
                   "method": "per GPU: idle_w + (tdp_w - idle_w) x roofline utilisation over each iteration's "
                             "device time; idle_w between iterations; summed over tp GPUs, t = 0 .. last token",
                   "busy_joules": float(res.busy_energy_j), "span_s": float(res.end_s)},
        "clock": "sim",
        "sim": {"host_costs": host.as_dict(), "frontend": fe.as_dict(),
                "device_assumptions": {k: getattr(dm.a, k) for k in dm.a.__dataclass_fields__},
                "num_gpu_blocks": blocks, "num_preemptions": res.num_preemptions,
                "num_cached_tokens_hit": res.extra.get("num_cached_tokens_hit", 0),
                "num_schedule_calls": res.num_schedule_calls, "model": {"key": model.key, "source": model.source}},
    }
    if getattr(policy, "logs_reasons", False):  # DLFP-G: the reason of every decision, for the cap trajectory
        md["decisions"] = reason_runs([d.iteration for d in policy.decisions], [d.reason for d in policy.decisions])
    return Trial(requests=rq, tokens=tk, iterations=res.iterations, metadata=md)
