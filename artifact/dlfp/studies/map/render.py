"""Executing ``notebooks/map.ipynb`` with papermill: the map's view over its cached tables."""
from __future__ import annotations

from pathlib import Path

from dlfp.pipeline.notebooks import execute_notebook
from dlfp.pipeline.paths import notebook_path, notebooks_dir


def render_maps(out: str | Path, names: list[str], quick: bool = False) -> Path:
    """Run the map notebook over the tables in ``out`` for the maps ``names``; returns the executed copy
    ``<out>/map.ipynb`` (outputs written beside it by ``dlfp.studies.map.report.write_outputs``).

    Raises:
        dlfp.pipeline.PipelineError: the notebook failed (e.g. a map table is incomplete or mixed; the error
            names it and the failed copy is kept).
    """
    out = Path(out)
    params = {"map_dir": notebook_path(out), "maps": list(names), "quick": bool(quick)}
    return execute_notebook(notebooks_dir() / "map.ipynb", out / "map.ipynb", params, progress_env=False)


__all__ = ["render_maps"]
