"""What a run will do, decided before anything runs: backend, config, arms, seeds, workers, stale trials.

* ``resolve_backend``: an explicit name, else ``$DLFP_BACKEND``, else ``auto``
  (``auto_backend``: the registry's ``auto`` field decides, never a backend's name).
* ``prepare_config``: the experiment with ``--set`` overrides, ``--quick`` limits and the fixed-cap
  frontier arms (``frontier_overrides``); with overrides and no explicit output root, the trials are their own
  experiment ``<name>+<8 hex>`` (``derived_experiment``), so the shipped trials are never replaced.
* ``check_backend_config``: the engine side of a config (model, GPU, TP split, KV cache), before any trial.
* ``select_arms``, ``select_seeds``, ``worker_count``: the trial plan and how many processes run it.
* ``trial_state``/``config_mismatch``: whether a trial on disk is complete, corrupt or stale.
* ``default_matrix``: the experiments ``run-all`` runs on a backend.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from dlfp.backends import BACKENDS, REGISTRY, Backend, get_backend
from dlfp.config import (ConfigError, ExperimentConfig, check_runnable, experiment_file, list_experiments,
                         load_experiment)
from dlfp.pipeline.errors import PipelineError
from dlfp.pipeline.progress import say
from dlfp.trial_config import first_difference
from dlfp.traces.format import TraceError, load_trial

#: Environment variable that overrides backend auto-detection (a backend name or ``auto``).
BACKEND_ENV = "DLFP_BACKEND"
#: Environment variable that sets the default number of trial worker processes.
JOBS_ENV = "DLFP_JOBS"
#: Measured requests per trial in ``--quick`` mode (a smoke run, not a result).
QUICK_NUM_REQUESTS = 20
#: Name prefix of the fixed-cap frontier arms: ``fixed-<cap>``.
FRONTIER_PREFIX = "fixed-"


# --------------------------------------------------------------------------- backend


def gpu_present() -> bool:
    """True when a CUDA GPU is visible: ``/dev/nvidia0`` or an entry in ``/proc/driver/nvidia/gpus``, unless
    ``CUDA_VISIBLE_DEVICES`` is empty or ``-1`` (nothing is imported: no torch, no vLLM)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia/gpus").is_dir() and any(
        Path("/proc/driver/nvidia/gpus").iterdir()
    ):
        return True
    return False


def software_present(backend: Backend) -> bool:
    """True when every module in ``backend.requires`` can be imported (found, not imported)."""
    return all(importlib.util.find_spec(m) is not None for m in backend.requires)


def auto_backend(gpu: bool) -> str:
    """The backend ``auto`` means on this machine.

    With a GPU (``gpu``), the first registered backend marked ``auto="gpu"``
    whose software is installed; otherwise the one marked ``auto="default"``.
    """
    if gpu:
        for b in REGISTRY.values():
            if b.auto == "gpu" and software_present(b):
                return b.name
    return next(b.name for b in REGISTRY.values() if b.auto == "default")


def resolve_backend(requested: str | None = None) -> str:
    """The backend to run on.

    A named ``requested`` backend wins; ``auto`` or ``None`` defers to
    ``$DLFP_BACKEND``, and ``auto`` there (or no variable) means
    ``auto_backend(gpu_present())``.

    Raises:
        PipelineError: an unknown backend name.
    """
    choice = (requested or "").strip().lower()
    if choice in ("", "auto"):
        choice = (os.environ.get(BACKEND_ENV) or "auto").strip().lower()
    if choice == "auto":
        return auto_backend(gpu_present())
    if choice not in BACKENDS:
        raise PipelineError(f"unknown backend {choice!r}; known: auto, {', '.join(BACKENDS)}")
    return choice


def worker_count(backend: str, jobs: int | None) -> int:
    """Trial worker processes: ``jobs`` if given, else ``$DLFP_JOBS``, else the CPU count on a backend whose
    trials may run in parallel (``Backend.parallel_safe``) and 1 elsewhere.

    Raises:
        PipelineError: ``$DLFP_JOBS`` is not a positive integer.
    """
    if jobs is not None:
        return jobs
    env_jobs = os.environ.get(JOBS_ENV, "").strip()
    if env_jobs:
        if not env_jobs.isdigit() or int(env_jobs) < 1:
            raise PipelineError(f"{JOBS_ENV}={env_jobs!r} is not a positive integer")
        return int(env_jobs)
    return (os.cpu_count() or 1) if get_backend(backend).parallel_safe else 1


# --------------------------------------------------------------------------- config


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


def frontier_overrides(cfg: ExperimentConfig) -> dict[str, Any]:
    """Overrides adding one fixed-cap arm ``fixed-<cap>`` per cap in ``backend_options.frontier_caps``.

    These arms trace the fixed-cap frontier (P99 ITL against P99 TTFT, one
    point per cap). Arms that already exist are left alone.

    Raises:
        PipelineError: ``frontier_caps`` is not a list of positive integers.
    """
    caps = cfg.backend_options.get("frontier_caps") or []
    if not isinstance(caps, (list, tuple)) or not all(isinstance(c, int) and c > 0 for c in caps):
        raise PipelineError(f"experiment {cfg.name!r}: field backend_options.frontier_caps must be a list of "
                            f"positive integers, got {caps!r}")
    return {f"arms.{FRONTIER_PREFIX}{c}": {"policy": "fixed", "cap": int(c)} for c in caps
            if f"{FRONTIER_PREFIX}{c}" not in cfg.arms}


def derived_experiment(name: str, overrides: dict[str, Any]) -> str:
    """The experiment id of ``name`` run with ``overrides``: ``<name>+<8 hex>``, a hash of the sorted overrides.

    Trials run with ``--set`` overrides go there, so they never replace (or pair with) the canonical trials.
    """
    blob = json.dumps(_normalise(overrides), sort_keys=True, separators=(",", ":"))
    return f"{name.split('+', 1)[0]}+{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


def load_config(experiment: str, overrides: dict[str, Any] | None = None, quick: bool = False,
                derive: bool = False) -> ExperimentConfig:
    """Load an experiment config with overrides (and quick-mode limits).

    ``derive``: with overrides, name the result ``derived_experiment(name, overrides)``.

    Raises:
        ConfigError: unknown experiment (lists the known ones) or a bad override.
    """
    cfg = load_experiment(experiment)
    check_own_name(experiment, cfg)
    return _overridden(cfg, overrides, quick, derive)


#: Config fields that document an experiment without changing what runs.
_DOC_KEYS = ("description", "assumptions", "tags")


def check_own_name(source: str | Path, cfg: ExperimentConfig) -> None:
    """Refuse an experiment YAML given by path whose ``name`` is a declared experiment (``experiment_file``) but
    whose settings differ from that declaration: its trials would land in the declared experiment's folder.

    Raises:
        ConfigError: naming the file, the experiment and the first differing field.
    """
    p = Path(source)
    if p.suffix not in (".yaml", ".yml"):
        return
    declared_file = experiment_file(cfg.name)
    if not declared_file.is_file() or declared_file.resolve() == p.resolve():
        return
    declared = load_experiment(cfg.name)
    mine, theirs = ({k: v for k, v in _normalise(c.model_dump(mode="json")).items() if k not in _DOC_KEYS}
                    for c in (cfg, declared))
    diff = first_difference(mine, theirs)
    if diff is not None:
        raise ConfigError(f"{p}: names experiment {cfg.name!r} but differs from {declared_file} ({diff}); give it a "
                          f"name of its own (field name) so its trials never replace those of {cfg.name}")


def _overridden(cfg: ExperimentConfig, overrides: dict[str, Any] | None, quick: bool,
                derive: bool) -> ExperimentConfig:
    base = cfg.name
    if quick:
        cfg = cfg.with_overrides(quick_overrides(cfg))
    cfg = cfg.with_overrides(overrides or {})
    if derive and overrides:
        cfg = cfg.with_overrides({"name": derived_experiment(base, overrides)})
    return cfg


def prepare_config(experiment: str | ExperimentConfig, backend: str, *, overrides: dict[str, Any] | None = None,
                   quick: bool = False, frontier: bool | None = None, derive: bool = False) -> ExperimentConfig:
    """The config ``run_experiment`` runs: loaded (or given), overridden, checked, with frontier arms if asked.

    ``frontier=None`` adds the frontier arms on a backend with ``Backend.frontier_by_default``. ``derive``: see
    ``load_config``.

    Raises:
        ConfigError: unknown experiment, bad override, or a request longer than ``max_model_len``.
        PipelineError: bad ``backend_options.frontier_caps``.
        WorkloadError: a replayed trace file that is missing or garbled (``check_workload_files``).
    """
    if isinstance(experiment, ExperimentConfig):
        cfg = _overridden(experiment, overrides, quick, derive)
    else:
        cfg = load_config(experiment, overrides, quick, derive)
    check_runnable(cfg)
    check_workload_files(cfg)
    if frontier is None:
        frontier = get_backend(backend).frontier_by_default
    if frontier:
        cfg = cfg.with_overrides(frontier_overrides(cfg))
    return cfg


def check_workload_files(cfg: ExperimentConfig) -> None:
    """Read the trace file a replayed workload names (``workload.trace.path``), so a missing or garbled one stops
    the run before any trial starts (the read is cached for the trials that follow).

    Raises:
        WorkloadError: the file is missing, a directory, or not of its format (one line naming the file).
    """
    tr = cfg.workload.trace
    if cfg.workload.kind == "trace" and tr is not None:
        from dlfp.workload.replay import load_trace

        load_trace(tr.path, tr.format)


def check_backend_config(cfg: ExperimentConfig, backend: str) -> None:
    """Check the engine side of ``cfg`` before any trial runs or any cache is looked at.

    The model, GPU, TP split, device options and KV-cache size (``dlfp.backends.sim.runner.build_engine_parts``,
    which the emulator uses too; they are properties of the experiment on every backend), then the runner's own
    ``check_config(cfg)`` if it has one.

    Raises:
        ConfigError: naming the experiment and the field.
    """
    from dlfp.backends.sim.runner import build_engine_parts

    build_engine_parts(cfg)
    check = getattr(get_backend(backend).module(), "check_config", None)
    if callable(check):
        check(cfg)


# --------------------------------------------------------------------------- arguments (notebook parameters)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


#: Each argument of ``run_experiment``/``run_all`` (the notebook's parameters): (accepts, expected, example).
_ARGUMENTS: dict[str, tuple[Any, str, str]] = {
    "experiment": (lambda v: isinstance(v, (str, ExperimentConfig)), "an experiment name", '"qwen3-0.6b-tp1"'),
    "backend": (lambda v: v is None or isinstance(v, str), "a backend name or None", '"sim"'),
    "seeds": (lambda v: v is None or isinstance(v, (list, tuple)) and all(_is_int(s) for s in v),
              "a list of integers or None", "[801, 802]"),
    "arms": (lambda v: v is None or isinstance(v, (list, tuple)) and all(isinstance(a, str) for a in v),
             "a list of arm names or None", '["baseline", "dlfp"]'),
    "experiments": (lambda v: v is None or isinstance(v, (list, tuple)) and all(isinstance(a, str) for a in v),
                    "a list of experiment names or None", '["qwen3-0.6b-tp1"]'),
    "out_dir": (lambda v: v is None or isinstance(v, (str, os.PathLike)), "a folder path or None", '"data/traces"'),
    "overrides": (lambda v: v is None or isinstance(v, dict) and all(isinstance(k, str) for k in v),
                  "a mapping of dotted config keys to values", '{"workload.num_requests": 5}'),
    "force": (lambda v: isinstance(v, bool), "true or false", "True"),
    "quick": (lambda v: isinstance(v, bool), "true or false", "True"),
    "frontier": (lambda v: v is None or isinstance(v, bool), "true, false or None", "False"),
    "jobs": (lambda v: v is None or _is_int(v) and v > 0, "a positive integer or None", "2"),
}


def check_arguments(**arguments: Any) -> None:
    """Check the type of each named argument of ``run_experiment``/``run_all`` (the parameters ``papermill -p``
    and ``-y`` hand ``notebooks/experiment.ipynb``), before anything runs.

    Raises:
        PipelineError: one line naming the first wrong argument, the type expected, an example and what was given,
            e.g. ``parameter seeds: expected a list of integers or None, e.g. [801, 802]; got int 801``.
    """
    for name, value in arguments.items():
        accepts, expected, example = _ARGUMENTS[name]
        if not accepts(value):
            hint = ""
            if name in ("overrides", "seeds", "arms", "experiments"):
                hint = f" (papermill takes it as YAML: -y '{{\"{name}\": {example}}}')"
            raise PipelineError(f"parameter {name}: expected {expected}, e.g. {example}; got "
                                f"{type(value).__name__} {value!r}{hint}")


# --------------------------------------------------------------------------- trial plan


def _arm_order(cfg: ExperimentConfig, arm: str) -> tuple:
    """Sort key: the baseline first, then the named arms by name, then the fixed-cap arms by cap."""
    cap = arm[len(FRONTIER_PREFIX):] if arm.startswith(FRONTIER_PREFIX) else ""
    return (arm != cfg.baseline_arm, cap.isdigit(), int(cap) if cap.isdigit() else 0, arm)


def select_arms(cfg: ExperimentConfig, arms: Sequence[str] | None) -> list[str]:
    """``arms`` as given, or every arm of ``cfg`` in run order (``_arm_order``).

    Raises:
        PipelineError: an arm the config does not have.
    """
    arm_list = list(arms) if arms else sorted(cfg.arms, key=lambda a: _arm_order(cfg, a))
    unknown = [a for a in arm_list if a not in cfg.arms]
    if unknown:
        raise PipelineError(f"experiment {cfg.name!r} has no arm(s) {unknown}; arms: {sorted(cfg.arms)}")
    return arm_list


def select_seeds(cfg: ExperimentConfig, seeds: Sequence[int] | None) -> list[int]:
    """``seeds`` as given (a note on stderr names those outside the config's paired seeds), or the config's.

    Raises:
        PipelineError: a seed that is not a non-negative integer.
    """
    seed_list = list(seeds) if seeds else list(cfg.seeds)
    bad = [s for s in seed_list if isinstance(s, bool) or not isinstance(s, int) or s < 0]
    if bad:
        raise PipelineError(f"seeds {bad} of experiment {cfg.name!r}: seeds are non-negative integers")
    extra = [s for s in seed_list if s not in cfg.seeds]
    if extra:
        say(f"dlfp: note: seed(s) {', '.join(map(str, extra))} are not among {cfg.name}'s paired seeds "
            f"{', '.join(map(str, cfg.seeds))}")
    return seed_list


# --------------------------------------------------------------------------- trials on disk


def _normalise(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


#: Config fields that do not shape a trial (documentation, the seed list, the arm table and its baseline).
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


# --------------------------------------------------------------------------- the run-all matrix


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
    backends. On a backend with ``Backend.hardware_matched`` the hardware must
    match: without a GPU only the CPU experiments (``gpu: cpu``), with one only
    the GPU experiments.
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


__all__ = ["BACKEND_ENV", "FRONTIER_PREFIX", "JOBS_ENV", "QUICK_NUM_REQUESTS", "auto_backend", "check_arguments",
           "check_backend_config", "check_own_name", "check_workload_files",
           "config_mismatch", "default_matrix", "derived_experiment", "experiment_backends", "frontier_overrides",
           "gpu_present", "load_config", "parse_overrides", "prepare_config", "quick_overrides", "resolve_backend",
           "select_arms", "select_seeds", "software_present", "trial_state", "worker_count"]
