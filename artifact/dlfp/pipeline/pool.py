"""Trial worker processes that never outlive the run and whose death is named, not a traceback.

* Every worker asks the kernel (Linux ``prctl(PR_SET_PDEATHSIG)``) for SIGTERM when its parent dies by any
  signal, SIGKILL included, and checks ``os.getppid()`` before each trial; elsewhere only the check applies.
* Ctrl-C is the parent's: workers ignore SIGINT and the parent terminates them (``stop_pool``). A worker told to
  stop in the middle of a trial unwinds first, so the trial's temporary directory is removed.
* A worker that dies (killed, out of memory, a crash in native code) is named by the trial it was running
  (``dlfp: worker process running trial ... died (signal 9); retrying it once``); the unfinished trials run
  again in a fresh pool, and a trial whose worker dies twice stops the run with one line (``PipelineError``).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from multiprocessing.connection import wait as mp_wait
from typing import Any, Callable, Hashable, Sequence

from dlfp.pipeline.errors import PipelineError
from dlfp.pipeline.progress import say

#: ``prctl`` option: the signal a process receives when its parent dies.
PR_SET_PDEATHSIG = 1
#: Exit status of a worker stopped by SIGTERM (shell convention 128 + 15).
STOPPED_EXIT = 128 + signal.SIGTERM

_PARENT: int | None = None
_STARTED = None
_IN_TRIAL = False


class _Stop(BaseException):
    """Raised inside a worker's trial by SIGTERM, so ``finally`` blocks (temporary directories) run."""


def _on_term(signum, frame) -> None:
    if _IN_TRIAL:
        raise _Stop()
    os._exit(STOPPED_EXIT)


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _init_worker(parent: int, started) -> None:
    """Pool initializer: parent-death signal, SIGINT ignored, SIGTERM unwinds; exit if the parent is gone."""
    global _PARENT, _STARTED
    _PARENT, _STARTED = parent, started
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(STOPPED_EXIT)


def _call(key: Hashable, fn: Callable[..., Any], args: tuple) -> Any:
    """Run ``fn(*args)`` in a worker, after checking the parent is alive and saying which trial starts."""
    global _IN_TRIAL
    if _PARENT is not None and os.getppid() != _PARENT:
        os._exit(STOPPED_EXIT)
    if _STARTED is not None:
        _STARTED.put((os.getpid(), key))
    _IN_TRIAL = True
    try:
        return fn(*args)
    except _Stop:
        os._exit(STOPPED_EXIT)
    finally:
        _IN_TRIAL = False


def stop_pool(pool, procs: dict | None = None) -> None:
    """Cancel a process pool's pending work and terminate its workers now (do not wait for running trials)."""
    procs = list((procs if procs is not None else getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        _exitcode(proc)  # reaped: by this thread or the pool's manager thread, whose status read may still be due


def _how(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return f"signal {-exitcode}, {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


def _dead_keys(procs: dict, started) -> dict[Hashable, str]:
    """``{trial key: how its worker died}`` for the workers of a broken pool that did not stop on request."""
    running: dict[int, Hashable] = {}
    try:
        while not started.empty():
            pid, key = started.get()
            running[pid] = key
    except (OSError, EOFError, ValueError):
        pass
    out = {}
    for pid, proc in procs.items():
        proc.join(timeout=5)
        code = _exitcode(proc)
        ended = code is not None or bool(mp_wait([proc.sentinel], timeout=0))
        if ended and code not in (0, STOPPED_EXIT, -signal.SIGTERM) and pid in running:
            out[running[pid]] = _how(code)
    return out


def _exitcode(proc, wait_s: float = 2.0) -> int | None:
    """``proc.exitcode``, waiting up to ``wait_s`` seconds for it once the process has ended.

    The pool's own manager thread reaps broken workers too; when its ``waitpid`` wins, this thread's reads
    ``None`` until that thread has stored the status on the shared process object. ``None``: still unknown.
    """
    deadline = time.monotonic() + wait_s
    while proc.exitcode is None and time.monotonic() < deadline:
        if not mp_wait([proc.sentinel], timeout=0):
            return None  # still running
        time.sleep(0.01)
    return proc.exitcode


def run_pool(jobs: Sequence[tuple[Hashable, tuple]], fn: Callable[..., Any], workers: int,
             on_done: Callable[[Hashable, Any], None], label: Callable[[Hashable], str] = str) -> None:
    """Run ``fn(*args)`` for every ``(key, args)`` of ``jobs`` on ``workers`` spawned processes.

    ``on_done(key, result)`` is called in this process as each job finishes. ``fn`` must be importable by name
    (a module-level function). A job whose worker died is retried once in a fresh pool (see the module
    docstring); on ``KeyboardInterrupt`` the workers are terminated and the interrupt re-raised.

    Raises:
        PipelineError: a job's worker died twice, or workers died without a job to blame, twice.
        Exception: whatever ``fn`` raised in a worker.
    """
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    ctx = mp.get_context("spawn")
    deaths: dict[Hashable, int] = {}
    unexplained = 0
    remaining = list(jobs)
    while remaining:
        started = ctx.SimpleQueue()  # written synchronously: a worker may die right after
        pool = ProcessPoolExecutor(max_workers=max(1, min(workers, len(remaining))), mp_context=ctx,
                                   initializer=_init_worker, initargs=(os.getpid(), started))
        finished: set = set()
        broken = False
        try:
            # Workers are spawned here; they start with SIGINT ignored (an ignored signal stays ignored across
            # exec), so a Ctrl-C while they import prints nothing: the parent reports it in one line.
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                futs = {pool.submit(_call, key, fn, args): key for key, args in remaining}
            finally:
                signal.signal(signal.SIGINT, previous)
            procs = dict(getattr(pool, "_processes", None) or {})
            for fut in as_completed(futs):
                key = futs[fut]
                try:
                    result = fut.result()
                except BrokenProcessPool:
                    broken = True
                    break
                on_done(key, result)
                finished.add(key)
        except BaseException:
            stop_pool(pool)
            raise
        if not broken:
            pool.shutdown(wait=True)
            return
        procs.update(getattr(pool, "_processes", None) or {})
        dead = _dead_keys(procs, started)
        stop_pool(pool, procs)
        for fut, key in futs.items():  # finished while the pool broke: keep them
            if key not in finished and fut.done() and not fut.cancelled() and fut.exception() is None:
                on_done(key, fut.result())
                finished.add(key)
        remaining = [(k, a) for k, a in remaining if k not in finished]
        if not dead:
            unexplained += 1
            if unexplained > 1:
                raise PipelineError(f"worker processes died twice without finishing a trial; "
                                    f"{len(remaining)} trial(s) not run")
            say(f"dlfp: a worker process died; retrying the {len(remaining)} unfinished trial(s) once")
        for key, how in dead.items():
            deaths[key] = deaths.get(key, 0) + 1
            if deaths[key] > 1:
                raise PipelineError(f"trial {label(key)}: its worker process died twice ({how}); not retried again")
            say(f"dlfp: worker process running trial {label(key)} died ({how}); retrying it once")


__all__ = ["PR_SET_PDEATHSIG", "STOPPED_EXIT", "run_pool", "set_parent_death_signal", "stop_pool"]
