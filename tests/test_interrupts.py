"""Ctrl-C, SIGTERM and dead processes, driven through a real ``dlfp`` subprocess.

Each run uses a small simulator experiment written to a temporary root (``--out``/``--traces``), with trials
long enough (about a second each) that the signal lands after the first trial finished and before the last.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dlfp import pipeline
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


def _start(args: list[str], jobs: int, **kw) -> subprocess.Popen:
    env = dict(os.environ, DLFP_JOBS=str(jobs), DLFP_BACKEND="sim")
    return subprocess.Popen([str(EXE), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            **kw)


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


def test_signal_during_run_all_notebook_is_one_line_without_temporaries(tmp_path):
    traces, results = tmp_path / "traces", tmp_path / "results"
    _declare(workload__num_requests=5)
    proc = _start(["run-all", "--experiments", EXP, "--seeds", "801", "--traces", str(traces), "--results",
                   str(results), "--no-progress", "--no-figures", "--no-frontier"], 1)
    tmp_nb = traces / "sim" / EXP / ".experiment.tmp.ipynb"
    _wait_for(tmp_nb.exists, proc)
    kernels = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("dlfp run-all")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("dlfp: interrupted (SIGINT) after 2 trial(s) finished")
    assert _hidden(traces) == [] and not (traces / "sim" / EXP / "experiment.ipynb").exists()
    assert len(find_trials(traces)) == 2 and all(is_complete(d) for d in find_trials(traces))
    gone, alive = psutil.wait_procs(kernels, timeout=10)
    assert alive == []


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
