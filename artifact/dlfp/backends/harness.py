"""The trial harness shared by the two real-engine backends, ``vllm`` and ``emu``.

Both start an ``AsyncLLM`` whose scheduler is ``SCHEDULER_CLS`` (the DLFP scheduler running the arm's policy),
replay the seed's workload (open loop: each request is sent at its arrival time whether or not earlier ones
finished; closed loop: through ``ClientSlots``, as ``vllm bench serve --max-concurrency``), stream every request
in ``DELTA`` mode, stamp each token on arrival at the client, then read back the scheduler's per-iteration log.
They differ only in the engine they start (the real model executor or ``EmuExecutor``) and in what they add to
the trial (measured or modelled energy, the emulated device's log).

One trial, in order:

1. ``trial_log_path`` + ``use_scheduler_log``: a log file unique to the trial, named to the engine core;
2. ``run_engine``: start the engine, ``drive_open_loop`` (either loop), shut the engine down (errors name the
   trial);
3. ``wait_for_log_end``, ``iterations_from_log``, ``requests_frame``, ``tokens_frame``: the trial's frames;
4. ``engine_metadata`` and ``trial_metadata``: its ``metadata.json``.

Sampling: prompts are token ids, greedy (``temperature=0``) with ``ignore_eos`` and ``max_tokens`` = the
request's output tokens, no detokenisation. Clock: ``time.monotonic()`` (CLOCK_MONOTONIC, shared by the
harness and the engine-core process); 0 = the trial start, the reference of the workload's arrival times.
Nothing here imports vLLM at module level.
"""
from __future__ import annotations

import asyncio
import hashlib
from collections import deque
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from dlfp.backends import ProgressFn
from dlfp.config import ExperimentConfig
from dlfp.policies.base import reason_runs
from dlfp.traces.format import (FORMAT_VERSION, ITERATION_COLUMNS, REQUEST_COLUMNS, TOKEN_COLUMNS, coerce,
                                git_commit, package_versions)

#: The scheduler class both backends give vLLM (``--scheduler-cls``).
SCHEDULER_CLS = "dlfp.backends.vllm.scheduler.DLFPScheduler"
#: Environment variable the DLFP scheduler reads its log path from (``dlfp.backends.vllm.scheduler.ENV_LOG``).
SCHED_LOG_ENV = "DLFP_SCHED_LOG"
#: ``metadata["clock"]`` of every real-engine trial.
CLOCK = "time.monotonic() seconds (CLOCK_MONOTONIC, harness and engine-core process); 0 = trial start"
#: The engine warm-up request: a 16-token prompt with 2 output tokens, sent alone before the trial clock starts.
WARMUP_REQUEST_ID = "dlfp-engine-warmup"
WARMUP_PROMPT = tuple(range(100, 116))
WARMUP_OUTPUT_TOKENS = 2
#: Seconds ``wait_for_log_end`` waits for the engine core's ``end`` event.
LOG_END_TIMEOUT_S = 10.0


# --------------------------------------------------------------------------- the scheduler log


def trial_log_path(run_dir: Path, kind: str, cfg: ExperimentConfig, arm: str, seed: int, stamp: str) -> Path:
    """``<run_dir>/logs/<kind>-<experiment>-<arm>-<seed>-<stamp>.jsonl``; ``stamp`` from ``log_stamp``."""
    return run_dir / "logs" / f"{kind}-{cfg.name}-{arm}-{seed}-{stamp}.jsonl"


def log_stamp() -> str:
    """``<pid>-<time_ns>``: makes a trial's log names unique across processes and repeated trials."""
    return f"{os.getpid()}-{time.time_ns()}"


def use_scheduler_log(path: Path) -> Path:
    """Point the DLFP scheduler of engines started from now on at ``path`` (through ``$DLFP_SCHED_LOG``)."""
    os.environ[SCHED_LOG_ENV] = str(path)
    return path


def wait_for_log_end(path: Path, timeout_s: float = LOG_END_TIMEOUT_S) -> None:
    """Wait until the engine core has written its ``end`` event (it does so on shutdown), at most ``timeout_s``.

    Returns silently on timeout: ``iterations_from_log`` records whether the log is complete.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - 256))
                if b'"event": "end"' in f.read():
                    return
        except OSError:
            pass
        time.sleep(0.05)


def iterations_from_log(path: str | Path, t0: float) -> tuple[pd.DataFrame, dict]:
    """The trial's iteration frame (``ITERATION_COLUMNS``) from a scheduler log, times relative to ``t0``.

    Rows scheduled before ``t0`` (the engine warm-up) are dropped. The dict
    (``metadata["engine"]["scheduler_log"]``) holds the log's path, the scheduler class that wrote it,
    whether it is complete, and its ``max_num_scheduled_tokens``; for a policy that logs its decision reasons,
    also ``decisions`` (``dlfp.policies.base.reason_runs``), which ``trial_metadata`` moves to
    ``metadata["decisions"]``.

    Raises:
        RuntimeError: the log is missing or has no start event (the engine did not run the DLFP scheduler).
    """
    from dlfp.backends.vllm.scheduler import read_log

    p = Path(path)
    if not p.exists():
        raise RuntimeError(f"scheduler log {p} is missing: the engine core did not run {SCHEDULER_CLS}")
    events, rows = read_log(str(p))
    starts = [e for e in events if e.get("event") == "start"]
    if not starts:
        raise RuntimeError(f"scheduler log {p} has no start event")
    df = pd.DataFrame(rows, columns=list(ITERATION_COLUMNS) + ["num_decoding_running"])
    df = df[df["schedule_s"] >= t0].sort_values("iteration").reset_index(drop=True)
    for c in ("schedule_s", "issue_s", "device_start_s", "device_end_s"):
        df[c] = df[c].astype(float) - t0
    for c in ("cap", "cap_after"):
        df[c] = df[c].astype("Int64")
    info = {"path": str(p), "scheduler": starts[-1].get("scheduler"),
            "complete": any(e.get("event") == "end" for e in events),
            "max_num_scheduled_tokens": starts[-1].get("max_num_scheduled_tokens")}
    kept = sorted((r for r in rows if "reason" in r and r["schedule_s"] >= t0), key=lambda r: r["iteration"])
    if kept:  # a policy that logs its reasons (DLFP-G): trial_metadata moves them to metadata["decisions"]
        info["decisions"] = reason_runs([r["iteration"] for r in kept], [r["reason"] for r in kept])
    return coerce(df, ITERATION_COLUMNS, "iterations"), info


# --------------------------------------------------------------------------- the open-loop client


def sampling_params(max_tokens: int):
    """vLLM ``SamplingParams``: greedy, ``ignore_eos``, exactly ``max_tokens`` tokens, streamed as deltas."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=int(max_tokens), temperature=0.0, ignore_eos=True, detokenize=False,
                          output_kind=RequestOutputKind.DELTA)


class ClientSlots:
    """The ``concurrency`` client slots of a closed loop: ``vllm bench serve --max-concurrency``.

    vLLM 0.17.1, ``vllm/benchmarks/serve.py``, ``benchmark``: ``limited_request_func`` holds an
    ``asyncio.Semaphore(max_concurrency)`` from before the request is sent until the request function returns,
    after the response stream's last chunk. Waiters acquire first come, first served (as ``asyncio.Semaphore``
    wakes them); this class makes that order explicit and also tells each acquirer when its slot was freed, so
    the client's send lag can be measured from ``max(release, freed)``.
    """

    def __init__(self, concurrency: int):
        self._free: deque[float] = deque([0.0] * concurrency)  # when each free slot was freed (s, trial clock)
        self._waiters: deque[asyncio.Future] = deque()

    async def acquire(self) -> float:
        """Wait for a slot (first come, first served); returns when it was freed (s; 0.0 = free from the start)."""
        if self._free and not self._waiters:
            return self._free.popleft()
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return await fut

    def release(self, now: float) -> None:
        """Free a slot at ``now`` (s): the longest waiter gets it, else it waits for the next acquirer."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(now)
                return
        self._free.append(now)


async def drive_open_loop(engine, wl, progress: ProgressFn | None, warmup: bool) -> tuple[dict[str, dict], float]:
    """Replay workload ``wl`` against ``engine`` (an ``AsyncLLM``); returns ``(results, t0)``.

    Open loop (``wl.concurrency`` is ``None``): each request is sent at its ``arrival_s``. Closed loop: each is
    released at its ``arrival_s``, then holds one of ``wl.concurrency`` ``ClientSlots`` from before it is sent
    until its stream has ended (its last token received), as ``vllm bench serve --max-concurrency``.
    With ``warmup`` the warm-up request (``WARMUP_PROMPT``) runs alone first. ``t0`` is the
    ``time.monotonic()`` of the trial start, taken after it. ``results[request_id]`` holds ``ids`` (generated
    token ids), ``times`` (their arrival at the client, seconds from ``t0``), ``finished``, ``sent`` (when the
    request was sent, seconds from ``t0``) and ``due`` (when it could have been sent: its arrival, or in a closed
    loop the later of its release and the time its slot was freed). ``progress(done, total)`` is called as
    requests finish.
    """
    if warmup:
        prompt = {"prompt_token_ids": list(WARMUP_PROMPT)}
        async for _ in engine.generate(prompt, sampling_params(WARMUP_OUTPUT_TOKENS), WARMUP_REQUEST_ID):
            pass
    total = len(wl.requests)
    done = [0]
    results: dict[str, dict] = {}
    t0 = time.monotonic()

    slots = ClientSlots(wl.concurrency) if getattr(wl, "concurrency", None) is not None else None

    async def one(spec) -> None:
        delay = t0 + spec.arrival_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        due = spec.arrival_s if slots is None else max(spec.arrival_s, await slots.acquire())
        try:
            sent = time.monotonic() - t0
            ids: list[int] = []
            times: list[float] = []
            finished = False
            async for out in engine.generate({"prompt_token_ids": spec.prompt_token_ids.tolist()},
                                             sampling_params(spec.output_tokens), spec.request_id):
                now = time.monotonic() - t0
                new = out.outputs[0].token_ids
                ids.extend(new)
                times.extend([now] * len(new))
                finished = out.finished
        finally:
            if slots is not None:
                slots.release(time.monotonic() - t0)
        results[spec.request_id] = {"ids": ids, "times": times, "finished": finished, "sent": sent, "due": due}
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    await asyncio.gather(*(one(s) for s in wl.requests))
    return results, t0


@dataclass
class EngineRun:
    """One finished engine run: the client's ``results`` (see ``drive_open_loop``), the trial start ``t0``
    (``time.monotonic()`` seconds), the ``scheduling`` the engine ran (``"async"`` or ``"sync"``) and the
    meter's ``energy`` dict (``None`` without a meter)."""

    results: dict[str, dict]
    t0: float
    scheduling: str
    energy: dict | None


def run_engine(start_engine: Callable[[], Any], wl, *, where: str, progress: ProgressFn | None = None,
               warmup: bool = True, meter=None) -> EngineRun:
    """Start an engine, replay ``wl`` against it (``drive_open_loop``) and shut it down, even on error.

    ``start_engine()`` returns an ``AsyncLLM``; ``meter`` (optional) has ``start()`` and ``stop() -> dict``
    and brackets the trial (warm-up included).

    Raises:
        RuntimeError: ``"<where>: engine failed to start (...)"`` or ``"<where>: engine failed mid-trial (...)"``.
    """
    async def main() -> EngineRun:
        try:
            engine = start_engine()
        except Exception as e:
            raise RuntimeError(f"{where}: engine failed to start ({type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}); see the engine log above") from None
        try:
            mode = "async" if engine.vllm_config.scheduler_config.async_scheduling else "sync"
            if meter is not None:
                meter.start()
            results, t0 = await drive_open_loop(engine, wl, progress, warmup)
            energy = meter.stop() if meter is not None else None
            return EngineRun(results=results, t0=t0, scheduling=mode, energy=energy)
        except Exception as e:
            raise RuntimeError(f"{where}: engine failed mid-trial ({type(e).__name__}: {e})") from None
        finally:
            engine.shutdown()

    return asyncio.run(main())


# --------------------------------------------------------------------------- frames and metadata


def requests_frame(wl, results: dict) -> pd.DataFrame:
    """The requests frame (``REQUEST_COLUMNS``): the workload's requests, ``finished`` from the client's results;
    in a closed loop ``arrival_s`` is when the client sent the request (bench serve's ``start_time``)."""
    rq = wl.requests_frame()
    rq["finished"] = [bool(results.get(r, {}).get("finished", False)) for r in rq["request_id"]]
    if getattr(wl, "concurrency", None) is not None:
        rq["arrival_s"] = [float(results.get(r, {}).get("sent", a)) for r, a in zip(rq["request_id"], rq["arrival_s"])]
    return coerce(rq, REQUEST_COLUMNS, "requests")


def tokens_frame(wl, results: dict) -> pd.DataFrame:
    """The tokens frame (``TOKEN_COLUMNS``) of a trial from the client's per-request results.

    ``results[request_id]`` holds ``ids`` (generated token ids) and ``times``
    (client-side emission times, seconds on the trial clock), in order;
    requests with no result are left out.
    """
    rows: dict[str, list] = {"request_id": [], "index": [], "token_id": [], "time_s": []}
    for spec in wl.requests:
        r = results.get(spec.request_id)
        if not r:
            continue
        n = len(r["ids"])
        rows["request_id"] += [spec.request_id] * n
        rows["index"] += list(range(n))
        rows["token_id"] += [int(x) for x in r["ids"]]
        rows["time_s"] += r["times"]
    return coerce(pd.DataFrame(rows), TOKEN_COLUMNS, "tokens")


def token_ids_digest(tokens: pd.DataFrame) -> str:
    """sha256 over (request_id, index, token_id) in request/index order: equal digests = equal outputs."""
    t = tokens.sort_values(["request_id", "index"])
    h = hashlib.sha256()
    for rid, idx, tid in zip(t["request_id"].astype(str), t["index"].astype(int), t["token_id"].astype(int)):
        h.update(f"{rid}:{idx}:{tid};".encode())
    return h.hexdigest()


def max_send_lag_s(wl, results: dict) -> float:
    """The largest delay (s) between when a request was due (its arrival time; in a closed loop the later of its
    release and its slot's freeing) and its sending by the client; NaN if none sent."""
    lags = [r["sent"] - r.get("due", s.arrival_s) for s in wl.requests if (r := results.get(s.request_id))]
    return float(max(lags)) if lags else float("nan")


def host_hardware() -> dict:
    """This machine: ``machine`` (architecture), ``cpus`` (count), ``cpu`` (model name, from ``/proc/cpuinfo``
    when readable), ``gpus`` (CUDA device names, when torch sees any), and its host identity (``identity``,
    ``host_key``: ``dlfp.hostinfo``; CPU, vector flags, frequency in MHz, affinity, torch's and OpenMP's threads)."""
    hw: dict[str, Any] = {"machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    hw["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            hw["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception:
        pass
    from dlfp.hostinfo import identity_record

    hw.update(identity_record())
    return hw


def engine_metadata(run: EngineRun, wl, tokens: pd.DataFrame, log_info: dict, **extra: Any) -> dict:
    """``metadata["engine"]``: the scheduling that ran, the scheduler class and log, the client's largest send
    lag and the output digest, plus the backend's ``extra`` keys."""
    return {"scheduling": run.scheduling, "scheduler_cls": SCHEDULER_CLS, **extra, "scheduler_log": log_info,
            "max_send_lag_s": max_send_lag_s(wl, run.results), "output_token_ids_sha256": token_ids_digest(tokens)}


def trial_metadata(cfg: ExperimentConfig, arm: str, seed: int, *, backend: str, vllm_version: str, policy, wl,
                   hardware: dict, energy: dict, engine: dict) -> dict:
    """A real-engine trial's metadata (every key of ``dlfp.traces.METADATA_KEYS``).

    ``policy`` is the arm's built policy (its ``params()`` are recorded with the arm's config).
    """
    extra = {}
    if "decisions" in engine.get("scheduler_log", {}):
        engine = {**engine, "scheduler_log": dict(engine["scheduler_log"])}
        extra["decisions"] = engine["scheduler_log"].pop("decisions")
    return {
        "format_version": FORMAT_VERSION, "experiment": cfg.name, "arm": arm, "seed": int(seed), "backend": backend,
        "versions": {**package_versions(), "vllm_runtime": vllm_version},
        "hardware": hardware, "git_commit": git_commit(), "workload_fingerprint": wl.fingerprint,
        "policy": {**policy.params(), "config": cfg.arms[arm].model_dump()},
        "config": cfg.model_dump(mode="json"),
        "energy": energy,
        "clock": CLOCK,
        "engine": engine,
        **extra,
    }


__all__ = ["CLOCK", "ClientSlots", "EngineRun", "LOG_END_TIMEOUT_S", "SCHEDULER_CLS", "SCHED_LOG_ENV",
           "WARMUP_OUTPUT_TOKENS", "WARMUP_PROMPT", "WARMUP_REQUEST_ID", "drive_open_loop", "engine_metadata",
           "host_hardware", "iterations_from_log", "log_stamp", "max_send_lag_s", "requests_frame", "run_engine",
           "sampling_params", "token_ids_digest", "tokens_frame", "trial_log_path", "trial_metadata",
           "use_scheduler_log", "wait_for_log_end"]
