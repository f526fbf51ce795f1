"""Where the pipeline reads and writes: the repository root, the default trace and result directories.

Every path is derived from ``repo_root()``, so ``$DLFP_ROOT`` moves all of them at once.
"""
from __future__ import annotations

import os
from pathlib import Path

from dlfp.pipeline.errors import PipelineError

#: Environment variable naming the repository root (default: found from this file or the cwd).
ROOT_ENV = "DLFP_ROOT"


def repo_root() -> Path:
    """The repository root: ``$DLFP_ROOT``, else the checkout holding this package, else the cwd.

    The checkout is recognised by a ``pyproject.toml`` next to ``notebooks/``.
    """
    env = os.environ.get(ROOT_ENV)
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve()
    for cand in [*here.parents, *Path.cwd().resolve().parents, Path.cwd().resolve()]:
        if (cand / "pyproject.toml").exists() and (cand / "notebooks").is_dir():
            return cand
    return Path.cwd().resolve()


def default_traces_dir(quick: bool = False) -> Path:
    """``<root>/data/traces`` (``data/traces-quick`` for ``--quick`` runs, kept apart from results)."""
    return repo_root() / "data" / ("traces-quick" if quick else "traces")


def default_results_dir(quick: bool = False) -> Path:
    """``<root>/data/results`` (``data/results-quick`` for ``--quick`` runs)."""
    return repo_root() / "data" / ("results-quick" if quick else "results")


def default_published_csv() -> Path:
    """``<root>/data/paper/published.csv``: the paper's numbers, transcribed once."""
    return repo_root() / "data" / "paper" / "published.csv"


def notebooks_dir() -> Path:
    """``<root>/notebooks``: the clean, output-free notebook sources."""
    return repo_root() / "notebooks"


def display_path(path: str | Path) -> str:
    """``path`` relative to the repository root when it lies below it (what notebooks and messages show, so an
    executed notebook names no absolute path of this machine), else as given."""
    p = Path(path)
    try:
        return p.resolve().relative_to(repo_root()).as_posix()
    except ValueError:
        return str(p)


def notebook_path(path: str | Path | None) -> str | None:
    """A path handed to a notebook: ``display_path`` (relative to the repository root, the kernel's working
    directory) or ``None``."""
    return None if path is None else display_path(path)


def check_output_dir(path: Path, what: str) -> Path:
    """``path`` if it is, or can be created as, a directory; else ``PipelineError`` naming ``what`` and the path.

    Rejects a path that is a regular file, or below one (``mkdir`` would raise
    ``FileExistsError``/``NotADirectoryError`` later, after work was done).
    """
    p = Path(path)
    for cand in (p, *p.parents):
        if cand.exists():
            if not cand.is_dir():
                where = "" if cand == p else f" ({cand} is a file)"
                raise PipelineError(f"{what} {p} is not a directory{where}")
            break
    return p


def check_writable(path: Path, what: str, flag: str) -> Path:
    """``path`` if a file can be created in it (or, when it does not exist yet, in its nearest existing parent);
    else ``PipelineError`` naming ``what``, the directory and ``flag`` (the option that chooses another one).

    Probes with a temporary directory that is removed at once, so a read-only root is named as itself, before any
    trial or notebook runs, and not by the name of a temporary written inside it later.

    Raises:
        PipelineError: the directory is not writable (or the file system is full).
    """
    import errno
    import tempfile

    p = Path(path)
    existing = next((c for c in (p, *p.parents) if c.exists()), None)
    if existing is None:
        return p
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dlfp-probe-", dir=existing))
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            from dlfp.traces.format import no_space_message

            raise PipelineError(no_space_message(f"the {what}", existing)) from None
        where = "" if existing == p else f" (its parent {display_path(existing)} cannot hold it)"
        raise PipelineError(f"{what} {display_path(p)} is not writable{where}: {e.strerror or e}; make it "
                            f"writable or choose another with {flag}") from None
    return p


def check_quick_root(root: Path, quick: bool) -> None:
    """Refuse a ``--quick`` smoke run whose traces would go into the shipped traces root ``data/traces``: its
    trials have fewer requests than the experiment declares, so they may not stand in for the shipped ones.

    Raises:
        PipelineError: ``quick`` and ``root`` is ``default_traces_dir()``.
    """
    if quick and Path(root).resolve() == default_traces_dir().resolve():
        raise PipelineError(f"--quick trials do not go into the shipped traces {display_path(root)}: leave out "
                            f"--out/--traces (they go to {display_path(default_traces_dir(True))}) or name another "
                            f"folder")


__all__ = ["ROOT_ENV", "check_output_dir", "check_quick_root", "check_writable", "default_published_csv",
           "default_results_dir", "default_traces_dir", "display_path", "notebook_path", "notebooks_dir", "repo_root"]
