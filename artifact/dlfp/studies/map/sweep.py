"""``run_map``: run (or resume) one map and write its raw per-trial table."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

from dlfp.studies.map.grid import MapSpec
from dlfp.studies.map.run import (BATCH, FLUSH_S, _batches, check_executor, code_fingerprint, executor_batches,
                                  jobs_count)
from dlfp.studies.map.store import consolidate, load_rows, write_part


def run_map(spec: MapSpec, out: str | Path, *, executor: str = "local", jobs: int | None = None,
            progress: bool = True) -> pd.DataFrame:
    """Run every task of ``spec`` not already finished under ``out``, then write ``<out>/<map>.csv``.

    Finished rows are flushed to part files at least every ``FLUSH_S`` seconds, so an interruption (Ctrl-C, a
    killed process) loses only the trials in flight; rerunning resumes. Returns the complete table (task order).

    Raises:
        MapError: a bad executor or job count, a corrupt table, a Dask scheduler that cannot be reached.
        dlfp.config.ConfigError: a cell the configuration cannot run (before any trial runs).
    """
    from tqdm import tqdm

    check_executor(executor)
    out = Path(out)
    fp = code_fingerprint()
    tasks = spec.tasks()
    for cell in spec.cells():  # fail fast on a cell the configuration cannot run
        spec.config(cell)
    n_jobs = jobs_count(jobs) if executor == "local" else 1
    done = load_rows(spec, out, fp)
    finished = set(done["key"])
    todo = [t for t in tasks if t.key not in finished]
    bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), desc=f"map {spec.name}", unit="trial",
               disable=not progress, file=sys.stderr, dynamic_ncols=True)
    pending: list[dict] = []
    last = time.monotonic()
    try:
        size = max(1, min(BATCH, len(todo) // (4 * n_jobs)))  # small maps: enough batches to keep workers busy
        for rows in executor_batches(spec, _batches(todo, size), executor, n_jobs):
            pending += rows
            bar.update(len(rows))
            if time.monotonic() - last >= FLUSH_S:
                write_part(pending, out, spec.name)
                pending, last = [], time.monotonic()
    finally:
        if pending:
            write_part(pending, out, spec.name)
        bar.close()
    rows = load_rows(spec, out, fp)
    consolidate(spec, rows, out)
    return load_rows(spec, out, fp, strict=True)


__all__ = ["run_map"]
