"""Executing the notebooks with papermill: one experiment's ``experiment.ipynb``, and ``figures.ipynb``.

Only ``figures.ipynb`` (through ``dlfp.analysis.tables`` and ``dlfp.analysis.figures``) turns saved traces
into tables and figures; ``render_figures`` runs it from cached traces only, never an engine.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from dlfp.pipeline.errors import PipelineError
from dlfp.pipeline.paths import (check_output_dir, default_published_csv, default_results_dir, default_traces_dir,
                                 notebooks_dir)
from dlfp.pipeline.progress import PROGRESS_ENV


def execute_notebook(notebook: Path, output: Path, parameters: dict[str, Any], *, cwd: Path | None = None,
                     progress_env: bool = True) -> Path:
    """Execute ``notebook`` with papermill into ``output`` (written atomically); returns ``output``.

    ``progress_env`` sets ``$DLFP_PROGRESS_STDERR=1`` for the kernel, so progress bars go to the terminal
    (``dlfp.pipeline.progress``). A failed execution is kept as ``<output stem>.failed.ipynb``; a
    successful one removes an earlier failed copy.

    Raises:
        PipelineError: the notebook does not exist, or a cell failed (names the error and the failed copy).
    """
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
    """Execute ``notebooks/experiment.ipynb`` for one experiment; returns the executed copy's path.

    The copy goes to ``<traces>/<backend>/<experiment>/experiment.ipynb``; the notebook runs
    ``run_experiment`` with these arguments.

    Raises:
        PipelineError: see ``execute_notebook``.
    """
    out = Path(traces_dir) / backend / experiment / "experiment.ipynb"
    params = dict(experiment=experiment, backend=backend, seeds=list(seeds) if seeds else None,
                  out_dir=str(Path(traces_dir).resolve()), overrides=dict(overrides or {}), force=bool(force),
                  quick=bool(quick), frontier=frontier)
    return execute_notebook(notebooks_dir() / "experiment.ipynb", out, params)


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
    return execute_notebook(notebooks_dir() / "figures.ipynb", results / "figures.ipynb", params, progress_env=False)


__all__ = ["execute_experiment_notebook", "execute_notebook", "render_figures"]
