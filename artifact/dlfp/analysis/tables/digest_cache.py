"""A cache of what ``load_traces`` computes per trial, keyed by the trial's content and the code.

Loading a trial (reading and validating its Parquet files, ``dlfp.traces.format.load_trial``) and summarising
it (``dlfp.analysis.metrics.summarize``, ITL samples, measured tokens, guarded iterations) is most of the time a
render takes. Here the result is kept per trial under a key that is the sha256 of:

* the bytes of the trial's four files (the cache holds only trials that loaded and validated: a changed byte
  gives another key, so a corrupt or changed trial is loaded, and refused, again);
* the trial's place in the traces tree (``<backend>/<experiment>/<arm>/seed-<n>``, which its metadata must name);
* ``dlfp.fingerprint.code_fingerprint("trial")``: every file of the ``dlfp`` package and the package versions.

The cache lives in ``$DLFP_CACHE_DIR`` (default ``<repository>/.cache/dlfp``; ``off`` disables it), one file
per trial in a folder per code fingerprint, written atomically, holding the sha256 of its own payload: a file
that does not match is ignored and rewritten. The first write of a process removes the folders of other code
(``prune``), so the cache holds one generation, about 100 MB for the shipped traces. Trials served from the
cache carry a ``LazyTrial``: the metadata at once, the frames read (and validated) from the trial directory on
first use.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from dlfp.fingerprint import canonical_json, code_fingerprint, file_sha256, text_sha256
from dlfp.paths import CACHE_ENV, REPO_ROOT
from dlfp.traces.format import Trial, load_trial

_MAGIC = b"dlfp-trial-digest 1\n"
_PARQUET = ("iterations.parquet", "requests.parquet", "tokens.parquet")


def cache_dir() -> Path | None:
    """The folder of cached digests: ``$DLFP_CACHE_DIR/digests`` (default ``<repository>/.cache/dlfp/digests``);
    ``None`` when ``$DLFP_CACHE_DIR`` is ``off``."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env.lower() == "off":
        return None
    return (Path(env) if env else REPO_ROOT / ".cache" / "dlfp") / "digests"


class LazyTrial(Trial):
    """A ``Trial`` whose metadata is known and whose frames are read (``load_trial``) on first use.

    Raises ``dlfp.traces.format.TraceError`` on first use of a frame when the trial no longer loads.
    """

    def __init__(self, path: str | Path, metadata: dict[str, Any], frames: Trial | None = None) -> None:
        self.path = Path(path)
        self.metadata = metadata
        self._frames = frames

    def _load(self) -> Trial:
        if self._frames is None:
            self._frames = load_trial(self.path)
        return self._frames

    requests = property(lambda self: self._load().requests)
    tokens = property(lambda self: self._load().tokens)
    iterations = property(lambda self: self._load().iterations)

    def __getstate__(self) -> dict[str, Any]:  # to another process: the path and metadata, not the frames
        return {"path": self.path, "metadata": self.metadata, "_frames": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"LazyTrial({str(self.path)!r})"


def trial_key(path: Path) -> tuple[str, bytes]:
    """``(key, metadata.json bytes)`` of a trial directory (the key hashes exactly the metadata returned).

    Raises:
        OSError: a file cannot be read (the caller loads the trial, which names the problem).
    """
    md = (path / "metadata.json").read_bytes()
    files = {n: file_sha256(path / n) for n in _PARQUET}
    files["metadata.json"] = hashlib.sha256(md).hexdigest()
    key = text_sha256(canonical_json({"code": code_fingerprint("trial"), "files": files,
                                      "where": list(path.parts[-4:])}))
    return key, md


def _generation() -> str:
    """The folder of this code's digests: the first 16 hex digits of its fingerprint."""
    return code_fingerprint("trial")[:16]


def _file(key: str) -> Path | None:
    d = cache_dir()
    return None if d is None else d / _generation() / key[:2] / f"{key}.pkl"


_PRUNED: set[Path] = set()


def prune(folder: Path | None = None) -> list[Path]:
    """Remove the digests of other code (every generation folder but this code's) from ``folder`` (default
    ``cache_dir()``), at most once per process and folder; returns the folders removed. A folder that cannot be
    removed is left."""
    import shutil

    d = folder if folder is not None else cache_dir()
    if d is None or d in _PRUNED or not d.is_dir():
        return []
    _PRUNED.add(d)
    old = [g for g in d.iterdir() if g.is_dir() and g.name != _generation() and not g.name.startswith(".")]
    for g in old:
        shutil.rmtree(g, ignore_errors=True)
    return old


def read(key: str) -> dict[str, Any] | None:
    """The cached digest of ``key`` (``summary``, ``itl``, ``tokens``, ``guarded``), or ``None`` when there is no
    intact one."""
    f = _file(key)
    try:
        blob = f.read_bytes() if f is not None else b""
    except OSError:
        return None
    head = len(_MAGIC) + 65
    if not blob.startswith(_MAGIC) or hashlib.sha256(blob[head:]).hexdigest().encode() != blob[len(_MAGIC):head - 1]:
        return None
    try:
        d = pickle.loads(blob[head:])
    except Exception:  # an intact payload of another layout: recompute
        return None
    names, codes, index, token_ids = d.pop("token_parts")
    d["tokens"] = (np.asarray(names, dtype=object)[codes], index, token_ids)
    return d


def write(key: str, digest: dict[str, Any]) -> None:
    """Store ``digest`` (its ``summary``, ``itl``, ``tokens`` and ``guarded``) under ``key``, atomically; a cache
    that cannot be written is left alone."""
    f = _file(key)
    if f is None:
        return
    prune()
    rids, index, token_ids = digest["tokens"]
    if any(type(x) is not str for x in rids):  # only plain request ids round-trip through their names
        return
    names, codes = np.unique(np.asarray(rids, dtype=str), return_inverse=True) if len(rids) else (np.array([]), [])
    payload = pickle.dumps({"summary": digest["summary"], "itl": digest["itl"], "guarded": digest["guarded"],
                            "token_parts": (names.tolist(), np.asarray(codes, dtype=np.int64), index, token_ids)},
                           protocol=5)
    tmp = f.with_name(f".{f.name}.tmp-{os.getpid()}")
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
        os.replace(tmp, f)
    except OSError:
        pass
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def metadata_of(blob: bytes) -> dict[str, Any]:
    """The metadata of a cached trial from the ``metadata.json`` bytes its key was computed from."""
    return json.loads(blob)


__all__ = ["CACHE_ENV", "LazyTrial", "cache_dir", "metadata_of", "prune", "read", "trial_key", "write"]
