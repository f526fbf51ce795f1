"""The figures of ``figures.ipynb``, drawn by worker processes while the notebook computes its tables.

``start(ts, results_dir)`` submits every figure of a loaded trace set (``dlfp.analysis.tables.TraceSet``) to
spawned worker processes; each worker loads the same trace set once (from the per-trial digest cache the notebook
just filled, ``dlfp.analysis.tables.digest_cache``), then draws and writes its figures with
``dlfp.analysis.figures.save`` (the same bytes as drawn in the notebook's own process). ``Drawing.result(name)``
waits for one figure and returns its ``(png, pdf)`` paths. A small set (fewer than
``dlfp.analysis.tables.PARALLEL_MIN_TRIALS`` trials) or ``workers=1`` draws each figure in this process when it
is asked for. Workers end with their parent (``dlfp.pipeline.pool``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from dlfp.pipeline.errors import PipelineError

#: Figures drawn from the whole set, longest first (submitted in this order, before the per-experiment ones).
SET_FIGURES = ("itl_cdf", "tradeoff", "root_cause", "frontier")
CAP_PREFIX = "cap_trajectory_"
#: At most this many worker processes.
MAX_WORKERS = 4

_SETS: dict[tuple[str, bool], Any] = {}  # in a worker: the trace set it loaded, by (root, partial)


#: DLFP-G's cap trajectory, its decisions coloured by reason, for each request-list group with a ``dlfpg`` arm.
DLFPG_CAP_PREFIX = CAP_PREFIX + "dlfpg_"


def _dlfpg_groups(ts) -> list[tuple[str, str]]:
    out = []
    for b, e in ts.groups():
        cfg = ts.config(b, e)
        if cfg is not None and cfg.workload.kind == "requests" and "dlfpg" in set(ts.arms(b, e)):
            out.append((b, e))
    return out


def figure_names(ts) -> list[str]:
    """Every figure ``figures.ipynb`` writes for ``ts``: the whole-set ones, one cap trajectory per group, then
    DLFP-G's cap trajectory per request-list group that has it."""
    return (list(SET_FIGURES) + [f"{CAP_PREFIX}{b}_{e}" for b, e in ts.groups()]
            + [f"{DLFPG_CAP_PREFIX}{b}_{e}" for b, e in _dlfpg_groups(ts)])


def draw(ts, name: str, results_dir: str | Path, formats: Sequence[str]) -> tuple[Path | None, Path | None]:
    """Draw figure ``name`` of ``ts`` and write it (``dlfp.analysis.figures.save``); returns ``(png, pdf)``.

    Raises:
        PipelineError: ``name`` is not one of ``figure_names(ts)``.
    """
    from dlfp.analysis import figures

    builders = {"itl_cdf": figures.itl_cdf_figure, "tradeoff": figures.tradeoff_figure,
                "root_cause": figures.root_cause_figure, "frontier": figures.frontier_figure}
    if name in builders:
        fig = builders[name](ts)
    elif name.startswith(DLFPG_CAP_PREFIX):
        group = next((g for g in _dlfpg_groups(ts) if name == f"{DLFPG_CAP_PREFIX}{g[0]}_{g[1]}"), None)
        if group is None:
            raise PipelineError(f"no figure {name!r} for this trace set; figures: {', '.join(figure_names(ts))}")
        fig = figures.cap_trajectory_figure(ts, *group, arm="dlfpg")
    else:
        group = next((g for g in ts.groups() if name == f"{CAP_PREFIX}{g[0]}_{g[1]}"), None)
        if group is None:
            raise PipelineError(f"no figure {name!r} for this trace set; figures: {', '.join(figure_names(ts))}")
        fig = figures.cap_trajectory_figure(ts, *group)
    return figures.save(fig, results_dir, name, formats=formats)


def _init(parent: int) -> None:
    """Worker start: end with the parent (``dlfp.pipeline.pool``), draw without a display."""
    import matplotlib

    from dlfp.pipeline.pool import _init_worker

    _init_worker(parent, None)
    matplotlib.use("Agg")


def _draw_in_worker(root: str, partial: bool, name: str, results_dir: str,
                    formats: tuple[str, ...]) -> tuple[str | None, str | None]:
    """In a worker: load the trace set once (``load_traces``, strict unless ``partial``), draw ``name``."""
    from dlfp.analysis.tables import load_traces

    key = (root, partial)
    if key not in _SETS:
        _SETS[key] = load_traces(root, allow_partial=partial, workers=1)
    png, pdf = draw(_SETS[key], name, results_dir, formats)
    return (str(png) if png else None, str(pdf) if pdf else None)


class Drawing:
    """The figures of one render, being drawn; ``result(name)`` waits for one, ``close()`` ends the workers."""

    def __init__(self, ts, results_dir: str | Path, formats: Sequence[str], workers: int) -> None:
        self.ts, self.results_dir, self.formats = ts, Path(results_dir), tuple(formats)
        self._done: dict[str, tuple[Path | None, Path | None]] = {}
        self._futures: dict[str, Any] = {}
        self._pool = None
        names = figure_names(ts)
        if workers > 1 and len(names) > 1:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(max_workers=min(workers, len(names)), mp_context=mp.get_context("spawn"),
                                             initializer=_init, initargs=(os.getpid(),))
            args = (str(ts.root), bool(ts.partial))
            self._futures = {n: self._pool.submit(_draw_in_worker, *args, n, str(self.results_dir), self.formats)
                             for n in names}

    @property
    def parallel(self) -> bool:
        """True when the figures are drawn by worker processes."""
        return bool(self._futures)

    def result(self, name: str) -> tuple[Path | None, Path | None]:
        """``(png, pdf)`` of figure ``name`` once written (``None`` for a format not asked for).

        Raises:
            PipelineError: no such figure, or a worker process died or was stopped.
            Exception: what drawing the figure raised (the workers are then stopped).
        """
        if name in self._done:
            return self._done[name]
        if not self.parallel:
            self._done[name] = draw(self.ts, name, self.results_dir, self.formats)
            return self._done[name]
        from concurrent.futures import CancelledError
        from concurrent.futures.process import BrokenProcessPool

        if name not in self._futures:
            raise PipelineError(f"no figure {name!r} for this trace set; figures: {', '.join(self._futures)}")
        try:
            png, pdf = self._futures[name].result()
        except (BrokenProcessPool, CancelledError):
            self._stop()
            raise PipelineError(f"the worker process drawing figure {name} died or was stopped") from None
        except BaseException:
            self._stop()
            raise
        self._done[name] = (Path(png) if png else None, Path(pdf) if pdf else None)
        return self._done[name]

    def close(self) -> None:
        """Wait for every figure still being drawn (raising what drawing one raised), then end the workers."""
        try:
            for name in self._futures:
                self.result(name)
        finally:
            self._stop()

    def _stop(self) -> None:
        if self._pool is not None:
            from dlfp.pipeline.pool import stop_pool

            stop_pool(self._pool)
            self._pool = None


def start(ts, results_dir: str | Path, formats: Sequence[str] = ("png", "pdf"), workers: int | None = None) -> Drawing:
    """Start drawing every figure of ``ts`` into ``results_dir``; returns the ``Drawing``.

    ``workers``: processes (default: up to ``MAX_WORKERS``, one per core, from ``PARALLEL_MIN_TRIALS`` trials on
    when the digest cache is on; else 1, each figure drawn here when asked for).
    """
    from dlfp.analysis.tables import PARALLEL_MIN_TRIALS, digest_cache

    if workers is None:  # without the digest cache every worker would load and summarise every trial again
        big = len(ts.trials) >= PARALLEL_MIN_TRIALS and digest_cache.cache_dir() is not None
        workers = min(MAX_WORKERS, os.cpu_count() or 1) if big else 1
    return Drawing(ts, results_dir, formats, workers)


__all__ = ["CAP_PREFIX", "Drawing", "MAX_WORKERS", "SET_FIGURES", "draw", "figure_names", "start"]
