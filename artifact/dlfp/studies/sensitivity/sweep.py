"""The whole sensitivity sweep: plan, run and tabulate, and write the outputs (``dlfp sensitivity``)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from dlfp.config import load_experiment
from dlfp.studies.sensitivity.plan import (CANDIDATE_ARMS, DEFAULT_SEEDS, HOST_SCALES, build_plan,
                                           default_experiments, measured_host_costs)
from dlfp.studies.sensitivity.run import Progress, run_plan
from dlfp.studies.sensitivity.table import build_table, paper_directions, write_outputs


def run_sweep(experiments: Sequence[str] | None = None, *, out_dir: str | Path | None = None,
              seeds: Sequence[int] = DEFAULT_SEEDS, candidate_arms: Sequence[str] = CANDIDATE_ARMS,
              host_scales: Sequence[float] = HOST_SCALES, measured: bool = True,
              overrides: dict[str, Any] | None = None, jobs: int | None = None,
              published: str | Path | None = None, command: str = "dlfp sensitivity",
              progress: Progress | None = None) -> dict[str, Any]:
    """Plan, run and tabulate the sweep; write the outputs when ``out_dir`` is given.

    ``experiments`` defaults to ``default_experiments()``; ``measured`` adds
    the host costs ``dlfp calibrate`` measured; ``published`` (default
    ``data/paper/published.csv``) gives the paper's directions. Returns
    ``{"plan", "trials", "table", "paths", "seconds"}`` (``seconds``: wall
    time of the runs).

    Raises:
        ConfigError: an unknown experiment or bad override; SensitivityError: a bad sensitivity block.
    """
    from dlfp.pipeline import default_published_csv

    names = list(experiments) if experiments else default_experiments()
    configs = [load_experiment(n) for n in names]
    mh = measured_host_costs() if measured else None
    plan = build_plan(configs, seeds=seeds, candidate_arms=candidate_arms, host_scales=host_scales,
                      measured_host=mh, overrides=overrides)
    t0 = time.perf_counter()
    trials = run_plan(plan, jobs=jobs, progress=progress)
    seconds = time.perf_counter() - t0
    pub = Path(published) if published else default_published_csv()
    table = build_table(trials, paper_directions(pub if pub.exists() else None))
    paths = {}
    if out_dir is not None:
        notes = list(plan.notes)
        if mh:
            notes.append("measured host costs (s): " + ", ".join(f"{k}={v:.3g}" for k, v in sorted(mh.items())))
        paths = write_outputs(table, trials, out_dir, command=command, seeds=plan.seeds, notes=notes)
    return {"plan": plan, "trials": trials, "table": table, "paths": paths, "seconds": seconds}


__all__ = ["run_sweep"]
