"""Running a map: one summary row per task (cell x arm x seed), on local processes or a Dask cluster, resumable.

Rows are flushed to part files (CSV, written atomically) under ``<out>/<map>.parts/`` as tasks finish; an
interrupted map resumes from them, and a finished one is consolidated into ``<out>/<map>.csv`` (the raw per-trial
table, rows in task order) and its parts removed. Rows whose key is not a task of the current plan (the base
experiment or the axes changed) or whose simulator code fingerprint differs are not reused: they are named on
stderr and recomputed, so a results table never mixes versions.

Executors (``executor``): ``"local"`` (default): spawned worker processes (``jobs``, default the CPU count);
``"dask://HOST:PORT"`` or ``"tcp://HOST:PORT"``: a running Dask scheduler (``distributed.Client``); tasks go in
batches so each worker reuses its device-model and workload caches. Times are seconds.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from dlfp.studies.map.grid import MapError, MapSpec, Task

#: Columns of the raw per-trial table.
TRIAL_COLUMNS = ("key", "map", "source", "scale", "rate", "budget", "arm", "seed", "measured", "completed",
                 "itl_p50_s", "itl_p99_s", "ttft_p99_s", "e2el_p99_s", "slo_passes", "stall_frac",
                 "gap_over_slo_frac", "stalled_s_per_request", "iterations", "prefill_demand_tps",
                 "prefill_capacity_tps", "utilisation", "code")
BATCH = 12  # tasks per submission: amortises process start-up and reuses the worker's caches
FLUSH_S = 20.0  # write a part at least this often while tasks finish

Progress = Callable[[int, int], None]


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """sha256 (16 hex) of the simulator's source and data files: the engine, device models, policies, workload
    generation, configs and the operator/model/hardware YAMLs; a map row is reused only under the same one."""
    import hashlib

    import dlfp

    root = Path(dlfp.__file__).resolve().parent
    h = hashlib.sha256()
    for sub in ("backends/sim", "devices", "policies", "workload", "config.py", "experiments", "models", "hardware",
                "data"):
        p = root / sub
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        for f in files:
            if "dlfps" in f.parts:  # the map runs the baseline and DLFP arms only
                continue
            if f.is_file() and f.suffix in (".py", ".yaml", ".json", ".csv"):
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


@lru_cache(maxsize=64)
def _cell_config(spec: MapSpec, cell):
    return spec.config(cell)


@lru_cache(maxsize=16)
def _capacity_tps(spec: MapSpec, budget: int) -> float:
    """Prefill tokens/s of back-to-back full-budget chunks at zero prior context (modelled device time)."""
    from dlfp.backends.sim.runner import build_engine_parts
    from dlfp.devices.batch import Batch

    cfg = spec.base.with_overrides({"max_num_batched_tokens": budget})
    dm = build_engine_parts(cfg)[2]
    return budget / dm.time_batch(Batch(prefill=[(budget, 0)]))[0]


def summarize_task(spec: MapSpec, task: Task) -> dict:
    """Run one simulator trial of ``task`` (nothing written) and return its row of ``TRIAL_COLUMNS``.

    ``stall_frac``: share of measured inter-token gaps longer than ``STALL_FACTOR`` x their median (the
    sensitivity sweep's diagnostic); ``gap_over_slo_frac``: share longer than the ITL SLO; ``stalled_s_per_request``:
    the sum of those gaps over the measured requests (s per request); ``utilisation``: prefill demand (rate x mean
    prompt tokens, tokens/s) over ``prefill_capacity_tps``.
    """
    from dlfp.analysis.metrics import itl_samples, summarize
    from dlfp.backends import run_trial
    from dlfp.studies.sensitivity.run import STALL_FACTOR

    cell = task.cell
    cfg = _cell_config(spec, cell)
    trial = run_trial(cfg, task.arm, task.seed, backend="sim")
    s = summarize(trial)
    gaps = itl_samples(trial)
    gaps = gaps[np.isfinite(gaps)]
    slo_itl = float(cfg.slo.itl_s)
    over = gaps[gaps > slo_itl] if gaps.size else gaps
    rq = trial.requests
    demand = cell.rate * float(rq["prompt_tokens"].mean())
    cap = _capacity_tps(spec, cell.budget)
    return {"key": task.key, "map": spec.name, "source": cell.source, "scale": cell.scale, "rate": cell.rate,
            "budget": cell.budget, "arm": task.arm, "seed": task.seed, "measured": int(s["measured"]),
            "completed": int(s["completed"]), "itl_p50_s": float(s["itl_p50_s"]), "itl_p99_s": float(s["itl_p99_s"]),
            "ttft_p99_s": float(s["ttft_p99_s"]), "e2el_p99_s": float(s["e2el_p99_s"]),
            "slo_passes": int(s["slo_passes"]),
            "stall_frac": float((gaps > STALL_FACTOR * np.median(gaps)).mean()) if gaps.size else float("nan"),
            "gap_over_slo_frac": float(over.size / gaps.size) if gaps.size else float("nan"),
            "stalled_s_per_request": float(over.sum()) / max(int(s["measured"]), 1),
            "iterations": int(len(trial.iterations)), "prefill_demand_tps": demand, "prefill_capacity_tps": cap,
            "utilisation": demand / cap, "code": code_fingerprint()}


def run_batch(spec: MapSpec, tasks: list[Task]) -> list[dict]:
    """``summarize_task`` of each task, in order (what one worker runs per submission)."""
    return [summarize_task(spec, t) for t in tasks]


def _batches(tasks: list[Task], size: int = BATCH) -> list[list[Task]]:
    return [tasks[i:i + size] for i in range(0, len(tasks), size)]


def _local(spec: MapSpec, batches: list[list[Task]], jobs: int) -> Iterable[list[dict]]:
    """Batches on ``jobs`` spawned processes (in this process when ``jobs == 1``), yielded as they finish."""
    if jobs == 1:
        for b in batches:
            yield run_batch(spec, b)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futs = [pool.submit(run_batch, spec, b) for b in batches]
        try:
            for f in as_completed(futs):
                yield f.result()
        except BaseException:
            for f in futs:
                f.cancel()
            raise


def _dask(spec: MapSpec, batches: list[list[Task]], address: str) -> Iterable[list[dict]]:
    """Batches on the Dask cluster at ``address`` (``tcp://HOST:PORT``), yielded as they finish.

    Raises:
        MapError: ``distributed`` is not installed (``pip install -e .[cluster]``) or the scheduler cannot be
            reached.
    """
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise MapError("--executor dask://...: the 'distributed' package is not installed "
                       "(pip install -e '.[cluster]')") from None
    try:
        client = Client(address, timeout=10)
    except (OSError, TimeoutError) as e:
        raise MapError(f"--executor: cannot reach the Dask scheduler at {address}: {e}") from None
    try:
        futs = client.map(run_batch, [spec] * len(batches), batches, pure=False)
        for f in as_completed(futs):
            yield f.result()
    finally:
        client.close()


def check_executor(executor: str) -> str:
    """``executor`` if it is ``local``, ``dask://HOST:PORT`` or ``tcp://HOST:PORT``.

    Raises:
        MapError: anything else (names the accepted forms).
    """
    if executor == "local" or (executor.startswith(("dask://", "tcp://")) and ":" in executor.split("://", 1)[1]):
        return executor
    raise MapError(f"--executor {executor!r}: expected 'local', 'dask://HOST:PORT' or 'tcp://HOST:PORT'")


def executor_batches(spec: MapSpec, batches: list[list[Task]], executor: str, jobs: int) -> Iterable[list[dict]]:
    """Dispatch on ``executor``: ``local``, ``dask://HOST:PORT`` or ``tcp://HOST:PORT``.

    Raises:
        MapError: an unknown executor scheme (names the accepted ones).
    """
    check_executor(executor)
    if executor == "local":
        return _local(spec, batches, jobs)
    if executor.startswith("dask://"):
        return _dask(spec, batches, "tcp://" + executor[len("dask://"):])
    if executor.startswith("tcp://"):
        return _dask(spec, batches, executor)
    raise MapError(f"--executor {executor!r}: expected 'local', 'dask://HOST:PORT' or 'tcp://HOST:PORT'")


def jobs_count(jobs: int | None) -> int:
    """Local worker processes: ``jobs``, else ``$DLFP_JOBS``, else the CPU count.

    Raises:
        MapError: not a positive integer.
    """
    raw = jobs if jobs is not None else os.environ.get("DLFP_JOBS", "").strip() or (os.cpu_count() or 1)
    try:
        n = int(raw)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise MapError(f"jobs (--jobs or DLFP_JOBS) must be a positive integer, got {raw!r}")
    return n


__all__ = ["BATCH", "TRIAL_COLUMNS", "check_executor", "code_fingerprint", "executor_batches", "jobs_count",
           "run_batch", "summarize_task"]
