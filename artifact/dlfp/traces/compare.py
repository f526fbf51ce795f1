"""Is a regenerated trial the shipped one? Byte-for-byte comparison of trial directories.

The three Parquet files must be byte-identical. ``metadata.json`` must be equal after dropping what records
where and when a trial ran rather than what it is: ``git_commit``, ``versions`` (installed packages) and the
experiment's free-text ``description`` and ``assumptions`` (their wording can change without changing a run).
"""
from __future__ import annotations

import filecmp
import json
from pathlib import Path

#: Metadata keys that describe provenance, not the trial.
PROVENANCE_KEYS = ("git_commit", "versions")
#: Config keys that are free text.
DESCRIPTIVE_CONFIG_KEYS = ("description", "assumptions")
PARQUET_FILES = ("requests.parquet", "tokens.parquet", "iterations.parquet")


def comparable_metadata(path: Path) -> dict:
    """The metadata of ``path`` (a ``metadata.json``) without provenance and free text."""
    md = json.loads(Path(path).read_text())
    for k in PROVENANCE_KEYS:
        md.pop(k, None)
    cfg = md.get("config")
    if isinstance(cfg, dict):
        for k in DESCRIPTIVE_CONFIG_KEYS:
            cfg.pop(k, None)
    return md


def trial_differences(expected: Path, actual: Path) -> list[str]:
    """What differs between two trial directories (``seed-<n>/``): file names, empty when identical."""
    out = []
    for name in PARQUET_FILES:
        e, a = Path(expected) / name, Path(actual) / name
        if not e.is_file() or not a.is_file():
            out.append(f"{name} missing")
        elif not filecmp.cmp(e, a, shallow=False):
            out.append(name)
    e, a = Path(expected) / "metadata.json", Path(actual) / "metadata.json"
    if not e.is_file() or not a.is_file():
        out.append("metadata.json missing")
    elif comparable_metadata(e) != comparable_metadata(a):
        out.append("metadata.json")
    return out


def tree_differences(expected_root: Path, actual_root: Path) -> dict[str, list[str]]:
    """Every trial directory under ``actual_root`` compared with the same relative path under ``expected_root``.

    Returns ``{relative trial path: differences}`` for the trials that differ (a trial missing from
    ``expected_root`` counts as differing).
    """
    diffs = {}
    for md in sorted(Path(actual_root).rglob("metadata.json")):
        rel = md.parent.relative_to(actual_root)
        d = trial_differences(Path(expected_root) / rel, md.parent)
        if d:
            diffs[str(rel)] = d
    return diffs
