"""DLFP-G's development set: the simulator matrix on seeds 901-903, where its constants were chosen.

DLFP-G's constants (``dlfp.policies.dlfpg.options``) were chosen on these seeds
and then frozen; the reported results use the matrix's own seeds 801-803. This
study reruns the development set so that anyone can see the numbers the choice
was made on, beside the reported ones (REPRODUCE.md, "DLFP-G").

The development set is every shipped simulator experiment whose seeds change
its arrivals or prompt lengths (Poisson and trace replay). Request-list
experiments are left out: there the seed changes only token ids, so seeds
901-903 would repeat 801. Trace replays start the development seeds at rows of
their own (``DEV_TRACE_START``).

It runs the baseline arm, the paper's DLFP, DLFP-G and the fixed-cap frontier
arms on each, in-process on the simulator (no traces are written), and writes
``dlfpg/dev.csv`` under the results folder: one row per (experiment, arm, seed) with ``itl_p99_s``,
``ttft_p99_s``, ``slo_passes`` and ``worst_gap_s`` (seconds).
"""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Sequence

import pandas as pd

from dlfp.analysis import metrics
from dlfp.analysis.markdown import atomic_write
from dlfp.config import ExperimentConfig, list_experiments, load_experiment
from dlfp.pipeline.plan import experiment_backends, frontier_overrides

DEV_SEEDS: tuple[int, ...] = (901, 902, 903)
DEV_ARMS: tuple[str, ...] = ("baseline", "dlfp", "dlfpg")
#: Trace-replay experiments start each development seed at its own row of the trace, between the rows the
#: reported seeds use (0, 4,000, 8,000 of 12,031): a window of 100 requests spans a few hundred rows.
DEV_TRACE_START: dict[int, int] = {901: 2000, 902: 6000, 903: 10000}
COLUMNS = ["experiment", "arm", "seed", "itl_p99_s", "ttft_p99_s", "slo_passes", "worst_gap_s"]


def dev_experiments() -> list[str]:
    """Shipped experiments of the development set: simulator-runnable, not a request list."""
    out = []
    for name in list_experiments():
        only = experiment_backends(name)
        cfg = load_experiment(name)
        if (only is None or "sim" in only) and cfg.workload.kind != "requests" and cfg.gpu != "cpu":
            out.append(name)
    return out


def dev_config(name: str, seeds: Sequence[int] = DEV_SEEDS) -> ExperimentConfig:
    """Experiment ``name`` on ``seeds`` with its frontier arms, keeping only the arms this study runs."""
    over: dict = {"seeds": list(seeds)}
    base = load_experiment(name)
    if base.workload.kind == "trace" and base.workload.trace.start_by_seed:
        over["workload.trace.start_by_seed"] = {s: DEV_TRACE_START[s] for s in seeds}
    cfg = load_experiment(name, over)
    cfg = cfg.with_overrides(frontier_overrides(cfg))
    keep = [a for a in cfg.arms if a in DEV_ARMS or a.startswith("fixed-")]
    return cfg.model_copy(update={"arms": {a: cfg.arms[a] for a in keep}})


def _one(job: tuple[str, str, int]) -> dict:
    from dlfp.backends.sim.runner import run_trial

    name, arm, seed = job
    cfg = dev_config(name)
    trial = run_trial(cfg, arm, seed)
    s = metrics.summarize(trial, cfg.slo)
    return {"experiment": name, "arm": arm, "seed": seed, "itl_p99_s": s["itl_p99_s"], "ttft_p99_s": s["ttft_p99_s"],
            "slo_passes": s["slo_passes"], "worst_gap_s": metrics.worst_gap_s(trial)}


def run_dev(experiments: Sequence[str] | None = None, *, workers: int = 2) -> pd.DataFrame:
    """Run the development set; one row per (experiment, arm, seed), columns ``COLUMNS`` (seconds)."""
    names = list(experiments) if experiments else dev_experiments()
    jobs = [(n, a, s) for n in names for a in dev_config(n).arms for s in DEV_SEEDS]
    with ProcessPoolExecutor(max_workers=max(1, workers)) as pool:
        rows = list(pool.map(_one, jobs, chunksize=4))
    return pd.DataFrame(rows, columns=COLUMNS)


def read_dev(path: str | Path) -> pd.DataFrame:
    """The development-set table at ``path`` (columns ``COLUMNS``).

    Raises:
        ValueError: it is not one (unreadable, empty, or other columns); one line naming the file.
    """
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a development-set table ({e})") from None
    if list(df.columns) != COLUMNS:
        raise ValueError(f"{path}: not a development-set table (columns {list(df.columns)})")
    return df


def write_dev(df: pd.DataFrame, out_dir: str | Path) -> Path:
    """Write ``dev.csv`` atomically under ``out_dir`` (by default ``data/results/dlfpg``); returns its path.

    Rows of experiments ``df`` does not cover are kept from the file already there (a run of a subset replaces
    only its own experiments); rows are sorted by experiment, arm and seed.

    Raises:
        ValueError: the file there is not a development-set table (one line naming it).
    """
    path = Path(out_dir) / "dev.csv"
    if path.exists():
        old = read_dev(path)
        df = pd.concat([old[~old["experiment"].isin(set(df["experiment"]))], df], ignore_index=True)
    df = df.sort_values(["experiment", "arm", "seed"], kind="stable").reset_index(drop=True)
    atomic_write(path, df.to_csv(index=False))
    return path


def main_dev(argv: Sequence[str] | None = None) -> int:
    """``dlfp dlfpg-dev [--experiments ...] [--out DIR] [--jobs N]``: run the development set, write its CSV.

    Returns 0; 2 with one line for an unknown experiment, ``--jobs`` below 1 or an ``--out`` that is not a
    directory; 130 / 143 when interrupted (nothing is written).
    """
    import argparse
    import sys

    from dlfp.analysis.tables.report import DLFPG_DEV_CSV
    from dlfp.pipeline import default_results_dir
    from dlfp.pipeline.plan import worker_count

    ap = argparse.ArgumentParser(prog="dlfp dlfpg-dev", description="DLFP-G's development set on the simulator "
                                 "(seeds 901-903); writes dlfpg/dev.csv under the results folder")
    ap.add_argument("--experiments", nargs="+", default=None, help="subset (default: every Poisson or trace "
                                                                   "experiment of the simulator)")
    ap.add_argument("--out", default=None, help="output directory (default data/results/dlfpg)")
    ap.add_argument("--jobs", type=int, default=None, help="worker processes (default $DLFP_JOBS or the CPU count)")
    args = ap.parse_args(list(argv or []))
    if args.jobs is not None and args.jobs < 1:
        print(f"dlfp dlfpg-dev: error: --jobs must be >= 1, got {args.jobs}", file=sys.stderr)
        return 2
    known = dev_experiments()
    bad = [e for e in args.experiments or [] if e not in known]
    if bad:
        print(f"dlfp dlfpg-dev: error: {bad[0]!r} is not in the development set; known: {', '.join(known)}",
              file=sys.stderr)
        return 2
    from dlfp.pipeline import PipelineError, check_output_dir, display_path, interrupts

    out = Path(args.out) if args.out else (default_results_dir() / DLFPG_DEV_CSV).parent
    try:
        check_output_dir(out, "--out")
        df = run_dev(args.experiments, workers=worker_count("sim", args.jobs))
        path = write_dev(df, out)
    except (PipelineError, ValueError) as e:
        print(f"dlfp dlfpg-dev: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # nothing is written until every run is done: the table is unchanged
        sig = interrupts.signal_of(e)
        print(f"dlfp dlfpg-dev: interrupted; nothing written ({display_path(out / 'dev.csv')} unchanged)",
              file=sys.stderr)
        return interrupts.EXIT_STATUS[sig]
    print(f"dlfpg-dev: {len(df)} runs -> {display_path(path)}")
    return 0


__all__ = ["COLUMNS", "DEV_ARMS", "DEV_SEEDS", "DEV_TRACE_START", "dev_config", "dev_experiments", "main_dev",
           "read_dev", "run_dev", "write_dev"]
