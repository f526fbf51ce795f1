"""Content fingerprints: of files, of trial directories, of this package's code and of the environment.

Every fingerprint is a sha256 hex digest (64 characters) computed from bytes only, never from modification
times or absolute paths, so two checkouts with the same files give the same fingerprints. Used by the render
stamps, the simulator's verification record and provenance (``dlfp.pipeline.stamps``, ``dlfp.pipeline.verified``,
``dlfp.pipeline.provenance``) and by
the per-trial digest cache of the tables (``dlfp.analysis.tables.digest_cache``).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from dlfp.paths import PACKAGE_DIR

#: The files of one trial directory that ``dlfp.traces.format.load_trial`` reads.
TRIAL_FILES = ("iterations.parquet", "metadata.json", "requests.parquet", "tokens.parquet")
#: Installed packages whose version can change the bytes of a trial.
TRIAL_PACKAGES = ("numpy", "pandas", "pyarrow", "scipy", "pydantic", "PyYAML")
#: Installed packages whose version can change the bytes of a rendered table, figure or executed notebook.
RENDER_PACKAGES = TRIAL_PACKAGES + ("matplotlib", "seaborn", "papermill", "nbformat", "nbclient", "ipykernel",
                                    "ipython")
#: What a missing file hashes to in a listing (no sha256 digest has this form).
MISSING = "missing"
_CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (hex). Raises ``OSError`` when it cannot be read."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def text_sha256(text: str) -> str:
    """sha256 of a text's UTF-8 bytes (hex)."""
    return hashlib.sha256(text.encode()).hexdigest()


def canonical_json(obj: Any) -> str:
    """``obj`` as JSON with sorted keys and no whitespace (the form every fingerprint of a mapping hashes)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def listing_sha256(entries: Iterable[tuple[str, str]]) -> str:
    """sha256 of ``(name, digest)`` pairs, sorted by name: one digest for a set of files."""
    return text_sha256("".join(f"{name}\0{digest}\n" for name, digest in sorted(entries)))


def trial_sha256(path: str | Path) -> str:
    """One digest of a trial directory: its four files (``TRIAL_FILES``) by name and content.

    A missing file counts as ``MISSING``, so a partial trial never matches a complete one.
    """
    p = Path(path)
    return listing_sha256((n, file_sha256(p / n) if (p / n).is_file() else MISSING) for n in TRIAL_FILES)


def package_files(root: str | Path = PACKAGE_DIR) -> list[Path]:
    """Every file of the package below ``root``, sorted: code and data (YAML, JSON), no byte-code or caches.

    Left out: ``__pycache__`` folders, ``*.pyc`` files and names starting with ``.`` (editor and temporary files).
    """
    root = Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        out += [Path(dirpath) / f for f in filenames if not f.startswith(".") and not f.endswith(".pyc")]
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def tree_sha256(root: str | Path = PACKAGE_DIR) -> str:
    """sha256 over the relative path and content of every ``package_files(root)`` file."""
    root = Path(root)
    return listing_sha256((p.relative_to(root).as_posix(), file_sha256(p)) for p in package_files(root))


def environment(packages: Iterable[str] = TRIAL_PACKAGES, *, python_patch: bool = False) -> dict[str, str]:
    """What outside the package shapes an output: Python (``3.11``; ``3.11.7`` with ``python_patch``), the
    machine architecture and the installed versions of ``packages`` (``"absent"`` for one not installed)."""
    from importlib import metadata as md

    v = sys.version_info
    out = {"python": f"{v.major}.{v.minor}.{v.micro}" if python_patch else f"{v.major}.{v.minor}",
           "machine": platform.machine()}
    for name in packages:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    return out


@lru_cache(maxsize=None)
def _code_fingerprint(root: str, packages: tuple[str, ...], python_patch: bool) -> str:
    return text_sha256(canonical_json({"package": tree_sha256(root),
                                       "environment": environment(packages, python_patch=python_patch)}))


def code_fingerprint(kind: str = "trial", root: str | Path = PACKAGE_DIR, *, fresh: bool = False) -> str:
    """The fingerprint of the code that makes an output: the whole package's files and the environment.

    ``kind`` is ``"trial"`` (a trial: ``TRIAL_PACKAGES``, Python major.minor) or ``"render"`` (a table, figure
    or executed notebook: ``RENDER_PACKAGES``, Python with its patch version, which executed notebooks record).
    Computed once per process unless ``fresh``. Raises ``ValueError`` for another ``kind``.
    """
    if kind not in ("trial", "render"):
        raise ValueError(f"code fingerprint kind {kind!r}: expected 'trial' or 'render'")
    if fresh:
        _code_fingerprint.cache_clear()
    packages = TRIAL_PACKAGES if kind == "trial" else RENDER_PACKAGES
    return _code_fingerprint(str(Path(root).resolve()), packages, kind == "render")


def write_json_atomic(path: str | Path, obj: Any) -> bool:
    """Write ``obj`` as indented JSON with sorted keys and a final newline, through ``.<name>.tmp-<pid>`` renamed
    into place, so a reader never sees a partial file and equal objects give equal bytes. A file that already
    holds exactly these bytes is left as it is. Returns True when the file was written.

    Raises:
        OSError: the folder cannot be created or written.
        TypeError: ``obj`` is not JSON-serialisable.
    """
    path = Path(path)
    text = json.dumps(obj, indent=1, sort_keys=True) + "\n"
    try:
        if path.read_text() == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return True


def read_json(path: str | Path) -> dict | None:
    """The JSON object in ``path``; ``None`` when it is missing, unreadable, not JSON or not an object."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


__all__ = ["MISSING", "RENDER_PACKAGES", "TRIAL_FILES", "TRIAL_PACKAGES", "canonical_json", "code_fingerprint",
           "environment", "file_sha256", "listing_sha256", "package_files", "read_json", "text_sha256",
           "trial_sha256", "tree_sha256", "write_json_atomic"]
