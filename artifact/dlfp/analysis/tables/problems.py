"""The trial directories that failed to load, as a table (the tables and figures leave them out)."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from dlfp.analysis.markdown import write_table
from dlfp.analysis.tables.loading import TraceSet


def problems_frame(ts: TraceSet) -> pd.DataFrame:
    """Trial directories that failed to load: ``trial`` (relative to the traces root) and ``problem``."""
    rows = []
    for path, msg in ts.problems:
        rel = os.path.relpath(path, ts.root)
        rows.append(dict(trial=rel, problem=msg.replace(str(ts.root) + os.sep, "")))
    return pd.DataFrame(rows, columns=["trial", "problem"]).sort_values("trial", kind="stable").reset_index(drop=True)


def write_problems(ts: TraceSet, results_dir: str | Path) -> tuple[Path, Path]:
    """Write ``problems.csv``/``.md``: every corrupt or partial trial that the tables and figures leave out."""
    df = problems_frame(ts)
    notes = [] if len(df) else ["No corrupt or partial trials."]
    return write_table(df, results_dir, "problems", title="Trials not used (corrupt or partial)", notes=notes)


__all__ = ["problems_frame", "write_problems"]
