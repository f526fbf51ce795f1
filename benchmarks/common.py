"""What the command benchmarks share: the target line ``targets.py`` collects, the scratch copy of the repository
a command runs in (``$DLFP_ROOT``), and timing a command's cached runs. Not a benchmark itself."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
#: What ``dlfp figures`` and ``dlfp run-all`` read and write, copied into a scratch repository root.
COPIED = ("notebooks", "data/traces", "data/paper", "data/results")

#: A timed run: ``() -> (wall seconds, exit status, its last line)``.
TimedRun = Callable[[], tuple[float, int, str]]


def report_target(measure: str, value: str, target: str, met: bool) -> None:
    """One line in the form ``benchmarks/targets.py`` collects: ``target | measure | value | target | met``."""
    print(f"target | {measure} | {value} | {target} | {'met' if met else 'missed'}")


def scratch_copy(dest: Path) -> Path:
    """Copy what ``dlfp figures`` and ``dlfp run-all`` read and write into ``dest`` (a root for ``$DLFP_ROOT``)."""
    for rel in COPIED:
        if (REPO / rel).is_dir():
            shutil.copytree(REPO / rel, dest / rel, ignore=shutil.ignore_patterns("*.failed.ipynb", ".*.tmp*"))
    shutil.copy2(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def cached_runs(run: TimedRun, repeat: int, label: str, first_note: str) -> tuple[int, list[float]]:
    """Run ``run`` once (it renders or reruns what is not fresh), then ``repeat`` (at least 1) cached times,
    printing each; returns ``(exit status, cached wall times in s)``, stopping at the first failure."""
    dt, rc, last = run()
    print(f"first run: {label} {dt:.1f} s ({first_note})\n    {last}")
    if rc != 0:
        return rc, []
    times = []
    for i in range(max(1, repeat)):
        dt, rc, last = run()
        if rc != 0:
            print(last, file=sys.stderr)
            return rc, times
        times.append(dt)
        print(f"cached run {i + 1}: {label} {dt:.1f} s\n    {last}")
    return 0, times
