"""Ctrl-C and SIGTERM: one line saying what finished, temporaries removed, exit status 130 or 143.

* ``install`` (called by the ``dlfp`` command) turns SIGTERM into ``Terminated``, a ``KeyboardInterrupt``, so
  both signals unwind the same way: trial temporaries are removed by ``finally`` blocks, worker pools are
  terminated (``dlfp.pipeline.pool``), completed trials stay on disk.
* While a notebook runs in a Jupyter kernel, unwinding through papermill and nbclient prints pages of
  tracebacks; there ``stop_at_once`` (active only after ``install``) stops the kernel's process tree, runs the
  cleanup it was given, prints the line and exits at once.
* ``TALLY`` counts what finished in this process, for that one line (``message``).
"""
from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

#: Exit status per signal (shell convention 128 + signal number).
EXIT_STATUS = {signal.SIGINT: 128 + signal.SIGINT, signal.SIGTERM: 128 + signal.SIGTERM}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's ``KeyboardInterrupt`` so that the same cleanup runs."""

    signum = signal.SIGTERM


@dataclass
class Tally:
    """What finished in this process: trials written or kept, experiments done."""

    trials: int = 0
    experiments: list[str] = field(default_factory=list)
    #: The interrupted command had ``--force`` (rerun everything): the same command would start over.
    forced: bool = False

    def message(self, signum: int) -> str:
        """The one line printed on an interrupt: what finished and how to continue from there."""
        name = signal.Signals(signum).name
        parts = [f"{self.trials} trial(s)"] if self.trials or not self.experiments else []
        if self.experiments:
            parts.append(f"{len(self.experiments)} experiment(s) ({', '.join(self.experiments)})")
        how = ("rerun the same command without --force to resume (with --force every trial runs again)"
               if self.forced else "rerun the same command to resume")
        return f"dlfp: interrupted ({name}) after {' and '.join(parts)} finished, kept on disk; {how}"


TALLY = Tally()
_INSTALLED = False


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def install() -> None:
    """Make SIGTERM raise ``Terminated`` in the main thread and enable ``stop_at_once``."""
    global _INSTALLED
    signal.signal(signal.SIGTERM, _raise_terminated)
    _INSTALLED = True


def signal_of(exc: BaseException) -> int:
    """The signal behind an interrupt exception (SIGINT for a plain ``KeyboardInterrupt``)."""
    return getattr(exc, "signum", signal.SIGINT)


def kill_children() -> None:
    """SIGKILL every descendant process of this one (a notebook kernel, its workers, their helpers) and reap."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - ipykernel depends on psutil
        return
    procs = psutil.Process().children(recursive=True)
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


@contextmanager
def stop_at_once(cleanup: Callable[[], None]) -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM kill the child processes, run ``cleanup``, print ``TALLY.message``
    and exit with ``EXIT_STATUS`` immediately (no unwinding). Inactive unless ``install`` ran (the CLI)."""
    if not _INSTALLED:
        yield
        return

    def handler(signum, frame) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            kill_children()
            cleanup()
        finally:
            print(TALLY.message(signum), file=sys.__stderr__, flush=True)
            os._exit(EXIT_STATUS[signum])

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


__all__ = ["EXIT_STATUS", "TALLY", "Tally", "Terminated", "install", "kill_children", "signal_of", "stop_at_once"]
