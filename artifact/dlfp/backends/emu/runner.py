"""Emulated-device backend: vLLM 0.17.1's real engine loop over a modelled GPU, on a CPU.

``run_trial(cfg, arm, seed)`` runs the open-loop ``AsyncLLM`` harness the vLLM
backend runs (``dlfp.backends.harness``: same workload, same streaming client, same
``DLFPScheduler`` log, same engine arguments) with the model executor replaced by
:class:`dlfp.backends.emu.executor.EmuExecutor`. vLLM's real ``EngineCore`` loop
(``step``, or ``step_with_batch_queue`` under asynchronous scheduling), its
scheduler, KV-cache manager and output path all run; only the forward pass is
emulated: a device thread sleeps the cost model's time for each batch
(``dlfp.devices.roofline``, the simulator's, for the configured model, GPU and TP),
so a trial takes real time (the modelled GPU's time).

What matches the simulator (so sim vs emu isolates the engine loop): the
device model, the KV-cache size (``dlfp.backends.sim.runner.build_engine_parts``:
GPU memory x utilisation - weights/TP - reserve, per shard), the model-runner
host costs (input preparation, launch, sample launch: the simulator's
``HostCosts`` values), the output token ids (``dlfp.traces.token_ids``).
What is real: every other host cost (``schedule()``, ``update_from_output``,
ZMQ, the client) as this CPU runs it.

Asynchronous scheduling is enabled the way the prototype found works: the
executor class goes straight to ``AsyncLLM`` (``Executor.get_class`` refuses a
custom backend together with async scheduling), the ``uni`` backend stays, and
``scheduler_config.async_scheduling`` is set back to the config's value after
``create_engine_config`` (vLLM's CPU platform turns it off).
``DLFPScheduler`` then builds its ``AsyncScheduler`` twin.

``backend_options.emu`` (all optional)::

    device: {"kind": "linear", "base_s": .., "per_token_s": .., "per_decode_s": ..}
            # replaces the cost model (tests); default {"kind": "cost_model", ...}
    host: {<dlfp.devices.host.HostCosts field>: value}  # replaces the simulator's host costs
    num_gpu_blocks: <int>                                  # force the KV-cache size

``backend_options.sim`` (``host``, ``device``, ``reserve_gib``,
``num_gpu_blocks``) applies here too, as in the simulator.

The iteration log is the scheduler's (host interval, cap, signals) joined with
the executor's device log (issue, device start/end, modelled energy): the
``i``-th non-empty batch the executor runs is the scheduler's iteration ``i``
(``execute_model`` follows every ``schedule()`` call in order); the join checks
that both count the same tokens. ``device_time_s`` is the emulated device's
busy time of the batch (start to end). Clock: ``time.monotonic()`` in both
processes; 0 = trial start.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dlfp.backends import ProgressFn, harness
from dlfp.backends.sim import runner as simrun
from dlfp.backends.vllm import runner as vrun
from dlfp.config import ConfigError, ExperimentConfig, build_policy
from dlfp.devices import roofline as cm
from dlfp.traces.format import ITERATION_COLUMNS, Trial, coerce

_OPTION_KEYS = {"device", "host", "num_gpu_blocks"}


def _emu_options(cfg: ExperimentConfig) -> dict:
    opts = dict(cfg.backend_options.get("emu", {}) or {})
    bad = sorted(set(opts) - _OPTION_KEYS)
    if bad:
        raise ConfigError(f"field backend_options.emu.{bad[0]}: unknown; known: {', '.join(sorted(_OPTION_KEYS))}")
    return opts


def emu_settings(cfg: ExperimentConfig, log_path: str | None = None) -> dict[str, Any]:
    """The ``additional_config["dlfp_emu"]`` dict of a trial (see ``EmuSettings``).

    Raises:
        ConfigError: unknown model/GPU, a TP the model cannot split, weights that
            do not fit, or a bad ``backend_options.emu``/``sim`` field (named).
    """
    from dlfp.backends.emu.device import device_time_fn_from_spec
    from dlfp.devices.host import HostCosts

    opts = _emu_options(cfg)
    model, _gpu, dm, sim_host, blocks = simrun.build_engine_parts(cfg)
    device = opts.get("device") or {"kind": "cost_model", "model": cfg.model, "gpu": cfg.gpu, "tp": cfg.tp,
                                    "assumptions": dict((cfg.backend_options.get("sim") or {}).get("device") or {})}
    try:
        device_time_fn_from_spec(device)  # validate here, with a one-line error, not in the engine process
        if "host" in opts:
            host = HostCosts.from_dict({**sim_host.as_dict(), **opts["host"]})
        else:
            host = sim_host
    except (ValueError, TypeError, cm.CostModelError) as e:
        raise ConfigError(f"experiment {cfg.name!r}: field backend_options.emu: {e}") from None
    n = int(opts.get("num_gpu_blocks", blocks))
    if n < 1:
        raise ConfigError(f"experiment {cfg.name!r}: field backend_options.emu.num_gpu_blocks: must be >= 1, got {n}")
    return {"device": device, "host": host.as_dict(), "num_gpu_blocks": n, "tp": cfg.tp,
            "kernels_per_layer": int(dm.a.kernels_per_layer),
            "log_path": log_path}


def make_engine(cfg: ExperimentConfig, arm: str, settings: dict[str, Any]):
    """An ``AsyncLLM`` over ``EmuExecutor`` with the arm's DLFP scheduler, in ``cfg.scheduling`` mode.

    The modelled TP lives in the emulated device; vLLM itself runs one worker.
    """
    from vllm.v1.engine.async_llm import AsyncLLM

    from dlfp.backends.emu.executor import SETTINGS_KEY, EmuExecutor

    args = vrun.engine_args(cfg, arm, vrun.model_dir(cfg))
    args = dataclasses.replace(
        args, tensor_parallel_size=1, enforce_eager=True, dtype="float32", load_format="dummy",
        distributed_executor_backend="uni",
        additional_config={**(args.additional_config or {}), SETTINGS_KEY: settings})
    vcfg = args.create_engine_config()
    # vllm/platforms/cpu.py turns async scheduling off inside create_engine_config; nothing re-checks it later.
    vcfg.scheduler_config.async_scheduling = cfg.scheduling == "async"
    return AsyncLLM(vllm_config=vcfg, executor_class=EmuExecutor, log_stats=False, log_requests=False)


def join_device_log(iterations: pd.DataFrame, device_rows: list[dict], t0: float) -> pd.DataFrame:
    """Fill the device columns of the scheduler's iteration frame from the executor's device log.

    ``iterations``: ``ITERATION_COLUMNS`` frame with times relative to ``t0``;
    ``device_rows``: ``read_device_log`` rows (absolute ``time.monotonic()``).
    Row ``seq`` (1-based) of the device log is iteration ``seq - 1``.

    Raises:
        RuntimeError: an iteration without a device row, or one whose token
            count differs between scheduler and device (they would be out of step).
    """
    dev = {int(r["seq"]) - 1: r for r in device_rows}
    it = iterations.copy()
    cols = {c: np.full(len(it), np.nan) for c in ("issue_s", "device_start_s", "device_end_s", "device_time_s",
                                                    "energy_j")}
    for k, (i, p, d) in enumerate(zip(it["iteration"], it["prefill_tokens"], it["num_decodes"])):
        r = dev.get(int(i))
        if r is None:
            raise RuntimeError(f"emulated device log has no batch for scheduler iteration {i}")
        if int(p) + int(d) != int(r["prefill_tokens"]) + int(r["num_decodes"]):
            raise RuntimeError(f"scheduler iteration {i} ({p} prefill tokens + {d} decodes) does not match device "
                               f"batch {r['seq']} ({r['prefill_tokens']} + {r['num_decodes']})")
        cols["issue_s"][k] = r["issue_s"] - t0
        cols["device_start_s"][k] = r["device_start_s"] - t0
        cols["device_end_s"][k] = r["device_end_s"] - t0
        cols["device_time_s"][k] = r["device_end_s"] - r["device_start_s"]
        cols["energy_j"][k] = np.nan if r.get("energy_j") is None else r["energy_j"]
    for c, v in cols.items():
        it[c] = v
    return it


def run_trial(cfg: ExperimentConfig, arm: str, seed: int, progress: ProgressFn | None = None,
              workload=None) -> Trial:
    """Run one trial on the emulated device and return it (not written); ``backend="emu"``.

    Takes the modelled GPU's real time (the device sleeps it) plus ~20 s of
    engine start-up on this CPU. ``workload`` replaces the seed's workload (tests).

    Raises:
        BackendUnavailable: vLLM 0.17.1 is not installed (says what to install).
        ConfigError: unknown arm, missing model config, bad backend option, a
            request longer than max_model_len or the KV cache (one line).
        RuntimeError: the engine failed to start or crashed mid-trial (names arm and seed).
    """
    cfg.require_arm(arm)
    vllm_version = vrun.require_vllm()
    vrun.model_dir(cfg)
    policy = build_policy(cfg.arms[arm])
    from dlfp.workload.generator import make_workload

    wl = workload if workload is not None else make_workload(cfg.workload, seed)
    run_dir = vrun.setup_run_dir(cfg.backend_options.get("run_dir"))
    stamp = harness.log_stamp()
    sched_log = harness.trial_log_path(run_dir, "sched", cfg, arm, seed, stamp)
    dev_log = harness.trial_log_path(run_dir, "device", cfg, arm, seed, stamp)
    settings = emu_settings(cfg, str(dev_log))
    simrun.check_requests(cfg, wl.requests, settings["num_gpu_blocks"])
    harness.use_scheduler_log(sched_log)
    run = harness.run_engine(lambda: make_engine(cfg, arm, settings), wl,
                             where=f"emu trial {cfg.name}/{arm}/seed-{seed}", progress=progress,
                             warmup=bool(cfg.backend_options.get("engine_warmup", True)))
    harness.wait_for_log_end(sched_log)
    tokens = harness.tokens_frame(wl, run.results)
    iterations, log_info, measured = _emulated_iterations(sched_log, dev_log, run.t0)
    gpu = cm.load_gpu(cfg.gpu)
    engine = harness.engine_metadata(
        run, wl, tokens, log_info, executor="dlfp.backends.emu.EmuExecutor", device_log=str(dev_log),
        emu_settings=settings, num_preemptions=int(sum(r.get("num_preempted", 0) for r in measured)))
    if run.scheduling != cfg.scheduling:  # cannot happen unless vLLM changes; recorded loudly rather than hidden
        engine["note"] = f"config asked for {cfg.scheduling} scheduling; the engine ran {run.scheduling}"
    hardware = {"gpu": gpu.describe(), "tp": cfg.tp, "num_gpus": cfg.tp, "modelled": True,
                "host": harness.host_hardware(),
                "description": f"emulated {cfg.tp} x {gpu.name} under vLLM {vllm_version}'s real engine loop "
                               f"on this CPU"}
    md = harness.trial_metadata(cfg, arm, seed, backend="emu", vllm_version=vllm_version, policy=policy, wl=wl,
                                hardware=hardware, energy=modelled_energy(cfg, gpu, measured, tokens), engine=engine)
    return Trial(requests=harness.requests_frame(wl, run.results), tokens=tokens, iterations=iterations,
                 metadata=md)


def _emulated_iterations(sched_log: Path, dev_log: Path, t0: float) -> tuple[pd.DataFrame, dict, list[dict]]:
    """The iteration frame (scheduler log joined with the device log), the scheduler-log info, and the device
    rows of the measured trial (batches started at or after ``t0``, i.e. not the warm-up).

    Raises:
        RuntimeError: see ``iterations_from_log`` and ``join_device_log``.
    """
    from dlfp.backends.emu.executor import read_device_log

    iterations, log_info = harness.iterations_from_log(sched_log, t0)
    # The scheduler log can repeat its last row (a race between the engine thread's flush and shutdown in
    # dlfp.backends.vllm.scheduler); the copies are identical, keep one so the trace stays strictly increasing.
    n_rows = len(iterations)
    iterations = iterations.drop_duplicates("iteration", keep="last").reset_index(drop=True)
    log_info["duplicate_rows_dropped"] = n_rows - len(iterations)
    dev_rows = read_device_log(dev_log)
    iterations = coerce(join_device_log(iterations, dev_rows, t0), ITERATION_COLUMNS, "iterations")
    measured = [r for r in dev_rows if r["device_start_s"] >= t0]
    return iterations, log_info, measured


def modelled_energy(cfg: ExperimentConfig, gpu, measured: list[dict], tokens: pd.DataFrame) -> dict:
    """``metadata["energy"]`` of an emu trial: the emulated batches' cost-model energy plus idle power between them.

    ``gpu`` is ``cm.load_gpu(cfg.gpu)`` (``idle_w`` per GPU, watts); ``measured`` the device-log rows of the
    trial (``energy_j`` in joules, device start/end in seconds); the span runs from 0 to the last token.
    """
    busy_s = float(sum(r["device_end_s"] - r["device_start_s"] for r in measured))
    busy_j = float(sum(r.get("energy_j") or 0.0 for r in measured))
    span_s = float(tokens["time_s"].max()) if len(tokens) else 0.0
    return {"joules": busy_j + gpu.idle_w * cfg.tp * max(0.0, span_s - busy_s), "source": "modelled",
            "method": "per GPU: cost-model energy of each emulated batch (idle_w + (tdp_w - idle_w) x roofline "
                      "utilisation over its device time) plus idle_w between batches; summed over tp GPUs, "
                      "t = 0 .. last token", "busy_joules": busy_j, "span_s": span_s}


__all__ = ["emu_settings", "join_device_log", "make_engine", "modelled_energy", "run_trial"]
