"""Running trials: ``run_experiment`` (one experiment, in this process or a worker pool) and ``run_all``.

* ``run_experiment`` runs every arm x seed of one experiment, skipping a
  trial whose directory already loads (``traces.is_complete``) unless
  ``force``; a partial, corrupt or stale trial directory is named and re-run.
  Trials are written atomically one by one, so an interrupted run loses at
  most the trials in flight.
* ``run_all`` executes ``notebooks/experiment.ipynb`` through papermill once
  per experiment (the executed copy is saved beside that experiment's traces)
  and then ``notebooks/figures.ipynb`` into the results directory.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dlfp.backends import get_backend
from dlfp.config import ExperimentConfig
from dlfp.pipeline.errors import PipelineError
from dlfp.pipeline.interrupts import TALLY
from dlfp.pipeline.notebooks import execute_experiment_notebook_checked, render_figures_checked
from dlfp.pipeline.paths import (check_output_dir, check_quick_root, check_writable, default_results_dir,
                                 default_traces_dir, display_path)
from dlfp.pipeline.plan import (check_arguments, check_backend_config, default_matrix, prepare_config, resolve_backend,
                                select_arms, select_seeds, trial_state, worker_count)
from dlfp.pipeline.pool import run_pool
from dlfp.pipeline.progress import bars_enabled, progress_file, say
from dlfp.traces.format import Trial, trial_dir, write_trial


@dataclass
class TrialOutcome:
    """What ``run_experiment`` did with one trial: ``ran``, ``skipped`` (complete on disk) or ``reran``.

    ``seconds`` is the trial's wall time (0 when skipped).
    """

    experiment: str
    arm: str
    seed: int
    path: Path
    status: str
    reason: str = ""
    seconds: float = 0.0


@dataclass
class ExperimentRun:
    """The outcome of ``run_experiment``: the config that ran and one ``TrialOutcome`` per arm x seed."""

    config: ExperimentConfig
    backend: str
    traces_dir: Path
    outcomes: list[TrialOutcome] = field(default_factory=list)

    def frame(self):
        """Outcomes as a DataFrame (experiment, arm, seed, status, reason, seconds, path), sorted."""
        import pandas as pd

        rows = [dict(experiment=o.experiment, arm=o.arm, seed=o.seed, status=o.status, reason=o.reason,
                     seconds=round(o.seconds, 2), path=str(o.path)) for o in self.outcomes]
        return pd.DataFrame(rows, columns=["experiment", "arm", "seed", "status", "reason", "seconds", "path"])


#: One trial still to run: (seed, arm, trial directory, state on disk, why that state).
PendingTrial = tuple[int, str, Path, str, str]


# --------------------------------------------------------------------------- run one experiment


def run_experiment(
    experiment: str | ExperimentConfig,
    *,
    backend: str | None = None,
    seeds: Sequence[int] | None = None,
    arms: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    force: bool = False,
    quick: bool = False,
    frontier: bool | None = None,
    progress: bool = True,
    jobs: int | None = None,
) -> ExperimentRun:
    """Run every arm x seed of one experiment, writing each trial as soon as it finishes.

    Trials run seed by seed, all arms of a seed together, so an interrupted
    run leaves complete pairs. A trial directory that already loads and whose
    recorded config matches is skipped unless ``force``; a partial, corrupt or
    stale one is named on stderr and re-run.

    Args:
        experiment: name in ``dlfp/experiments`` (or a loaded config).
        backend: see ``resolve_backend``.
        seeds, arms: subsets (default: the config's).
        out_dir: traces root (default ``data/traces``); trials go under ``<out_dir>/<backend>/<experiment>/``.
        overrides: dotted-key config overrides, e.g. ``{"workload.num_requests": 5}``. The trials are their own
            experiment ``<experiment>+<8 hex>`` (``derived_experiment``) under whichever ``out_dir``, so the
            trials of ``experiment`` are never replaced.
        force: re-run complete trials too.
        quick: at most ``QUICK_NUM_REQUESTS`` measured requests (default root ``data/traces-quick``).
        frontier: also run the fixed-cap arms of ``backend_options.frontier_caps`` (``frontier_overrides``);
            ``None`` = only on a backend with ``frontier_by_default`` (the cheap one, the simulator).
        progress: show tqdm bars (trials; requests done/total with ETA).
        jobs: trials run in parallel worker processes (default: ``worker_count``).

    Raises:
        ConfigError: unknown experiment or bad override.
        PipelineError: unknown backend, arm or seed request, a bad ``$DLFP_JOBS``, an output path that is a file
            or not writable, ``quick`` into the shipped traces root, an argument of the wrong type.
        TraceError: the file system filled up while a trial was written (the directory and its free space).
        BackendUnavailable: the backend's software is not installed.
    """
    from tqdm import tqdm

    check_arguments(experiment=experiment, backend=backend, seeds=seeds, arms=arms, out_dir=out_dir,
                    overrides=overrides, force=force, quick=quick, frontier=frontier, jobs=jobs)
    progress = bars_enabled(progress)
    backend = resolve_backend(backend)
    cfg = prepare_config(experiment, backend, overrides=overrides, quick=quick, frontier=frontier,
                         derive=bool(overrides))
    check_backend_config(cfg, backend)
    arm_list = select_arms(cfg, arms)
    seed_list = select_seeds(cfg, seeds)
    root = check_output_dir(Path(out_dir) if out_dir is not None else default_traces_dir(quick),
                            "traces directory (--out)")
    jobs = worker_count(backend, jobs)
    check_quick_root(root, quick)
    check_writable(root, "traces directory", "--out DIR")
    if overrides:
        base = experiment.name if isinstance(experiment, ExperimentConfig) else experiment
        say(f"dlfp: with --set overrides the trials are experiment {cfg.name}, in "
            f"{display_path(root / backend / cfg.name)} (the trials of {base} are left as they are)")
    run = ExperimentRun(config=cfg, backend=backend, traces_dir=root)
    plan = [(s, a) for s in seed_list for a in arm_list]
    bar = tqdm(total=len(plan), desc=f"{cfg.name} [{backend}] trials", unit="trial", file=progress_file(),
               disable=not progress, position=0, leave=True, dynamic_ncols=True)
    todo = _pending_trials(run, plan, force, bar)
    if jobs > 1 and len(todo) > 1:
        run_parallel(cfg, backend, root, todo, jobs, run, bar)
    else:
        _run_in_process(run, todo, bar, progress)
    bar.close()
    order = {p: i for i, p in enumerate(plan)}
    run.outcomes.sort(key=lambda o: order[(o.seed, o.arm)])
    return run


def _pending_trials(run: ExperimentRun, plan: list[tuple[int, str]], force: bool, bar) -> list[PendingTrial]:
    """The trials of ``plan`` that must run; complete ones (unless ``force``) are recorded as skipped.

    A corrupt or stale trial is named on stderr before it is re-run.
    """
    cfg = run.config
    todo: list[PendingTrial] = []
    for seed, arm in plan:
        path = trial_dir(run.traces_dir, run.backend, cfg.name, arm, seed)
        state, why = trial_state(path, cfg, arm)
        if state == "complete" and not force:
            run.outcomes.append(TrialOutcome(cfg.name, arm, seed, path, "skipped", "complete on disk"))
            bar.update(1)
            continue
        if state in ("corrupt", "stale"):
            say(f"dlfp: trial {path} is {state} ({why}); re-running it")
        todo.append((seed, arm, path, state, why))
    return todo


def _request_bar(cfg: ExperimentConfig, arm: str, seed: int, progress: bool):
    """A tqdm bar of one trial's requests and the ``progress(done, total)`` callback that advances it."""
    from tqdm import tqdm

    bar = tqdm(total=0, desc=f"  {cfg.name} {arm} seed {seed}", unit="req", file=progress_file(),
               disable=not progress, position=1, leave=False, dynamic_ncols=True)

    def on_progress(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
            bar.refresh()
        bar.update(max(0, done - bar.n))

    return bar, on_progress


def _run_in_process(run: ExperimentRun, todo: list[PendingTrial], bar, progress: bool) -> None:
    """Run ``todo`` one after the other in this process, writing each trial as it finishes."""
    from dlfp import backends as runners

    cfg = run.config
    for seed, arm, path, state, why in todo:
        bar.set_postfix_str(f"{arm} seed {seed}")
        t0 = time.perf_counter()
        req_bar, on_progress = _request_bar(cfg, arm, seed, progress)
        try:
            trial = runners.run_trial(cfg, arm, seed, backend=run.backend, progress=on_progress)
        finally:
            req_bar.close()
        _check_trial(trial, cfg, arm, seed, run.backend)
        write_trial(trial, run.traces_dir, overwrite=True)
        status, reason = _status(state, why)
        run.outcomes.append(TrialOutcome(cfg.name, arm, seed, path, status, reason, time.perf_counter() - t0))
        TALLY.trials += 1
        bar.update(1)


def _status(state: str, why: str) -> tuple[str, str]:
    """The outcome status and reason of a trial that ran, from its state on disk before the run."""
    status = "ran" if state in ("missing", "complete") else "reran"
    reason = {"missing": "", "complete": "forced"}.get(state, f"{state}: {why}")
    return status, reason


def _check_trial(trial: Trial, cfg: ExperimentConfig, arm: str, seed: int, backend: str) -> None:
    """Raise ``PipelineError`` when a backend returned a trial of another experiment, arm, seed or backend."""
    md = trial.metadata
    want = {"experiment": cfg.name, "arm": arm, "seed": seed, "backend": backend}
    bad = {k: md.get(k) for k, v in want.items() if md.get(k) != v}
    if bad:
        raise PipelineError(f"backend {backend!r} returned a trial whose metadata {bad} does not match {want}")


# --------------------------------------------------------------------------- worker pool


def _trial_worker(cfg: ExperimentConfig, arm: str, seed: int, backend: str, root: str) -> float:
    """Run and write one trial in a worker process; returns its wall time (s)."""
    from dlfp import backends as runners

    t0 = time.perf_counter()
    trial = runners.run_trial(cfg, arm, seed, backend=backend)
    _check_trial(trial, cfg, arm, seed, backend)
    write_trial(trial, root, overwrite=True)
    return time.perf_counter() - t0


def run_parallel(cfg: ExperimentConfig, backend: str, root: Path, todo: list[PendingTrial], jobs: int,
                 run: ExperimentRun, bar) -> None:
    """Run ``todo`` trials on ``jobs`` spawned processes (``dlfp.pipeline.pool.run_pool``); each worker writes its
    own trial atomically, so an interruption loses only the trials in flight.

    On ``KeyboardInterrupt`` (Ctrl-C) pending trials are cancelled, the worker processes are terminated (their
    half-written temporary directories are removed, never renamed into place) and the interrupt is re-raised;
    completed trials stay on disk. A worker's error is re-raised here; a worker that dies is named by its trial
    and the trial retried once.
    """
    pending = {(seed, arm): (seed, arm, path, state, why) for seed, arm, path, state, why in todo}

    def done(key, elapsed: float) -> None:
        seed, arm, path, state, why = pending[key]
        status, reason = _status(state, why)
        run.outcomes.append(TrialOutcome(cfg.name, arm, seed, path, status, reason, elapsed))
        TALLY.trials += 1
        bar.set_postfix_str(f"{arm} seed {seed}")
        bar.update(1)

    jobs_list = [((seed, arm), (cfg, arm, seed, backend, str(root))) for seed, arm, *_ in todo]
    run_pool(jobs_list, _trial_worker, jobs, done,
             label=lambda k: str(trial_dir(root, backend, cfg.name, k[1], k[0]).relative_to(root)))


# --------------------------------------------------------------------------- the matrix


def run_all(*, backend: str | None = None, experiments: Sequence[str] | None = None, force: bool = False,
            quick: bool = False, traces_dir: str | Path | None = None, results_dir: str | Path | None = None,
            seeds: Sequence[int] | None = None, overrides: dict[str, Any] | None = None,
            figures: bool = True, frontier: bool | None = None, jobs: int | None = None,
            progress: bool = True) -> dict[str, Any]:
    """Run the experiment matrix through papermill, then render the figures.

    Every selected experiment's configuration is built and checked for the backend first (``prepare_config``,
    ``check_backend_config``), before any cache is looked at. On a backend that is not real-time (the
    simulator) every trial is then rerun and compared with the shipped one (``dlfp.pipeline.verify``), so the
    notebooks find them all complete, except the trials this code already verified on this machine (fresh: not
    rerun); on a real-time backend cached trials are kept unless ``force``. With ``overrides`` the trials are
    derived experiments (``run_experiment``), whatever ``traces_dir``. An experiment notebook or the figures whose
    outputs are fresh (``dlfp.pipeline.stamps``) is not executed again; ``force`` reruns every trial and executes
    every notebook.

    Returns a dict with ``backend``, ``notebooks`` (executed experiment copies, fresh or just executed),
    ``figures_notebook``, ``results_dir``, ``traces_dir``, ``seconds`` (wall time), ``verification``
    (``Verification`` or ``None``), ``trials`` (number selected), ``cached`` (complete on disk before the run,
    real-time backends), ``notebooks_fresh`` (experiment notebooks not executed again) and ``figures_fresh``.

    Raises:
        ConfigError: an unknown experiment or a configuration the backend cannot run (before anything runs).
        PipelineError: a notebook fails (the failed copy is kept and named).
    """
    t0 = time.perf_counter()
    check_arguments(backend=backend, experiments=experiments, force=force, quick=quick, out_dir=traces_dir,
                    seeds=seeds, overrides=overrides, frontier=frontier, jobs=jobs)
    backend = resolve_backend(backend)
    names = list(experiments) if experiments else default_matrix(backend)
    derive = bool(overrides)
    plans = []
    for n in names:  # fail fast on a bad name or configuration, before any long run or cache look-up
        cfg = prepare_config(n, backend, overrides=overrides, quick=quick, frontier=frontier, derive=derive)
        check_backend_config(cfg, backend)
        plans.append((cfg, select_arms(cfg, None), select_seeds(cfg, seeds)))
    traces = check_output_dir(Path(traces_dir) if traces_dir is not None else default_traces_dir(quick),
                              "traces directory (--traces)")
    check_quick_root(traces, quick)
    results = check_output_dir(Path(results_dir) if results_dir is not None else default_results_dir(quick),
                               "results directory (--results)")
    check_writable(traces, "traces directory", "--traces DIR")
    if figures:
        check_writable(results, "results directory", "--results DIR")
    verification, cached, rerender = None, 0, force
    if not get_backend(backend).real_time:
        from dlfp.pipeline.verify import verify_trials

        verification = verify_trials(plans, backend, traces, worker_count(backend, jobs),
                                     progress=bars_enabled(progress), force=force)
        if verification.fresh:
            say(f"dlfp run-all: {verification.fresh_line()}")
        if verification.total:
            say(f"dlfp run-all: {verification.summary()}")
        force = False  # every trial was just rerun and checked, or verified by this code on this machine before
    elif not force:
        cached = sum(trial_state(trial_dir(traces, backend, cfg.name, a, s), cfg, a)[0] == "complete"
                     for cfg, arms, seed_list in plans for s in seed_list for a in arms)
    executed, fresh = [], 0
    for i, (n, (cfg, _, _)) in enumerate(zip(names, plans), 1):
        head = f"dlfp run-all [{backend}] experiment {i}/{len(names)}: {cfg.name}"
        r = execute_experiment_notebook_checked(
            n, backend=backend, traces_dir=traces, seeds=seeds, overrides=overrides, force=force, quick=quick,
            frontier=frontier, experiment_id=cfg.name, explicit_dir=traces_dir is not None, rerender=rerender,
            announce=lambda r, head=head: say(head + (" (fresh: notebook and tables not re-executed)" if r.fresh
                                                      else "")))
        executed.append(r.path)
        fresh += r.fresh
        TALLY.experiments.append(cfg.name)
    # a subset of seeds leaves the experiments incomplete: render what exists, into <results>-partial
    fig = render_figures_checked(traces if traces_dir is not None else None,
                                 results if results_dir is not None else None, quick=quick,
                                 allow_partial=bool(seeds), force=rerender) if figures else None
    if fig is not None and fig.fresh:
        say(f"dlfp run-all: tables and figures in {display_path(fig.path.parent)} fresh: not re-rendered")
    return dict(backend=backend, notebooks=executed, figures_notebook=fig.path if fig else None, results_dir=results,
                traces_dir=traces, seconds=time.perf_counter() - t0, verification=verification,
                trials=sum(len(a) * len(s) for _, a, s in plans), cached=cached, notebooks_fresh=fresh,
                figures_fresh=bool(fig and fig.fresh))


__all__ = ["ExperimentRun", "PendingTrial", "TrialOutcome", "run_all", "run_experiment", "run_parallel"]
