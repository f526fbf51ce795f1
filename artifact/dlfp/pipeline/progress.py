"""Progress output: tqdm bars and one-line notes, kept out of executed notebooks.

Inside a papermill kernel started by ``run_all`` (``$DLFP_PROGRESS_STDERR=1``)
they go to the kernel's original stderr, i.e. the terminal of ``make
run-all``, through the copy of fd 2 that ipykernel keeps before it captures
the stream, so the bars do not end up in the executed notebook. Elsewhere
they go to ``sys.stderr``.
"""
from __future__ import annotations

import os
import sys

#: Environment variable set by ``run_all`` so that progress bars inside a papermill kernel
#: write to the kernel's inherited stderr (the terminal of ``make run-all``), not into the notebook.
PROGRESS_ENV = "DLFP_PROGRESS_STDERR"

#: Environment variable (``1``) that turns progress bars off, in this process and in notebook kernels it starts
#: (``dlfp run-all --no-progress``).
NO_PROGRESS_ENV = "DLFP_NO_PROGRESS"

_TERMINAL = None


def bars_enabled(progress: bool = True) -> bool:
    """``progress``, unless ``$DLFP_NO_PROGRESS=1`` turns the bars off."""
    return bool(progress) and os.environ.get(NO_PROGRESS_ENV) != "1"


def progress_file():
    """The text stream progress bars and notes go to (see the module docstring); opened once per process."""
    global _TERMINAL
    if os.environ.get(PROGRESS_ENV) != "1":
        return sys.stderr
    if _TERMINAL is None:
        fd = getattr(sys.stderr, "_original_stdstream_copy", None)
        try:
            _TERMINAL = os.fdopen(os.dup(fd), "w", buffering=1) if isinstance(fd, int) else sys.__stderr__
        except OSError:
            _TERMINAL = sys.__stderr__
    return _TERMINAL or sys.stderr


def say(msg: str) -> None:
    """Write one line to ``progress_file()`` without breaking the bars drawn there."""
    from tqdm import tqdm

    tqdm.write(msg, file=progress_file())


__all__ = ["NO_PROGRESS_ENV", "PROGRESS_ENV", "bars_enabled", "progress_file", "say"]
