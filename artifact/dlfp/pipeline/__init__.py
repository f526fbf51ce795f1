"""Run experiments and render results: the glue behind ``dlfp run``, ``run-all`` and ``figures``.

Data flows one way (see ``dlfp/__init__``): a config and a backend give trials,
trials are written under ``<traces>/<backend>/<experiment>/<arm>/seed-<seed>/``
(``dlfp.traces.format``), and only ``figures.ipynb`` (through ``dlfp.analysis.tables`` and
``dlfp.analysis.figures``) turns saved traces into tables and figures.

* ``run_experiment`` runs every arm x seed of one experiment in this process,
  skipping a trial whose directory already loads (``traces.is_complete``)
  unless ``force``; a partial or corrupt trial directory is named and re-run.
  Trials are written atomically one by one, so an interrupted run loses at
  most the trial in flight.
* ``run_all`` executes ``notebooks/experiment.ipynb`` through papermill once
  per experiment (the executed copy is saved beside that experiment's traces)
  and then ``notebooks/figures.ipynb`` into the results directory.
* ``render_figures`` executes ``figures.ipynb`` from cached traces only.

The backend is chosen by ``resolve_backend``: an explicit name, else the
``DLFP_BACKEND`` environment variable, else ``auto``: ``vllm`` when a CUDA GPU
and vLLM are both present, ``sim`` otherwise.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from dlfp.config import ConfigError, ExperimentConfig, check_runnable, list_experiments, load_experiment
from dlfp.backends import BACKENDS, get_backend
from dlfp.traces.format import TraceError, Trial, load_trial, trial_dir, write_trial

#: Environment variable that overrides backend auto-detection (``sim``, ``emu``, ``vllm`` or ``auto``).
BACKEND_ENV = "DLFP_BACKEND"
#: Environment variable set by ``run_all`` so that progress bars inside a papermill kernel
#: write to the kernel's inherited stderr (the terminal of ``make run-all``), not into the notebook.
PROGRESS_ENV = "DLFP_PROGRESS_STDERR"
#: Environment variable naming the repository root (default: found from this file or the cwd).
ROOT_ENV = "DLFP_ROOT"
#: Measured requests per trial in ``--quick`` mode (a smoke run, not a result).
QUICK_NUM_REQUESTS = 20


JOBS_ENV = "DLFP_JOBS"


class PipelineError(RuntimeError):
    """A run that cannot proceed; the message names the experiment, trial or file."""


# --------------------------------------------------------------------------- paths


def repo_root() -> Path:
    """The repository root: ``$DLFP_ROOT``, else the checkout holding this package, else the cwd.

    The checkout is recognised by a ``pyproject.toml`` next to ``notebooks/``.
    """
    env = os.environ.get(ROOT_ENV)
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve()
    for cand in [*here.parents, *Path.cwd().resolve().parents, Path.cwd().resolve()]:
        if (cand / "pyproject.toml").exists() and (cand / "notebooks").is_dir():
            return cand
    return Path.cwd().resolve()


def default_traces_dir(quick: bool = False) -> Path:
    """``<root>/data/traces`` (``data/traces-quick`` for ``--quick`` runs, kept apart from results)."""
    return repo_root() / "data" / ("traces-quick" if quick else "traces")


def default_results_dir(quick: bool = False) -> Path:
    """``<root>/data/results`` (``data/results-quick`` for ``--quick`` runs)."""
    return repo_root() / "data" / ("results-quick" if quick else "results")


def default_published_csv() -> Path:
    """``<root>/data/paper/published.csv``: the paper's numbers, transcribed once."""
    return repo_root() / "data" / "paper" / "published.csv"


def check_output_dir(path: Path, what: str) -> Path:
    """``path`` if it is, or can be created as, a directory; else ``PipelineError`` naming ``what`` and the path.

    Rejects a path that is a regular file, or below one (``mkdir`` would raise
    ``FileExistsError``/``NotADirectoryError`` later, after work was done).
    """
    p = Path(path)
    for cand in (p, *p.parents):
        if cand.exists():
            if not cand.is_dir():
                where = "" if cand == p else f" ({cand} is a file)"
                raise PipelineError(f"{what} {p} is not a directory{where}")
            break
    return p


def notebooks_dir() -> Path:
    """``<root>/notebooks``: the clean, output-free notebook sources."""
    return repo_root() / "notebooks"


# --------------------------------------------------------------------------- backend


def gpu_present() -> bool:
    """True when a CUDA GPU is visible (``nvidia-smi`` device nodes or torch, without importing vLLM)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir() and any(
        Path("/proc/driver/nvidia/gpus").iterdir()
    ):
        return True
    return False


def vllm_present() -> bool:
    """True when the ``vllm`` package can be imported (found, not imported)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(requested: str | None = None) -> str:
    """The backend to run on.

    A named ``requested`` backend (``sim``, ``emu``, ``vllm``) wins; ``auto``
    or ``None`` defers to ``$DLFP_BACKEND``, and ``auto`` there (or no
    variable) means ``vllm`` when a GPU and vLLM are present, else ``sim``.

    Raises:
        PipelineError: an unknown backend name.
    """
    choice = (requested or "").strip().lower()
    if choice in ("", "auto"):
        choice = (os.environ.get(BACKEND_ENV) or "auto").strip().lower()
    if choice == "auto":
        return "vllm" if (gpu_present() and vllm_present()) else "sim"
    if choice not in BACKENDS:
        raise PipelineError(f"unknown backend {choice!r}; known: auto, {', '.join(BACKENDS)}")
    return choice


# --------------------------------------------------------------------------- overrides


def parse_overrides(items: Iterable[str] | None) -> dict[str, Any]:
    """Parse ``key=value`` strings (values as YAML: ``5`` -> int, ``true`` -> bool, ``[1,2]`` -> list).

    Raises:
        PipelineError: an item without ``=`` or with an empty key.
    """
    import yaml

    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise PipelineError(f"override {item!r}: expected key=value, e.g. workload.num_requests=5")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        out[key.strip()] = value
    return out


def quick_overrides(cfg: ExperimentConfig) -> dict[str, Any]:
    """Overrides for ``--quick``: at most ``QUICK_NUM_REQUESTS`` measured requests (a smoke run)."""
    n = min(cfg.workload.num_requests, QUICK_NUM_REQUESTS)
    return {} if n == cfg.workload.num_requests else {"workload.num_requests": n}


FRONTIER_PREFIX = "fixed-"


def frontier_overrides(cfg: ExperimentConfig) -> dict[str, Any]:
    """Overrides adding one fixed-cap arm ``fixed-<cap>`` per cap in ``backend_options.frontier_caps``.

    These arms trace the fixed-cap frontier (P99 ITL vs P99 TTFT per cap) of
    issue 7. Arms that already exist are left alone.

    Raises:
        PipelineError: ``frontier_caps`` is not a list of positive integers.
    """
    caps = cfg.backend_options.get("frontier_caps") or []
    if not isinstance(caps, (list, tuple)) or not all(isinstance(c, int) and c > 0 for c in caps):
        raise PipelineError(f"experiment {cfg.name!r}: field backend_options.frontier_caps must be a list of "
                            f"positive integers, got {caps!r}")
    return {f"arms.{FRONTIER_PREFIX}{c}": {"policy": "fixed", "cap": int(c)} for c in caps
            if f"{FRONTIER_PREFIX}{c}" not in cfg.arms}


def load_config(experiment: str, overrides: dict[str, Any] | None = None, quick: bool = False) -> ExperimentConfig:
    """Load an experiment config with overrides (and quick-mode limits).

    Raises:
        ConfigError: unknown experiment (lists the known ones) or a bad override.
    """
    cfg = load_experiment(experiment)
    if quick:
        cfg = cfg.with_overrides(quick_overrides(cfg))
    return cfg.with_overrides(overrides or {})


# --------------------------------------------------------------------------- resume


def _normalise(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


_IGNORED_CONFIG_KEYS = ("description", "assumptions", "tags", "seeds", "arms", "baseline_arm")


def config_mismatch(metadata: dict, cfg: ExperimentConfig, arm: str) -> list[str]:
    """Dotted config keys whose value in a stored trial differs from ``cfg`` for ``arm``.

    Only what shapes the trial is compared: every field except the
    documentation fields, the seed list and the *other* arms (adding an arm
    must not invalidate the existing ones). Returns ``[]`` when the trial does
    not record its config as a mapping (nothing to compare).
    """
    stored = metadata.get("config")
    if not isinstance(stored, dict):
        return []
    now = _normalise(cfg.model_dump(mode="json"))
    stored = _normalise(stored)
    diffs: list[str] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{prefix}{k}.")
        elif a != b:
            diffs.append(prefix.rstrip("."))

    for k in sorted(set(now) | set(stored)):
        if k in _IGNORED_CONFIG_KEYS:
            continue
        walk(stored.get(k), now.get(k), f"{k}.")
    walk((stored.get("arms") or {}).get(arm), now["arms"].get(arm), f"arms.{arm}.")
    return diffs


@dataclass
class TrialOutcome:
    """What ``run_experiment`` did with one trial: ``ran``, ``skipped`` (complete on disk) or ``reran``."""

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


def trial_state(path: Path, cfg: ExperimentConfig, arm: str) -> tuple[str, str]:
    """``("missing", "")``, ``("complete", "")``, ``("corrupt", why)`` or ``("stale", why)`` for one trial directory."""
    if not path.exists():
        return "missing", ""
    try:
        trial = load_trial(path)
    except TraceError as e:
        return "corrupt", str(e)
    diffs = config_mismatch(trial.metadata, cfg, arm)
    if diffs:
        return "stale", f"recorded config differs in {', '.join(diffs[:5])}{' ...' if len(diffs) > 5 else ''}"
    return "complete", ""


# --------------------------------------------------------------------------- progress


_TERMINAL = None


def _progress_file():
    """Where progress bars go.

    Inside a papermill kernel started by ``run_all`` (``$DLFP_PROGRESS_STDERR=1``)
    they go to the kernel's original stderr, i.e. the terminal of ``make
    run-all``, through the copy of fd 2 that ipykernel keeps before it captures
    the stream, so the bars do not end up in the executed notebook. Elsewhere
    they go to ``sys.stderr``.
    """
    global _TERMINAL
    if os.environ.get(PROGRESS_ENV) != "1":
        return sys.stderr
    if _TERMINAL is None:
        fd = getattr(sys.stderr, "_original_stdstream_copy", None)
        try:
            _TERMINAL = os.fdopen(os.dup(fd), "w", buffering=1) if isinstance(fd, int) else sys.__stderr__
        except OSError:
            _TERMINAL = sys.__stderr__
    return _TERMINAL or sys.stderr


def _say(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(msg, file=_progress_file())


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
        overrides: dotted-key config overrides, e.g. ``{"workload.num_requests": 5}``.
        force: re-run complete trials too.
        quick: at most ``QUICK_NUM_REQUESTS`` measured requests (default root ``data/traces-quick``).
        frontier: also run the fixed-cap arms of ``backend_options.frontier_caps`` (``frontier_overrides``);
            ``None`` = only on the simulator, where they are cheap.
        progress: show tqdm bars (trials; requests done/total with ETA).
        jobs: trials run in parallel worker processes (default: the CPU count
            on the simulator, whose trials are independent and CPU-bound; 1 on
            the engine backends, which need the whole machine and real time;
            ``$DLFP_JOBS`` overrides the default).

    Raises:
        ConfigError: unknown experiment or bad override.
        PipelineError: unknown backend, arm or seed request.
        BackendUnavailable: the backend's software is not installed.
    """
    from tqdm import tqdm

    from dlfp import backends as runners

    backend = resolve_backend(backend)
    if isinstance(experiment, ExperimentConfig):
        cfg = experiment.with_overrides(quick_overrides(experiment) if quick else {}).with_overrides(overrides or {})
    else:
        cfg = load_config(experiment, overrides, quick)
    check_runnable(cfg)
    if frontier is None:
        frontier = get_backend(backend).frontier_by_default
    if frontier:
        cfg = cfg.with_overrides(frontier_overrides(cfg))
    def arm_key(a: str):
        cap = a[len(FRONTIER_PREFIX):] if a.startswith(FRONTIER_PREFIX) else ""
        return (a != cfg.baseline_arm, cap.isdigit(), int(cap) if cap.isdigit() else 0, a)

    arm_list = list(arms) if arms else sorted(cfg.arms, key=arm_key)
    unknown = [a for a in arm_list if a not in cfg.arms]
    if unknown:
        raise PipelineError(f"experiment {cfg.name!r} has no arm(s) {unknown}; arms: {sorted(cfg.arms)}")
    seed_list = list(seeds) if seeds else list(cfg.seeds)
    bad = [s for s in seed_list if isinstance(s, bool) or not isinstance(s, int) or s < 0]
    if bad:
        raise PipelineError(f"seeds {bad} of experiment {cfg.name!r}: seeds are non-negative integers")
    extra = [s for s in seed_list if s not in cfg.seeds]
    if extra:
        _say(f"dlfp: note: seed(s) {', '.join(map(str, extra))} are not among {cfg.name}'s paired seeds "
             f"{', '.join(map(str, cfg.seeds))}")
    root = check_output_dir(Path(out_dir) if out_dir is not None else default_traces_dir(quick),
                            "traces directory (--out)")
    run = ExperimentRun(config=cfg, backend=backend, traces_dir=root)
    plan = [(s, a) for s in seed_list for a in arm_list]
    pfile = _progress_file()
    bar = tqdm(total=len(plan), desc=f"{cfg.name} [{backend}] trials", unit="trial", file=pfile, disable=not progress,
               position=0, leave=True, dynamic_ncols=True)
    if jobs is None:
        env_jobs = os.environ.get(JOBS_ENV, "").strip()
        if env_jobs:
            if not env_jobs.isdigit() or int(env_jobs) < 1:
                raise PipelineError(f"{JOBS_ENV}={env_jobs!r} is not a positive integer")
            jobs = int(env_jobs)
        else:
            jobs = (os.cpu_count() or 1) if get_backend(backend).parallel_safe else 1
    todo = []
    for seed, arm in plan:
        path = trial_dir(root, backend, cfg.name, arm, seed)
        state, why = trial_state(path, cfg, arm)
        if state == "complete" and not force:
            run.outcomes.append(TrialOutcome(cfg.name, arm, seed, path, "skipped", "complete on disk"))
            bar.update(1)
            continue
        if state in ("corrupt", "stale"):
            _say(f"dlfp: trial {path} is {state} ({why}); re-running it")
        todo.append((seed, arm, path, state, why))
    if jobs > 1 and len(todo) > 1:
        _run_parallel(cfg, backend, root, todo, jobs, run, bar)
        todo = []
    for seed, arm, path, state, why in todo:
        bar.set_postfix_str(f"{arm} seed {seed}")
        t0 = time.perf_counter()
        req_bar = tqdm(total=0, desc=f"  {cfg.name} {arm} seed {seed}", unit="req", file=pfile,
                       disable=not progress, position=1, leave=False, dynamic_ncols=True)

        def on_progress(done: int, total: int, _b=req_bar) -> None:
            if _b.total != total:
                _b.total = total
                _b.refresh()
            _b.update(max(0, done - _b.n))

        try:
            trial = runners.run_trial(cfg, arm, seed, backend=backend, progress=on_progress)
        finally:
            req_bar.close()
        _check_trial(trial, cfg, arm, seed, backend)
        write_trial(trial, root, overwrite=True)
        status, reason = _status(state, why)
        run.outcomes.append(TrialOutcome(cfg.name, arm, seed, path, status, reason, time.perf_counter() - t0))
        bar.update(1)
    bar.close()
    order = {p: i for i, p in enumerate(plan)}
    run.outcomes.sort(key=lambda o: order[(o.seed, o.arm)])
    return run


def _status(state: str, why: str) -> tuple[str, str]:
    status = "ran" if state in ("missing", "complete") else "reran"
    reason = {"missing": "", "complete": "forced"}.get(state, f"{state}: {why}")
    return status, reason


def _trial_worker(cfg: ExperimentConfig, arm: str, seed: int, backend: str, root: str) -> float:
    """Run and write one trial in a worker process; returns its wall time (s)."""
    from dlfp import backends as runners

    t0 = time.perf_counter()
    trial = runners.run_trial(cfg, arm, seed, backend=backend)
    _check_trial(trial, cfg, arm, seed, backend)
    write_trial(trial, root, overwrite=True)
    return time.perf_counter() - t0


def _run_parallel(cfg: ExperimentConfig, backend: str, root: Path, todo: list, jobs: int, run: "ExperimentRun",
                  bar) -> None:
    """Run ``todo`` trials on ``jobs`` processes; each worker writes its own trial atomically,
    so an interruption loses only the trials in flight.

    On ``KeyboardInterrupt`` (Ctrl-C) pending trials are cancelled, the worker
    processes are terminated (their half-written temporary directories are
    never renamed into place) and the interrupt is re-raised; completed trials
    stay on disk.
    """
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=mp.get_context("spawn"))
    try:
        futs = {pool.submit(_trial_worker, cfg, arm, seed, backend, str(root)): (seed, arm, path, state, why)
                for seed, arm, path, state, why in todo}
        for fut in as_completed(futs):
            seed, arm, path, state, why = futs[fut]
            elapsed = fut.result()  # re-raises the worker's error, naming nothing lost: finished trials are on disk
            status, reason = _status(state, why)
            run.outcomes.append(TrialOutcome(cfg.name, arm, seed, path, status, reason, elapsed))
            bar.set_postfix_str(f"{arm} seed {seed}")
            bar.update(1)
    except KeyboardInterrupt:
        _stop_pool(pool)
        raise
    pool.shutdown(wait=True)


def _stop_pool(pool) -> None:
    """Cancel a process pool's pending work and terminate its workers now (do not wait for running trials)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=10)


def _check_trial(trial: Trial, cfg: ExperimentConfig, arm: str, seed: int, backend: str) -> None:
    md = trial.metadata
    want = {"experiment": cfg.name, "arm": arm, "seed": seed, "backend": backend}
    bad = {k: md.get(k) for k, v in want.items() if md.get(k) != v}
    if bad:
        raise PipelineError(f"backend {backend!r} returned a trial whose metadata {bad} does not match {want}")


# --------------------------------------------------------------------------- papermill


def _execute(notebook: Path, output: Path, parameters: dict[str, Any], *, cwd: Path | None = None,
             progress_env: bool = True) -> Path:
    """Execute ``notebook`` with papermill into ``output`` (written atomically)."""
    import papermill as pm

    if not notebook.exists():
        raise PipelineError(f"notebook {notebook} does not exist")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.stem}.tmp.ipynb")
    old = os.environ.get(PROGRESS_ENV)
    if progress_env:
        os.environ[PROGRESS_ENV] = "1"
    try:
        pm.execute_notebook(str(notebook), str(tmp), parameters=parameters, cwd=str(cwd or notebook.parent),
                            progress_bar=False, kernel_name="python3", log_output=False)
    except pm.PapermillExecutionError as e:
        # Keep the failed copy for inspection next to where the output would be.
        failed = output.with_name(output.stem + ".failed.ipynb")
        if tmp.exists():
            os.replace(tmp, failed)
        last = (e.evalue or "").strip().splitlines()
        raise PipelineError(f"{notebook.name} failed ({e.ename}: {last[-1] if last else ''}); "
                            f"executed copy: {failed}") from None
    finally:
        if progress_env:
            if old is None:
                os.environ.pop(PROGRESS_ENV, None)
            else:
                os.environ[PROGRESS_ENV] = old
    os.replace(tmp, output)
    stale = output.with_name(output.stem + ".failed.ipynb")
    if stale.exists():
        stale.unlink()
    return output


def execute_experiment_notebook(experiment: str, *, backend: str, traces_dir: Path, seeds: Sequence[int] | None = None,
                                overrides: dict[str, Any] | None = None, force: bool = False, quick: bool = False,
                                frontier: bool | None = None) -> Path:
    """Execute ``notebooks/experiment.ipynb`` for one experiment; the copy goes to ``<traces>/<backend>/<exp>/experiment.ipynb``."""
    out = Path(traces_dir) / backend / experiment / "experiment.ipynb"
    params = dict(experiment=experiment, backend=backend, seeds=list(seeds) if seeds else None,
                  out_dir=str(Path(traces_dir).resolve()), overrides=dict(overrides or {}), force=bool(force),
                  quick=bool(quick), frontier=frontier)
    return _execute(notebooks_dir() / "experiment.ipynb", out, params)


def render_figures(traces_dir: str | Path | None = None, results_dir: str | Path | None = None,
                   published_csv: str | Path | None = None, quick: bool = False,
                   formats: Sequence[str] = ("png", "pdf")) -> Path:
    """Execute ``notebooks/figures.ipynb`` from cached traces only; returns the executed copy's path.

    The executed copy goes to ``<results_dir>/figures.ipynb``; tables and
    figures to ``results_dir``. Never runs an engine.

    Raises:
        PipelineError: the traces directory does not exist, or the notebook fails.
    """
    traces = Path(traces_dir) if traces_dir is not None else default_traces_dir(quick)
    results = check_output_dir(Path(results_dir) if results_dir is not None else default_results_dir(quick),
                               "results directory (--out)")
    if traces.exists() and not traces.is_dir():
        raise PipelineError(f"traces directory {traces} is not a directory")
    if not traces.is_dir():
        raise PipelineError(f"traces directory {traces} does not exist (run `dlfp run-all` first)")
    published = Path(published_csv) if published_csv is not None else default_published_csv()
    params = dict(traces_dir=str(traces.resolve()), results_dir=str(results.resolve()),
                  published_csv=str(published.resolve()), formats=list(formats))
    return _execute(notebooks_dir() / "figures.ipynb", results / "figures.ipynb", params, progress_env=False)


def run_all(*, backend: str | None = None, experiments: Sequence[str] | None = None, force: bool = False,
            quick: bool = False, traces_dir: str | Path | None = None, results_dir: str | Path | None = None,
            seeds: Sequence[int] | None = None, overrides: dict[str, Any] | None = None,
            figures: bool = True, frontier: bool | None = None) -> dict[str, Any]:
    """Run the experiment matrix through papermill, then render the figures.

    Returns a dict with ``backend``, ``notebooks`` (executed experiment copies),
    ``figures_notebook``, ``results_dir`` and ``seconds``.

    Raises:
        ConfigError: an unknown experiment (checked before anything runs).
        PipelineError: a notebook fails (the failed copy is kept and named).
    """
    t0 = time.perf_counter()
    backend = resolve_backend(backend)
    names = list(experiments) if experiments else default_matrix(backend)
    for n in names:  # fail fast on a bad name, before any long run
        load_experiment(n)
    traces = check_output_dir(Path(traces_dir) if traces_dir is not None else default_traces_dir(quick),
                              "traces directory (--traces)")
    results = check_output_dir(Path(results_dir) if results_dir is not None else default_results_dir(quick),
                               "results directory (--results)")
    executed = []
    for i, name in enumerate(names, 1):
        _say(f"dlfp run-all [{backend}] experiment {i}/{len(names)}: {name}")
        executed.append(execute_experiment_notebook(name, backend=backend, traces_dir=traces, seeds=seeds,
                                                    overrides=overrides, force=force, quick=quick,
                                                    frontier=frontier))
    fig_nb = render_figures(traces, results, quick=quick) if figures else None
    return dict(backend=backend, notebooks=executed, figures_notebook=fig_nb, results_dir=results,
                traces_dir=traces, seconds=time.perf_counter() - t0)


def experiment_backends(name: str) -> tuple[str, ...] | None:
    """Backends an experiment is restricted to, from its tags, or ``None`` (any backend).

    A tag naming a backend (``vllm``), ``backend:<name>`` or ``<name>-only`` restricts it.
    """
    try:
        cfg = load_experiment(name)
    except ConfigError:
        return None
    only = []
    for t in cfg.tags:
        b = t.split(":", 1)[1] if t.startswith("backend:") else t[: -len("-only")] if t.endswith("-only") else t
        if b in BACKENDS and b not in only:
            only.append(b)
    return tuple(only) or None


def default_matrix(backend: str, gpu: bool | None = None) -> list[str]:
    """Experiments ``run-all`` runs on ``backend`` by default.

    Every shipped config not restricted (``experiment_backends``) to other
    backends. On ``vllm`` the hardware must match: without a GPU only the
    CPU experiments (``gpu: cpu``), with one only the GPU experiments.
    """
    gpu = gpu_present() if gpu is None else gpu
    out = []
    for name in list_experiments():
        only = experiment_backends(name)
        if only is not None and backend not in only:
            continue
        if get_backend(backend).hardware_matched:
            try:
                on_cpu = load_experiment(name).gpu == "cpu"
            except ConfigError:
                continue
            if on_cpu == gpu:
                continue
        out.append(name)
    return out
