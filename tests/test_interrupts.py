"""Ctrl-C, SIGTERM and dead processes, driven through a real ``dlfp`` subprocess.

Each run uses a small simulator experiment written to a temporary root (``--out``/``--traces``), with trials
long enough (about a second each) that the signal lands after the first trial finished and before the last.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dlfp import pipeline
from dlfp.pipeline.notebooks import kernel_connection_files
from dlfp.config import load_experiment
from dlfp.traces.format import find_trials, is_complete
from test_pipeline import declare_experiment

EXE = Path(sys.executable).with_name("dlfp")
EXP = "qwen3-0.6b-tp1"
TWO_ARMS = {"baseline": {"policy": "nocap"}, "dlfp": {"policy": "dlfp"}}
#: The frontier arms off (the experiment itself is declared per test: ``_declare``).
SLOW = ["--no-frontier"]


def _declare(**settings) -> None:
    """Declare ``EXP`` with two arms and ``settings`` (dotted keys, ``__`` for ``.``) for this test's ``dlfp``
    processes; the default: trials of about a second on the simulator."""
    settings = {k.replace("__", "."): v for k, v in settings.items()} or {"workload.num_requests": 1500,
                                                                           "workload.rate": 4}
    declare_experiment(load_experiment(EXP, {**settings, "arms": TWO_ARMS}))

pytestmark = pytest.mark.skipif(not EXE.exists(), reason="dlfp console script not installed (pip install -e .)")


def _terminal_signals() -> None:
    """In the child before ``exec``: SIGINT and SIGQUIT as in a terminal. A test run started in the background by
    a non-interactive shell (``make test &``, CI) ignores them, and an ignored signal stays ignored across
    ``exec``: Ctrl-C would then never reach ``dlfp``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _start(args: list[str], jobs: int, env_extra: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    env = dict(os.environ, DLFP_JOBS=str(jobs), DLFP_BACKEND="sim", **(env_extra or {}))
    return subprocess.Popen([str(EXE), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_terminal_signals, **kw)


def _wait_for(cond, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"dlfp exited early ({proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > end:
            proc.kill()
            raise AssertionError("timed out waiting for the run to get going")
        time.sleep(0.05)


def _hidden(root: Path) -> list[Path]:
    """Temporaries: anything under ``root`` whose name starts with a dot."""
    return [p for p in root.rglob("*") if p.name.startswith(".")]


@pytest.mark.parametrize("sig,status,jobs", [(signal.SIGINT, 130, 1), (signal.SIGTERM, 143, 2)])
def test_signal_during_run_is_one_line_and_keeps_finished_trials(tmp_path, sig, status, jobs):
    out = tmp_path / "traces"
    _declare()
    proc = _start(["run", EXP, "--out", str(out), "--no-progress", *SLOW], jobs)
    _wait_for(lambda: any(is_complete(d) for d in find_trials(out)), proc)
    workers = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == status
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"dlfp: interrupted ({signal.Signals(sig).name}) after ")
    assert lines[0].endswith("rerun the same command to resume")
    done = find_trials(out)
    assert 1 <= len(done) < 6 and all(is_complete(d) for d in done)
    counted = int(lines[0].split(" after ", 1)[1].split(" ", 1)[0])
    assert counted in (len(done), len(done) - 1)  # a trial written just as the signal came may not be counted
    assert _hidden(out) == []
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []


def test_workers_end_when_the_parent_is_killed(tmp_path):
    out = tmp_path / "traces"
    _declare()
    proc = _start(["run", EXP, "--out", str(out), "--no-progress", *SLOW], 2)
    parent = psutil.Process(proc.pid)

    def workers():
        return [c for c in parent.children(recursive=True) if "multiprocessing" in " ".join(c.cmdline())
                and "resource_tracker" not in " ".join(c.cmdline())]

    _wait_for(lambda: len(workers()) == 2, proc)
    procs = parent.children(recursive=True)
    proc.kill()  # SIGKILL: no handler runs in the parent
    proc.wait(timeout=10)
    gone, alive = psutil.wait_procs(procs, timeout=20)
    assert alive == [], [p.cmdline() for p in alive]


def _notebooks_with_a_waiting_cell(root: Path, marker: Path) -> None:
    """Copy the notebook sources under ``root``, ``experiment.ipynb`` ending with a cell that writes ``marker``
    and then waits: once ``marker`` exists, the kernel is executing and the executed copy is still a temporary."""
    import nbformat

    shutil.copytree(pipeline.notebooks_dir(), root / "notebooks")
    path = root / "notebooks" / "experiment.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        f"import pathlib, time\npathlib.Path({str(marker)!r}).write_text('executing')\ntime.sleep(600)"))
    nbformat.write(nb, str(path))


def test_signal_during_run_all_notebook_is_one_line_without_temporaries(tmp_path):
    root, marker = tmp_path / "repo", tmp_path / "kernel-executing"
    _notebooks_with_a_waiting_cell(root, marker)
    traces, results = root / "data" / "traces", root / "data" / "results"
    _declare(workload__num_requests=5)
    connection_files = kernel_connection_files()
    proc = _start(["run-all", "--experiments", EXP, "--seeds", "801", "--traces", str(traces), "--results",
                   str(results), "--no-progress", "--no-figures", "--no-frontier"], 1,
                  env_extra={pipeline.ROOT_ENV: str(root)})
    _wait_for(marker.exists, proc)
    assert kernel_connection_files() - connection_files  # the running kernel's
    tmp_nb = traces / "sim" / EXP / ".experiment.tmp.ipynb"
    assert tmp_nb.exists()  # papermill saved the copy after the finished cells; the waiting cell still runs
    kernels = psutil.Process(proc.pid).children(recursive=True)
    assert kernels
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    # progress lines of run-all and the kernel's own start-up log (it shares the terminal) aside: one line
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("dlfp run-all", "[IPKernelApp]"))]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("dlfp: interrupted (SIGINT) after 2 trial(s) finished")
    assert _hidden(traces) == [] and not (traces / "sim" / EXP / "experiment.ipynb").exists()
    assert len(find_trials(traces)) == 2 and all(is_complete(d) for d in find_trials(traces))
    gone, alive = psutil.wait_procs(kernels, timeout=10)
    assert alive == []
    assert kernel_connection_files() - connection_files == set()  # the stopped kernel's file is gone too


#: Executes a one-cell notebook with the interrupt handling of the ``dlfp`` command and sends this process
#: SIGINT (or SIGTERM) at the named step after the kernel finished: while the executed copy is cleaned, or
#: just after it was renamed into place.
_AFTER_EXECUTION = """
import os, signal, sys
from pathlib import Path
import nbformat
from dlfp.pipeline import interrupts, notebooks

src, out, step, sig = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], getattr(signal, sys.argv[4])
nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), str(src))
interrupts.install()
clean, replace = notebooks.clean_executed, os.replace

def clean_then_signal(path, source, output):
    clean(path, source, output)
    if step == "clean":
        os.kill(os.getpid(), sig)

def replace_then_signal(a, b):
    replace(a, b)
    if step == "replace" and Path(b) == out:
        os.kill(os.getpid(), sig)

notebooks.clean_executed = clean_then_signal
notebooks.os.replace = replace_then_signal
try:
    notebooks.execute_notebook(src, out, {}, cwd=src.parent)
except KeyboardInterrupt as e:
    print("unwound", interrupts.signal_of(e), file=sys.stderr)
    sys.exit(interrupts.EXIT_STATUS[interrupts.signal_of(e)])
print("finished", file=sys.stderr)
"""


@pytest.mark.parametrize("step,sig,status", [("clean", "SIGINT", 130), ("replace", "SIGINT", 130),
                                             ("clean", "SIGTERM", 143)])
def test_a_signal_after_the_kernel_finished_leaves_no_temporary_notebook(tmp_path, step, sig, status):
    out = tmp_path / "out" / "executed.ipynb"
    proc = subprocess.run([sys.executable, "-c", _AFTER_EXECUTION, str(tmp_path / "source.ipynb"), str(out), step,
                           sig], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          preexec_fn=_terminal_signals)
    assert proc.returncode == status, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("[IPKernelApp]")]
    assert lines == [f"dlfp: interrupted ({sig}) after 0 trial(s) finished, kept on disk; rerun the same command to "
                     f"resume"], proc.stderr
    assert _hidden(tmp_path / "out") == []
    assert out.exists() == (step == "replace")  # renamed just before the signal: the output is whole


def test_an_interrupt_after_the_kernel_finished_removes_the_temporary_notebook(tmp_path, monkeypatch):
    """Without the command's handler (a library call), the interrupt unwinds and the temporary is removed."""
    import nbformat

    from dlfp.pipeline import notebooks

    src, out = tmp_path / "source.ipynb", tmp_path / "out" / "executed.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), str(src))
    seen = []

    def interrupted(path, source, output):
        seen.append(Path(path).name)
        raise KeyboardInterrupt

    monkeypatch.setattr(notebooks, "clean_executed", interrupted)
    with pytest.raises(KeyboardInterrupt):
        notebooks.execute_notebook(src, out, {}, cwd=tmp_path)
    assert seen == [".executed.tmp.ipynb"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


# --------------------------------------------------------------------------- a worker that dies


def die_once(marker: str, value: int) -> int:
    """Kill this worker process the first time it runs for ``marker`` (a path), return ``value * 10`` after."""
    m = Path(marker)
    if not m.exists():
        m.write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    return value * 10


def die_always(marker: str, value: int) -> int:
    """Kill this worker process every time."""
    os.kill(os.getpid(), signal.SIGKILL)
    return value


def test_a_dead_worker_is_named_and_its_trial_retried_once(tmp_path, capsys):
    got = {}
    jobs = [("a", (str(tmp_path / "never"), 1)), ("b", (str(tmp_path / "b-died"), 2))]
    (tmp_path / "never").write_text("already")  # job a never dies
    pipeline.run_pool(jobs, die_once, 1, got.__setitem__, label=lambda k: f"sim/x/{k}/seed-1")
    assert got == {"a": 10, "b": 20}
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dlfp: worker process running trial sim/x/b/seed-1 died (signal 9, SIGKILL); retrying it once"]


def test_a_worker_that_dies_twice_stops_the_run_with_one_line(tmp_path, capsys):
    with pytest.raises(pipeline.PipelineError) as ei:
        pipeline.run_pool([("b", ("", 2))], die_always, 1, lambda k, r: None, label=lambda k: f"sim/x/{k}/seed-1")
    assert str(ei.value) == "trial sim/x/b/seed-1: its worker process died twice (signal 9, SIGKILL); not retried again"
    assert capsys.readouterr().err.count("retrying it once") == 1
