"""The map's on-disk table: part files while it runs, one CSV when done; resume and the mixed-cache check.

Layout under the output directory (default ``data/results/map/``)::

    <map>.csv           the raw per-trial table (``TRIAL_COLUMNS``), rows in task order, once complete
    <map>.parts/        part-<n>.csv while the map runs or after an interruption (removed when consolidated)

Every write is atomic (temporary file, then rename). ``load_rows`` reads both, keeps the rows that belong to the
plan (key of a current task and the current simulator code fingerprint) and reports the others.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pandas as pd

from dlfp.studies.map.grid import MapError, MapSpec
from dlfp.studies.map.run import TRIAL_COLUMNS


#: Columns read as text (a key or fingerprint of digits only must not become a number).
STRING_COLUMNS = {"key": str, "map": str, "source": str, "arm": str, "code": str}


def table_path(out: Path, name: str) -> Path:
    return Path(out) / f"{name}.csv"


def parts_dir(out: Path, name: str) -> Path:
    return Path(out) / f"{name}.parts"


def write_csv_atomic(df: pd.DataFrame, path: Path) -> None:
    """Write ``df`` as CSV (floats to 9 significant digits) to ``path`` atomically
    (``dlfp.analysis.markdown.atomic_write``)."""
    from dlfp.analysis.markdown import atomic_write

    atomic_write(path, df.to_csv(index=False, float_format="%.9g", lineterminator="\n"))


def read_table(path: Path) -> pd.DataFrame:
    """One table file, checked for the expected columns.

    Raises:
        MapError: unreadable, or columns other than ``TRIAL_COLUMNS`` (names the file).
    """
    try:
        df = pd.read_csv(path, dtype=STRING_COLUMNS)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        raise MapError(f"map table {path}: cannot be read ({type(e).__name__}: {e})") from None
    if tuple(df.columns) != TRIAL_COLUMNS:
        raise MapError(f"map table {path}: columns {list(df.columns)} are not the map's {list(TRIAL_COLUMNS)}")
    return df


def load_rows(spec: MapSpec, out: Path, fingerprint: str, *, strict: bool = False) -> pd.DataFrame:
    """The finished rows of ``spec`` found under ``out``: the table and any parts, deduplicated by key.

    Rows of another plan or another code fingerprint are left out and counted on stderr (``strict``: raise).
    A corrupt part file is named and ignored (its tasks rerun); a corrupt table raises.

    Raises:
        MapError: a corrupt ``<map>.csv``, or with ``strict`` any row that does not belong.
    """
    frames = []
    tp = table_path(out, spec.name)
    if tp.exists():
        frames.append(read_table(tp))
    pdir = parts_dir(out, spec.name)
    for part in sorted(pdir.glob("part-*.csv")) if pdir.is_dir() else []:
        try:
            frames.append(read_table(part))
        except MapError as e:
            if strict:
                raise
            print(f"dlfp map: {e}; its trials run again", file=sys.stderr)
    if not frames:
        return pd.DataFrame(columns=list(TRIAL_COLUMNS))
    df = pd.concat(frames, ignore_index=True).drop_duplicates("key", keep="last")
    keys = {t.key for t in spec.tasks()}
    foreign = ~df["key"].isin(keys)
    stale = df["code"].astype(str) != fingerprint
    bad = foreign | stale
    if bad.any():
        msg = (f"map {spec.name}: {int(foreign.sum())} rows of another plan and {int((stale & ~foreign).sum())} "
               f"of another simulator version (code fingerprint) are not used")
        if strict:
            raise MapError(msg)
        print(f"dlfp map: {msg}; their trials run again", file=sys.stderr)
    return df[~bad].reset_index(drop=True)


def write_part(rows: list[dict], out: Path, name: str) -> Path:
    """Write finished rows as the next part file (atomic); returns its path."""
    pdir = parts_dir(out, name)
    pdir.mkdir(parents=True, exist_ok=True)
    n = len(list(pdir.glob("part-*.csv")))
    path = pdir / f"part-{n:05d}.csv"
    while path.exists():
        n += 1
        path = pdir / f"part-{n:05d}.csv"
    write_csv_atomic(pd.DataFrame(rows, columns=list(TRIAL_COLUMNS)), path)
    return path


def consolidate(spec: MapSpec, rows: pd.DataFrame, out: Path) -> Path:
    """Write the complete table (rows in task order) atomically, then remove the parts.

    Raises:
        MapError: a task of the plan has no row (the table would be incomplete).
    """
    order = {t.key: i for i, t in enumerate(spec.tasks())}
    missing = set(order) - set(rows["key"])
    if missing:
        raise MapError(f"map {spec.name}: {len(missing)} of {len(order)} trials have no result; run `dlfp map` again")
    df = rows.assign(_o=rows["key"].map(order)).sort_values("_o").drop(columns="_o")
    path = table_path(out, spec.name)
    write_csv_atomic(df[list(TRIAL_COLUMNS)], path)
    shutil.rmtree(parts_dir(out, spec.name), ignore_errors=True)
    return path


__all__ = ["consolidate", "load_rows", "parts_dir", "read_table", "table_path", "write_csv_atomic", "write_part"]
