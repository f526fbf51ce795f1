"""Render stamps: is an executed notebook and what it wrote still what its inputs give?

Beside each rendered output (``<results>/figures.ipynb``, ``<traces>/<backend>/<experiment>/experiment.ipynb``)
a stamp ``<stem>.stamp.json`` records, as sha256 digests (``dlfp.fingerprint``):

* ``inputs``: the notebook source, the traces it reads (one digest per ``<backend>/<experiment>``: every trial
  directory's four files) and any other file it reads (the published numbers, the fidelity and calibration
  outputs);
* ``parameters``: the papermill parameters (paths relative to the repository root);
* ``code``: the whole ``dlfp`` package and the versions of the packages that render (``code_fingerprint``);
* ``outputs``: every file the render wrote.

An output is fresh when its stamp exists and every one of these is unchanged, compared by content only (never
by modification time): then it is not rendered again. The stamp is written atomically after a successful render
only, with sorted keys and no timestamps or absolute paths, so it can be committed and a fresh clone finds the
committed outputs fresh. A render that fails (a corrupt or partial trace set) leaves the old stamp, whose inputs
no longer match, so the next render checks the traces again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from dlfp.fingerprint import (MISSING, code_fingerprint, file_sha256, listing_sha256, read_json, trial_sha256,
                              write_json_atomic)

#: File name suffix of a stamp: ``figures.ipynb`` -> ``figures.stamp.json``.
STAMP_SUFFIX = ".stamp.json"
STAMP_FORMAT = 1
#: Suffixes of the files a render writes into its folder (listed in ``outputs``).
RENDERED_SUFFIXES = (".csv", ".md", ".png", ".pdf", ".ipynb")
ABOUT = ("Content fingerprints (sha256) of what rendered the files listed under outputs; while every one "
         "matches they are not rendered again (`--force` renders anyway).")


def stamp_path(output: str | Path) -> Path:
    """The stamp of a rendered notebook: ``<folder>/<stem>.stamp.json``."""
    p = Path(output)
    return p.with_name(p.stem + STAMP_SUFFIX)


def file_digest(path: str | Path) -> str:
    """``file_sha256`` of a file, ``MISSING`` when there is none."""
    p = Path(path)
    return file_sha256(p) if p.is_file() else MISSING


def folder_digest(folder: str | Path) -> str:
    """One digest of every file below ``folder`` (names relative to it), ``MISSING`` when it does not exist."""
    d = Path(folder)
    if not d.is_dir():
        return MISSING
    files = sorted(p for p in d.rglob("*") if p.is_file() and not p.name.startswith("."))
    return listing_sha256((p.relative_to(d).as_posix(), file_sha256(p)) for p in files)


def traces_digests(root: str | Path, groups: Iterable[tuple[str, str]] | None = None,
                   include_derived: bool = False) -> dict[str, str]:
    """``{"traces/<backend>/<experiment>": digest}`` of the trial directories under ``root``.

    Each digest covers every trial directory of the group (its path below the group and ``trial_sha256``).
    ``groups`` restricts to those (backend, experiment) pairs (a group without trials gets ``MISSING``);
    without it every group is listed except override experiments (``<experiment>+<hash>``), which a render of
    the shipped matrix leaves out, unless ``include_derived``.
    """
    from dlfp.traces.format import find_trials

    root = Path(root)
    wanted = None if groups is None else set(groups)
    by_group: dict[tuple[str, str], list[tuple[str, str]]] = {g: [] for g in (wanted or ())}
    for path in find_trials(root):
        backend, experiment, arm, seed = path.parts[-4:]
        key = (backend, experiment)
        if wanted is not None and key not in wanted:
            continue
        if wanted is None and "+" in experiment and not include_derived:
            continue
        by_group.setdefault(key, []).append((f"{arm}/{seed}", trial_sha256(path)))
    return {f"traces/{b}/{e}": listing_sha256(items) if items else MISSING
            for (b, e), items in sorted(by_group.items())}


def rendered_files(folder: str | Path, names: Sequence[str] | None = None) -> dict[str, str]:
    """``{name: sha256}`` of the files a render left in ``folder``: ``names``, or every file there with a
    ``RENDERED_SUFFIXES`` suffix except hidden ones, failed notebook copies and stamps."""
    d = Path(folder)
    if names is None:
        names = sorted(p.name for p in d.iterdir() if p.is_file() and p.suffix in RENDERED_SUFFIXES
                       and not p.name.startswith(".") and not p.name.endswith(".failed.ipynb")) if d.is_dir() else []
    return {n: file_digest(d / n) for n in names}


def make_stamp(inputs: dict[str, str], parameters: dict[str, Any], outputs: dict[str, str]) -> dict[str, Any]:
    """The stamp of a render with these inputs, parameters and outputs, by the code running now."""
    return {"about": ABOUT, "code": code_fingerprint("render"), "format": STAMP_FORMAT, "inputs": dict(inputs),
            "outputs": dict(outputs), "parameters": _plain(parameters)}


def _plain(obj: Any) -> Any:
    """``obj`` as JSON gives it back (tuples as lists), so a stamp compares equal to itself after a round trip."""
    import json

    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def _changed(now: dict[str, str], then: dict[str, str]) -> list[str]:
    return sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))


def stale_reason(output: str | Path, inputs: dict[str, str], parameters: dict[str, Any]) -> str | None:
    """Why the render of ``output`` must run again (one phrase), or ``None`` when it is fresh.

    Fresh: its stamp exists and records this code, these ``parameters`` and ``inputs``, and every output it lists
    still has the recorded content.
    """
    st = read_json(stamp_path(output))
    if st is None:
        return "no stamp of an earlier render"
    if st.get("format") != STAMP_FORMAT or not isinstance(st.get("inputs"), dict) \
            or not isinstance(st.get("outputs"), dict):
        return "the stamp is of another format"
    if st.get("code") != code_fingerprint("render"):
        return "the dlfp code or the installed packages changed"
    if st.get("parameters") != _plain(parameters):
        return "the notebook parameters changed"
    changed = _changed(inputs, st["inputs"])
    if changed:
        return f"changed input(s): {', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}"
    folder = Path(output).parent
    outs = st["outputs"]
    if Path(output).name not in outs:
        return "the stamp does not list the executed notebook"
    bad = [n for n, sha in sorted(outs.items()) if file_digest(folder / n) != sha]
    if bad:
        return f"output(s) changed or missing since the render: {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}"
    return None


def write_stamp(output: str | Path, inputs: dict[str, str], parameters: dict[str, Any],
                names: Sequence[str] | None = None) -> Path:
    """Record the render of ``output`` (the outputs: ``rendered_files(folder, names)``); returns the stamp path."""
    folder = Path(output).parent
    path = stamp_path(output)
    write_json_atomic(path, make_stamp(inputs, parameters, rendered_files(folder, names)))
    return path


__all__ = ["RENDERED_SUFFIXES", "STAMP_FORMAT", "STAMP_SUFFIX", "file_digest", "folder_digest", "make_stamp",
           "rendered_files", "stale_reason", "stamp_path", "traces_digests", "write_stamp"]
