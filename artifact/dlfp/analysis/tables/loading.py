"""Loading saved trials for the tables: ``LoadedTrial``, ``TraceSet`` and ``load_traces``.

A ``TraceSet`` holds every trial under a traces root
(``<root>/<backend>/<experiment>/<arm>/seed-<seed>``), the directories that
failed to load, and what every table needs of each trial, computed once at
load time (its ``dlfp.analysis.metrics.summarize`` summary, ITL samples,
measured token ids and guarded iterations; seconds). Tables computed from
the whole set are cached on it (``TraceSet.cached``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from dlfp.analysis import metrics
from dlfp.analysis.tables import checks, digest_cache
from dlfp.analysis.tables.trial_frames import guarded_iterations, measured_token_ids
from dlfp.config import ConfigError, ExperimentConfig, load_experiment
from dlfp.traces.format import TraceError, Trial, find_trials, load_trial

FIXED_CAP_PREFIX = "fixed-"
#: Load trials in parallel worker processes from this many trials on (spawn start-up costs ~2 s).
PARALLEL_MIN_TRIALS = 40


def arm_order(arm: str, baseline: str = "baseline") -> tuple:
    """Sort key of arms in every table: the baseline, then other arms by name, then ``fixed-<cap>`` arms by cap."""
    cap = arm[len(FIXED_CAP_PREFIX):] if arm.startswith(FIXED_CAP_PREFIX) else ""
    return (arm != baseline, cap.isdigit(), int(cap) if cap.isdigit() else 0, arm)


@dataclass
class LoadedTrial:
    """One trial loaded from disk, with the config it ran with (``None`` if neither recorded nor shipped)."""

    backend: str
    experiment: str
    arm: str
    seed: int
    path: Path
    trial: Trial
    config: ExperimentConfig | None

    @property
    def slo(self):
        """The SLO of the trial's config (``None`` without a config: ``metrics.summarize`` then uses its default)."""
        return self.config.slo if self.config is not None else None


@dataclass
class TraceSet:
    """Every trial under a traces root, plus the directories that failed to load (``problems``)."""

    root: Path
    trials: list[LoadedTrial] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (path, message)
    _digests: dict[str, dict] = field(default_factory=dict, repr=False)
    _index: dict | None = field(default=None, repr=False)
    _configs: dict = field(default_factory=dict, repr=False)
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)
    #: (backend, experiment) -> why its rows are incomplete; filled only by ``load_traces(allow_partial=True)``.
    incomplete: dict[tuple[str, str], str] = field(default_factory=dict)
    #: True for a set loaded with ``allow_partial=True``: no claim of a table made from it agrees.
    partial: bool = False

    def groups(self) -> list[tuple[str, str]]:
        """Sorted (backend, experiment) pairs that have at least one loaded trial."""
        return sorted({(t.backend, t.experiment) for t in self.trials})

    def select(self, backend: str, experiment: str, arm: str | None = None) -> list[LoadedTrial]:
        """Trials of one backend/experiment (and arm), sorted by arm then seed."""
        if self._index is None:
            idx: dict[tuple, list[LoadedTrial]] = {}
            for t in sorted(self.trials, key=lambda t: (t.arm, t.seed)):
                idx.setdefault((t.backend, t.experiment, None), []).append(t)
                idx.setdefault((t.backend, t.experiment, t.arm), []).append(t)
            self._index = idx
        return list(self._index.get((backend, experiment, arm), []))

    def config(self, backend: str, experiment: str) -> ExperimentConfig | None:
        """The config of a group (from its first trial that has one)."""
        key = (backend, experiment)
        if key not in self._configs:
            self._configs[key] = next((t.config for t in self.select(backend, experiment) if t.config is not None),
                                      None)
        return self._configs[key]

    def baseline_arm(self, backend: str, experiment: str) -> str:
        """The group's reference arm (``cfg.baseline_arm``; ``"baseline"`` when no config is known)."""
        cfg = self.config(backend, experiment)
        return cfg.baseline_arm if cfg is not None else "baseline"

    def arms(self, backend: str, experiment: str) -> list[str]:
        """Arms present in a group in ``arm_order``: baseline, other arms by name, fixed caps by cap."""
        base = self.baseline_arm(backend, experiment)
        return sorted({t.arm for t in self.select(backend, experiment)}, key=lambda a: arm_order(a, base))

    def problems_for(self, backend: str, experiment: str) -> list[tuple[str, str]]:
        """Load problems whose path lies in this group's directory."""
        prefix = str(self.root / backend / experiment) + os.sep
        return [p for p in self.problems if p[0].startswith(prefix)]

    def problem_report(self) -> str:
        """One line per trial directory that could not be loaded ("" when none)."""
        return "\n".join(f"corrupt or partial trial {p}: {m}" for p, m in self.problems)

    def digest(self, lt: LoadedTrial) -> dict | None:
        """What ``load_traces`` computed for ``lt`` (keys summary, itl, tokens, guarded); ``None`` if it did not."""
        return self._digests.get(str(lt.path))

    def cached(self, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` the first time ``name`` is asked for, the same object afterwards."""
        if name not in self._cache:
            self._cache[name] = compute()
        return self._cache[name]

    def summary(self) -> pd.DataFrame:
        """``dlfp.analysis.tables.summaries.trial_summaries`` of this set (computed once)."""
        from dlfp.analysis.tables.summaries import trial_summaries  # summaries builds on this module

        return self.cached("summary", lambda: trial_summaries(self))


def _config_of(trial: Trial) -> ExperimentConfig | None:
    md = trial.metadata.get("config")
    if isinstance(md, dict):
        try:
            return ExperimentConfig.model_validate(md)
        except Exception:  # recorded config of an older schema: fall back to the shipped one
            pass
    try:
        return load_experiment(str(trial.metadata.get("experiment")))
    except ConfigError:
        return None


def _lookup(path: Path) -> tuple[str | None, bytes | None, dict[str, Any] | None]:
    """``(key, metadata.json bytes, cached digest or None)`` of a trial (``digest_cache``); no key when a file
    cannot be read."""
    try:
        key, md_bytes = digest_cache.trial_key(path)
    except OSError:
        return None, None, None
    return key, md_bytes, digest_cache.read(key)


def _from_cache(path: Path, md_bytes: bytes, cached: dict[str, Any]) -> dict[str, Any]:
    """A ``_digest`` result from a cached digest and the metadata bytes its key hashed."""
    backend, experiment, arm, _ = path.parts[-4:]
    md = digest_cache.metadata_of(md_bytes)
    trial = digest_cache.LazyTrial(path, md)
    lt = LoadedTrial(backend, experiment, arm, int(md["seed"]), path, trial, _config_of(trial))
    return dict(path=path, loaded=lt, **cached)


def _digest(path: Path) -> dict[str, Any]:
    """What every table needs of one trial, from the digest cache (``digest_cache``) or computed and cached.

    Returns ``{path, error}`` for a trial that cannot be used, else ``{path, loaded, summary, itl, tokens,
    guarded}``; ``loaded.trial`` is a ``digest_cache.LazyTrial`` (frames read on first use).
    """
    key, md_bytes, cached = _lookup(path)
    if cached is not None:
        return _from_cache(path, md_bytes, cached)
    d = _compute_digest(path)
    if key is not None and "error" not in d and d["loaded"].trial.metadata == digest_cache.metadata_of(md_bytes):
        digest_cache.write(key, d)  # only what was computed from the files the key hashed
    return d


def _compute_digest(path: Path) -> dict[str, Any]:
    """Load one trial and compute what every table needs once: summary (``metrics.summarize``) and ITL samples.

    Returns ``{path, error}`` for a trial that cannot be used, else ``{path,
    loaded, summary, itl, tokens, guarded}``.
    """
    backend, experiment, arm, seed_dir = path.parts[-4:]
    try:
        full = load_trial(path)
    except TraceError as e:
        return dict(path=path, error=str(e))
    md = full.metadata
    where = (md.get("backend"), md.get("experiment"), md.get("arm"), f"seed-{md.get('seed')}")
    if where != (backend, experiment, arm, seed_dir):
        return dict(path=path, error=f"metadata names {'/'.join(map(str, where))}, not its directory")
    trial = digest_cache.LazyTrial(path, md, frames=full)
    lt = LoadedTrial(backend, experiment, arm, int(md["seed"]), path, trial, _config_of(trial))
    try:
        summary = metrics.summarize(full, lt.slo)
    except ValueError as e:
        return dict(path=path, error=f"cannot summarise: {e}")
    return dict(path=path, loaded=lt, summary=summary, itl=metrics.itl_samples(full),
                tokens=measured_token_ids(full), guarded=guarded_iterations(full))


def _trial_paths(root: Path, backends: Sequence[str] | None, experiments: Sequence[str] | None) -> list[Path]:
    """Trial directories under ``root``, restricted to ``backends`` and ``experiments`` when given.

    Trials run with config overrides live under a derived experiment id ``<experiment>+<hash>``; they are left
    out unless ``experiments`` names them, so a render of the shipped matrix never sees them."""
    paths = []
    for path in find_trials(root):
        backend, experiment = path.parts[-4:-2]
        if backends and backend not in backends or experiments and experiment not in experiments:
            continue
        if not experiments and "+" in experiment:
            continue
        paths.append(path)
    return paths


def _digest_all(paths: list[Path], workers: int | None) -> list[dict[str, Any]]:
    """``_digest`` of every path: cached ones here, the rest in ``workers`` spawned processes when more than one
    (default: up to 4 when ``PARALLEL_MIN_TRIALS`` or more trials are not cached)."""
    out: dict[Path, dict[str, Any]] = {}
    todo = []
    for p in paths:
        key, md_bytes, cached = _lookup(p)
        if cached is not None:
            out[p] = _from_cache(p, md_bytes, cached)
        else:
            todo.append(p)
    if workers is None:
        workers = min(4, os.cpu_count() or 1) if len(todo) >= PARALLEL_MIN_TRIALS else 1
    if workers <= 1 or len(todo) <= 1:
        out.update((p, _digest(p)) for p in todo)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        # "spawn": a forked child could inherit locked pyarrow/zmq threads from a notebook kernel.
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
            out.update(zip(todo, pool.map(_digest, todo, chunksize=max(1, len(todo) // (4 * workers)))))
    return [out[p] for p in paths]


def load_traces(root: str | Path, backends: Sequence[str] | None = None,
                experiments: Sequence[str] | None = None, workers: int | None = None, *,
                allow_partial: bool = False) -> TraceSet:
    """Load and check every trial under ``root`` (``<root>/<backend>/<experiment>/<arm>/seed-<seed>``).

    Every trial must load (``dlfp.traces.format.TraceError``: partial,
    corrupt, invalid; or metadata that disagrees with its place in the tree),
    the set must be complete and every compared pair must share workload and
    engine settings (``dlfp.analysis.tables.checks``). By default any problem
    raises ``PartialTraceSet`` (one line naming the trial) before a table can
    be written. With ``allow_partial=True`` the problems are kept in
    ``TraceSet.problems``, the groups they lie in in ``TraceSet.incomplete``
    (their table rows are marked "incomplete") and ``TraceSet.partial`` is set
    (no claim agrees). Each trial's ``metrics.summarize`` and ITL samples are
    computed here once, or read from the digest cache (``digest_cache``: keyed by
    the trial's bytes and the code, so only a trial that loaded and validated
    as it is now is served from it); ``workers`` > 1 computes the others in
    parallel processes (default: up to 4 from ``PARALLEL_MIN_TRIALS`` uncached
    trials on).

    Raises:
        FileNotFoundError: ``root`` is not a directory.
        PartialTraceSet: a problem, unless ``allow_partial``.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"traces directory {root} does not exist")
    paths = _trial_paths(root, backends, experiments)
    ts = TraceSet(root=root)
    for d in _digest_all(paths, workers):
        if "error" in d:
            ts.problems.append((str(d["path"]), d["error"]))
            continue
        ts.trials.append(d["loaded"])
        ts._digests[str(d["path"])] = d
    ts.trials.sort(key=lambda t: (t.backend, t.experiment, t.arm, t.seed))
    problems = checks.trace_set_problems(ts)
    if not allow_partial:
        checks.raise_if_partial(ts, problems)
    ts.partial = bool(allow_partial)
    ts.problems = problems
    ts.incomplete = checks.incomplete_groups(problems, root)
    return ts


def is_claim_column(name: str) -> bool:
    """A column holding a verdict (agrees, within an interval, same sign, reached), not a count of tokens."""
    n = str(name).lower()
    return not n.startswith("tokens") and any(w in n for w in ("agree", "same_sign", "same sign", "within",
                                                                 "reached"))


def mark_incomplete(df: pd.DataFrame, ts: TraceSet) -> pd.DataFrame:
    """A table of a partial set as written: a ``status`` column, and no verdict anywhere.

    ``status`` is "incomplete" on rows of ``ts.incomplete`` groups (matched on
    ``backend`` and ``experiment``, or ``experiment`` alone), else ""; every
    verdict column (``is_claim_column``) is emptied, since a partial set
    supports no claim. ``df`` unchanged when the set is not partial.
    """
    if not ts.partial:
        return df
    out = df.copy()
    for c in out.columns:
        if is_claim_column(c):
            out[c] = None
    if "experiment" not in out.columns:
        return out
    if "backend" in out.columns:
        keys = zip(out["backend"], out["experiment"])
        status = ["incomplete" if k in ts.incomplete else "" for k in keys]
    else:
        bad = {e for _, e in ts.incomplete}
        status = ["incomplete" if e in bad else "" for e in out["experiment"]]
    return out.assign(status=status)

def itl_samples(ts: TraceSet, lt: LoadedTrial) -> np.ndarray:
    """``dlfp.analysis.metrics.itl_samples`` of a loaded trial (seconds), computed once at load time."""
    d = ts.digest(lt)
    return d["itl"] if d is not None else metrics.itl_samples(lt.trial)


def guarded_of(ts: TraceSet, lt: LoadedTrial) -> pd.DataFrame:
    """``guarded_iterations`` of a loaded trial, computed once at load time."""
    d = ts.digest(lt)
    return d["guarded"] if d is not None else guarded_iterations(lt.trial)


__all__ = ["FIXED_CAP_PREFIX", "PARALLEL_MIN_TRIALS", "LoadedTrial", "TraceSet", "arm_order", "guarded_of",
           "is_claim_column", "itl_samples", "load_traces",
           "mark_incomplete"]
