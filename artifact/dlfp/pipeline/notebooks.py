"""Executing the notebooks with papermill: one experiment's ``experiment.ipynb``, and ``figures.ipynb``.

Only ``figures.ipynb`` (through ``dlfp.analysis.tables`` and ``dlfp.analysis.figures``) turns saved traces
into tables and figures; ``render_figures`` runs it from cached traces only, never an engine.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from dlfp.pipeline import stamps
from dlfp.pipeline.errors import PipelineError
from dlfp.pipeline.interrupts import stop_at_once
from dlfp.pipeline.paths import (check_output_dir, check_writable, default_published_csv, default_results_dir,
                                 default_traces_dir, display_path, notebook_path, notebooks_dir, repo_root)
from dlfp.pipeline.progress import PROGRESS_ENV


#: Arguments of the notebook kernel: only its critical log lines reach the terminal (not ipykernel's warning that
#: a local kernel talks over TCP, nor its log line for the interrupt that stops a kernel at shutdown); a cell's
#: error still fails the execution and is reported by papermill.
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=CRITICAL"]


def execute_notebook(notebook: Path, output: Path, parameters: dict[str, Any], *, cwd: Path | None = None,
                     progress_env: bool = True, temporaries: Sequence[Path] = (),
                     failed_dir: Path | None = None) -> Path:
    """Execute ``notebook`` with papermill into ``output`` (written atomically); returns ``output``.

    The kernel runs in ``cwd`` (default: the repository root, so relative paths in ``parameters`` work). The
    executed copy is made reproducible (``clean_executed``: no timestamps or durations, paths relative to the
    repository root). ``progress_env`` sets ``$DLFP_PROGRESS_STDERR=1`` for the kernel, so progress bars go to
    the terminal (``dlfp.pipeline.progress``). A failed execution is kept as ``<output stem>.failed.ipynb``; a
    successful one removes an earlier failed copy (``failed_dir``: keep it there instead). Interrupted
    (Ctrl-C, SIGTERM) at any moment between papermill creating the temporary copy
    (``.<output stem>.tmp.ipynb``) and its rename into place, the temporary copy and trial temporaries under
    ``temporaries`` are removed (``dlfp.pipeline.interrupts``).

    Raises:
        PipelineError: the notebook does not exist, or a cell failed (names the error and the failed copy).
    """
    import papermill as pm

    if not notebook.exists():
        raise PipelineError(f"notebook {notebook} does not exist")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.stem}.tmp.ipynb")
    started = time.time()

    known = kernel_connection_files()

    def cleanup() -> None:
        tmp.unlink(missing_ok=True)
        remove_trial_temporaries(temporaries, started)
        for path in kernel_connection_files() - known:  # the kernel was stopped before it could remove its own
            path.unlink(missing_ok=True)

    old = os.environ.get(PROGRESS_ENV)
    if progress_env:
        os.environ[PROGRESS_ENV] = "1"
    # The temporary copy lives only inside ``stop_at_once`` and the ``except`` below: from papermill creating it
    # to its rename into ``output`` (or the failed copy), a signal removes it.
    try:
        with stop_at_once(cleanup):
            try:
                pm.execute_notebook(str(notebook), str(tmp), parameters=parameters, cwd=str(cwd or repo_root()),
                                    progress_bar=False, kernel_name="python3", log_output=False,
                                    extra_arguments=KERNEL_ARGUMENTS)
            except pm.PapermillExecutionError as e:
                # Keep the failed copy for inspection next to where the output would be.
                failed = (failed_dir or output.parent) / (output.stem + ".failed.ipynb")
                failed.parent.mkdir(parents=True, exist_ok=True)
                if tmp.exists():
                    clean_executed(tmp, notebook, failed)
                    os.replace(tmp, failed)
                last = (e.evalue or "").strip().splitlines()
                raise PipelineError(f"{notebook.name} failed ({e.ename}: {last[-1] if last else ''}); "
                                    f"executed copy: {display_path(failed)}") from None
            clean_executed(tmp, notebook, output)
            os.replace(tmp, output)
    except PipelineError:
        tmp.unlink(missing_ok=True)
        raise
    except BaseException:
        cleanup()
        raise
    finally:
        if progress_env:
            if old is None:
                os.environ.pop(PROGRESS_ENV, None)
            else:
                os.environ[PROGRESS_ENV] = old
    stale = output.with_name(output.stem + ".failed.ipynb")
    if stale.exists():
        stale.unlink()
    return output


#: Papermill's per-notebook and per-cell metadata that records when and how long, not what.
_TIMING_KEYS = ("start_time", "end_time", "duration")


def clean_executed(path: Path, source: Path, output: Path) -> None:
    """Rewrite the executed notebook ``path`` so that a rerun over unchanged inputs is byte-identical.

    Drops papermill's start/end times and durations (notebook and cells) and the kernel's per-cell execution
    timestamps, gives the injected-parameters cell a fixed id; joins consecutive stream outputs of one name (how
    the kernel split a cell's printing into messages depends on timing, not on what was printed); records
    ``input_path``/``output_path`` as ``source``/``output`` relative to the repository root.
    """
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    meta = nb.metadata.get("papermill")
    if meta is not None:
        for k in _TIMING_KEYS:
            meta.pop(k, None)
        meta["input_path"], meta["output_path"] = display_path(source), display_path(output)
    for cell in nb.cells:
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.id = "injected-parameters"  # papermill gives it a random id
        cell.metadata.pop("execution", None)
        for k in _TIMING_KEYS:
            cell.metadata.get("papermill", {}).pop(k, None)
        if cell.get("outputs"):
            cell.outputs = coalesce_streams(cell.outputs)
    nbformat.write(nb, str(path))


def coalesce_streams(outputs: list) -> list:
    """``outputs`` with each run of consecutive ``stream`` outputs of the same name (stdout, stderr) joined into
    one (their texts concatenated, in order); other outputs unchanged."""
    out: list = []
    for o in outputs:
        if (o.get("output_type") == "stream" and out and out[-1].get("output_type") == "stream"
                and out[-1].get("name") == o.get("name")):
            out[-1]["text"] = "".join(out[-1]["text"]) + "".join(o["text"])
        else:
            out.append(o)
    return out


#: Keys of a Jupyter kernel connection file (``jupyter_client.connect.write_connection_file``).
_CONNECTION_KEYS = {"shell_port", "iopub_port", "control_port", "key", "transport"}


def kernel_connection_files(directory: Path | None = None) -> set[Path]:
    """Jupyter kernel connection files (``tmp*.json`` holding a kernel's ports and key) in ``directory`` (default
    the temporary folder, where jupyter_client writes them for papermill's kernels). A stopped kernel's file is
    left there when its process is interrupted; ``execute_notebook`` removes the ones its run created."""
    import json

    out = set()
    for path in Path(directory or tempfile.gettempdir()).glob("tmp*.json"):
        try:
            if path.stat().st_size < 4096 and _CONNECTION_KEYS <= set(json.loads(path.read_text())):
                out.add(path)
        except (OSError, ValueError, TypeError):
            continue
    return out


def remove_trial_temporaries(dirs: Sequence[Path], since: float) -> None:
    """Remove trial temporaries (``<arm>/.seed-<n>.tmp-*``) under ``dirs`` written since ``since`` (a
    ``time.time()``); a trial moved aside (``.seed-<n>.old-*``) whose replacement never arrived is put back."""
    for d in dirs:
        for p in Path(d).glob("*/.seed-*.tmp-*"):
            try:
                if p.stat().st_mtime >= since:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass
        for p in Path(d).glob("*/.seed-*.old-*"):
            dest = p.with_name(p.name[1:].split(".old-", 1)[0])
            try:
                os.replace(p, dest) if not dest.exists() else shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass


class Rendered(NamedTuple):
    """What a render did: the executed notebook's path, whether it was ``fresh`` (its stamp matched, so nothing
    ran) and, when it ran, why (``reason``: no stamp, a changed input, the code, ``--force``)."""

    path: Path
    fresh: bool
    reason: str = ""


#: The files ``experiment.ipynb`` writes beside an experiment's traces.
EXPERIMENT_OUTPUTS = ("experiment.ipynb", "headline.csv", "headline.md", "headline_per_seed.csv",
                      "headline_per_seed.md")


def execute_experiment_notebook(experiment: str, **kwargs: Any) -> Path:
    """``execute_experiment_notebook_checked(...).path``: the executed copy (fresh or just executed)."""
    return execute_experiment_notebook_checked(experiment, **kwargs).path


def execute_experiment_notebook_checked(experiment: str, *, backend: str, traces_dir: Path,
                                        seeds: Sequence[int] | None = None, overrides: dict[str, Any] | None = None,
                                        force: bool = False, quick: bool = False, frontier: bool | None = None,
                                        experiment_id: str | None = None, explicit_dir: bool = True,
                                        rerender: bool = False,
                                        announce: Callable[[Rendered], None] | None = None) -> Rendered:
    """Execute ``notebooks/experiment.ipynb`` for one experiment, unless its output is fresh.

    The copy goes to ``<traces>/<backend>/<experiment_id>/experiment.ipynb`` (``experiment_id``: the derived id
    of a run with overrides, default ``experiment``); the notebook runs ``run_experiment`` with these arguments,
    its ``out_dir`` being ``traces_dir`` when ``explicit_dir``, else ``None`` (the default root). Fresh
    (``dlfp.pipeline.stamps``: the same notebook source, parameters, code and trials of this experiment as when
    its stamp was written, and its outputs unchanged), nothing runs; ``force`` (rerun trials) or ``rerender``
    always execute it. The stamp is written after a successful execution. ``announce`` is called with the
    outcome once it is known: before the execution starts, or when the output is fresh.

    Raises:
        PipelineError: see ``execute_notebook``.
    """
    exp_id = experiment_id or experiment
    exp_dir = Path(traces_dir) / backend / exp_id
    params = dict(experiment=experiment, backend=backend, seeds=list(seeds) if seeds else None,
                  out_dir=notebook_path(traces_dir) if explicit_dir else None, overrides=dict(overrides or {}),
                  force=bool(force), quick=bool(quick), frontier=frontier)
    source = notebooks_dir() / "experiment.ipynb"
    output = exp_dir / "experiment.ipynb"

    def inputs() -> dict[str, str]:
        return {"notebooks/experiment.ipynb": stamps.file_digest(source),
                **stamps.traces_digests(traces_dir, [(backend, exp_id)])}

    reason = ("trials forced to rerun (--force)" if force else "forced (--force)" if rerender
              else stamps.stale_reason(output, inputs(), params))
    out = Rendered(output, reason is None, reason or "")
    if announce is not None:
        announce(out)
    if out.fresh:
        return out
    execute_notebook(source, output, params, temporaries=[exp_dir])
    stamps.write_stamp(output, inputs(), params, EXPERIMENT_OUTPUTS)  # the trials as the notebook left them
    return out


def render_figures(traces_dir: str | Path | None = None, results_dir: str | Path | None = None,
                   published_csv: str | Path | None = None, quick: bool = False,
                   formats: Sequence[str] = ("png", "pdf"), allow_partial: bool = False, force: bool = False) -> Path:
    """``render_figures_checked(...).path``: the executed ``figures.ipynb`` (fresh or just rendered)."""
    return render_figures_checked(traces_dir, results_dir, published_csv, quick=quick, formats=formats,
                                  allow_partial=allow_partial, force=force).path


def _figures_inputs(traces: Path, results: Path, published: Path) -> dict[str, str]:
    """What ``figures.ipynb`` reads, as digests: its source, the traces, the published numbers, the outputs of
    ``dlfp validate-sim``, ``dlfp calibrate``, ``dlfp map`` and ``dlfp dlfpg-dev`` (``<results>/fidelity``,
    ``<results>/calibration``, ``<results>/map``, ``<results>/dlfpg``)."""
    return {"notebooks/figures.ipynb": stamps.file_digest(notebooks_dir() / "figures.ipynb"),
            "published_csv": stamps.file_digest(published), "fidelity": stamps.folder_digest(results / "fidelity"),
            "calibration": stamps.folder_digest(results / "calibration"),
            "map": stamps.folder_digest(results / "map"), "dlfpg": stamps.folder_digest(results / "dlfpg"),
            **stamps.traces_digests(traces)}


def render_figures_checked(traces_dir: str | Path | None = None, results_dir: str | Path | None = None,
                           published_csv: str | Path | None = None, quick: bool = False,
                           formats: Sequence[str] = ("png", "pdf"), allow_partial: bool = False,
                           force: bool = False) -> Rendered:
    """Execute ``notebooks/figures.ipynb`` from cached traces only, unless its outputs are fresh.

    The executed copy goes to ``<results_dir>/figures.ipynb``; tables and
    figures to ``results_dir``. Never runs an engine. A corrupt, partial or
    mispaired trace set stops the render before anything is written into
    ``results_dir`` (a failed notebook copy goes to the system's temporary
    folder); ``allow_partial`` renders what loads into ``<results_dir>-partial``
    instead, rows of affected experiments marked incomplete and no claim judged.
    Fresh (``dlfp.pipeline.stamps``: the traces, notebook source, published
    numbers, fidelity and calibration outputs, parameters and code are those of
    the stamp's render, and every output is unchanged) nothing runs, unless
    ``force``. The stamp is written after a successful render whose inputs did
    not change while it ran.

    Raises:
        PipelineError: the traces directory does not exist, or the notebook fails.
    """
    traces = Path(traces_dir) if traces_dir is not None else default_traces_dir(quick)
    results = Path(results_dir) if results_dir is not None else default_results_dir(quick)
    if allow_partial:
        from dlfp.analysis.tables import partial_results_dir

        results = partial_results_dir(results)
    results = check_writable(check_output_dir(results, "results directory (--out)"), "results directory", "--out DIR")
    if traces.exists() and not traces.is_dir():
        raise PipelineError(f"traces directory {traces} is not a directory")
    if not traces.is_dir():
        raise PipelineError(f"traces directory {traces} does not exist (run `dlfp run-all` first)")
    published = Path(published_csv) if published_csv is not None else default_published_csv()
    params = dict(traces_dir=notebook_path(traces), results_dir=notebook_path(results),
                  published_csv=notebook_path(published), formats=list(formats), allow_partial=allow_partial)
    output = results / "figures.ipynb"
    before = _figures_inputs(traces, results, published)
    reason = "forced (--force)" if force else stamps.stale_reason(output, before, params)
    if reason is None:
        return Rendered(output, True)
    execute_notebook(notebooks_dir() / "figures.ipynb", output, params, progress_env=False,
                     failed_dir=Path(tempfile.gettempdir()) / "dlfp-failed-notebooks")
    if _figures_inputs(traces, results, published) == before:  # else: the render read changing inputs
        stamps.write_stamp(output, before, params)
    return Rendered(output, False, reason)


# --------------------------------------------------------------------------- inside a notebook's kernel


class NotebookParameterError(Exception):
    """A parameter papermill injected that the notebook does not declare (a misspelt ``-p`` name)."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of the traceback
        return [f"dlfp: error: {self}"]


#: Types of the values papermill injects (``-p``, ``-y``, ``parameters=``).
_PLAIN_TYPES = (type(None), bool, int, float, str, list, dict, tuple)
#: Plain-valued names IPython itself puts in a kernel's globals.
_KERNEL_NAMES = frozenset({"In", "Out"})


def unknown_parameters(namespace: dict[str, Any], declared: Iterable[str]) -> list[str]:
    """Plain-valued public names in ``namespace`` (a kernel's globals) that are not in ``declared``."""
    known = set(declared) | _KERNEL_NAMES
    return sorted(k for k, v in namespace.items()
                  if not k.startswith("_") and k not in known and isinstance(v, _PLAIN_TYPES))


def _dlfp_errors() -> tuple[type[BaseException], ...]:
    from dlfp.backends import BackendUnavailable
    from dlfp.config import ConfigError
    from dlfp.traces.format import TraceError
    from dlfp.workload.generator import WorkloadError

    return (ConfigError, PipelineError, BackendUnavailable, TraceError, WorkloadError)


def _one_line(shell, etype, value, tb, tb_offset=None) -> list[str]:
    """IPython custom exception handler: a dlfp input error as one line in the cell's output."""
    text = str(value).splitlines()[0] if str(value) else etype.__name__
    stb = [f"dlfp: error: {text}"]
    shell._showtraceback(etype, value, stb)  # publish it as the cell's error output (ename, evalue, one line)
    return stb


def check_parameters(namespace: dict[str, Any], declared: Iterable[str]) -> None:
    """Called by each notebook right after its ``parameters`` cell (and papermill's injected one).

    Rejects an injected parameter the notebook does not declare, naming it and the declared ones, and makes
    every later dlfp input error (unknown experiment, bad override, missing traces) one line in the output
    instead of a traceback; the cell still fails, so papermill reports a failed run.

    Raises:
        NotebookParameterError: an undeclared parameter.
    """
    declared = list(declared)
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:  # pragma: no cover - ipykernel brings IPython
        shell = None
    if shell is not None:
        shell.set_custom_exc(_dlfp_errors() + (NotebookParameterError,), _one_line)
    bad = unknown_parameters(namespace, declared)
    if bad:
        raise NotebookParameterError(f"unknown notebook parameter(s) {', '.join(bad)}; this notebook takes "
                                     f"{', '.join(declared)}")


__all__ = ["EXPERIMENT_OUTPUTS", "NotebookParameterError", "Rendered", "check_parameters", "clean_executed",
           "execute_experiment_notebook", "execute_experiment_notebook_checked", "execute_notebook",
           "remove_trial_temporaries", "render_figures", "render_figures_checked", "unknown_parameters"]
