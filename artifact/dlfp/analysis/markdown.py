"""Text outputs of the analysis: fixed number formatting, Markdown tables and atomic file writes.

Used by ``dlfp.analysis.tables`` (every CSV/Markdown table of ``data/results``)
and ``dlfp.studies.sensitivity`` (the sweep's outputs). Formatting is fixed per
column name, so the same frame always gives the same bytes:

* a column name containing ``_pct``: 2 decimals; ``_ms``: 3 decimals;
* a name ending in ``_j`` or containing ``_j_`` (joules): 6 significant digits;
* ``fraction``, ``r_*`` (correlations), ``*_rps`` and ``value``: 4 decimals;
* other floats: an integer when integral, else 6 significant digits;
* NaN/None: empty; booleans: ``yes``/``no``.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd


def is_missing(v: Any) -> bool:
    """True for None, ``pd.NA`` and a float NaN (the cells written as empty)."""
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def format_float(col: str, v: float) -> str:
    """``v`` as text with the fixed precision of column ``col`` (see the module docstring); NaN -> ""."""
    if is_missing(v):
        return ""
    v = float(v)
    if "_pct" in col:
        return f"{v:.2f}"
    if "_ms" in col:
        return f"{v:.3f}"
    if col.endswith("_j") or "_j_" in col:
        return f"{v:.6g}"
    if "fraction" in col or col.startswith("r_") or col.endswith("_rps") or col == "value":
        return f"{v:.4f}"
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.6g}"


def format_cell(col: str, v: Any) -> str:
    """One cell of column ``col`` as text: missing -> "", booleans -> yes/no, floats by ``format_float``."""
    if is_missing(v):
        return ""
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        return format_float(col, float(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return str(v)


def format_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Every cell of ``df`` as text (``format_cell``); same index and columns."""
    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        out[col] = [format_cell(col, v) for v in df[col].tolist()]
    return out


def _escape(cell: Any) -> str:
    """A cell safe inside a Markdown table row: ``|`` escaped, newlines as spaces."""
    return str(cell).replace("|", "\\|").replace("\n", " ")


def markdown_rows(header: Sequence[str], rows: Iterable[Sequence[Any]],
                  align: Sequence[str] | None = None) -> list[str]:
    """The lines of a GitHub-flavoured Markdown table (no trailing newline).

    Args:
        header: column titles.
        rows: cells per row, as text (``|`` is escaped, newlines become spaces).
        align: per column ``"left"`` or ``"right"``; given, the rule line is the
            compact ``|---|---:|`` form, else ``| --- | --- |`` (left).
    """
    if align is None:
        rule = "| " + " | ".join("---" for _ in header) + " |"
    else:
        rule = "|" + "|".join("---:" if a == "right" else "---" for a in align) + "|"
    lines = ["| " + " | ".join(_escape(c) for c in header) + " |", rule]
    lines += ["| " + " | ".join(_escape(c) for c in row) + " |" for row in rows]
    return lines


def to_markdown(df: pd.DataFrame) -> str:
    """A Markdown table of ``df`` (cells by ``format_frame``), newline-terminated; ``"(no rows)"`` if empty."""
    if df.empty:
        return "(no rows)\n"
    f = format_frame(df)
    return "\n".join(markdown_rows(list(f.columns), f.itertuples(index=False))) + "\n"


def atomic_write(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` with ``\\n`` line ends, through a temporary file renamed into place.

    The parent directory is created. A reader never sees a partial file: the
    text goes to ``.<name>.tmp-<pid>`` beside it, then ``os.replace``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)


def write_table(df: pd.DataFrame, results_dir: str | Path, name: str, *, markdown: pd.DataFrame | None = None,
                title: str | None = None, notes: Sequence[str] = ()) -> tuple[Path, Path]:
    """Write ``<results_dir>/<name>.csv`` (``df``) and ``<name>.md`` (``markdown`` or ``df``), atomically.

    ``title`` heads the Markdown; ``notes`` are appended to it as a bullet
    list. Returns the two paths. Formatting is fixed (``format_frame``), so
    the same frame gives the same bytes.
    """
    results_dir = Path(results_dir)
    csv_path, md_path = results_dir / f"{name}.csv", results_dir / f"{name}.md"
    atomic_write(csv_path, format_frame(df).to_csv(index=False, lineterminator="\n"))
    md = (f"# {title}\n\n" if title else "") + to_markdown(markdown if markdown is not None else df)
    if notes:
        md += "\n" + "".join(f"- {n}\n" for n in notes)
    atomic_write(md_path, md)
    return csv_path, md_path


def yes_no(v: Any, yes: str, no: str) -> str:
    """``yes`` / ``no`` for a truth value, "" for a missing one (None, NA, NaN)."""
    if is_missing(v):
        return ""
    return yes if bool(v) else no


__all__ = ["atomic_write", "format_cell", "format_float", "format_frame", "is_missing", "markdown_rows",
           "to_markdown", "write_table", "yes_no"]
