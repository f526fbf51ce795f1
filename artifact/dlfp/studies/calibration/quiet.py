"""Is the machine quiet? Load, other processes' CPU use and CPU frequency before, during and after a timed run.

Timings of the real engine on a 2-core machine are only worth fitting when nothing else runs. The 1-minute
load average cannot say that by itself during a run: the engine's own threads raise it by one or two. So
``QuietMonitor`` samples, once a second, from ``/proc``:

* ``loadavg``: the kernel's 1-, 5- and 15-minute load averages (``/proc/loadavg``);
* ``foreign_cores``: CPU time used by every process OUTSIDE this process's tree (this process and its
  descendants: the engine core, the compile workers), in cores (CPU-seconds per second), from the
  ``utime + stime`` of ``/proc/<pid>/stat``; smoothed like the 1-minute load average
  (``FOREIGN_TAU_S`` = 60 s exponential average), so it is "the load of everything else";
* ``cpu_mhz``: the mean ``cpu MHz`` of ``/proc/cpuinfo`` (a VM may report a constant);
* ``steal_share``: the share of CPU time the hypervisor gave to other guests during the run (the ``steal``
  column of ``/proc/stat``), which no process of this machine can see; recorded, not judged.

The verdict (``QuietReport.verdict``):

* ``refused`` before the run when the 1-minute load exceeds ``MAX_LOAD_PER_CORE`` (0.5) per core after
  waiting up to ``START_WAIT_S`` for it to fall (a previous run of our own raises it for a minute);
* ``provisional`` when, during the run, the smoothed load of other processes rose by more than
  ``MAX_LOAD_CHANGE`` (0.3) above its value at the start, or the sampled CPU frequency changed by more
  than ``MAX_MHZ_CHANGE`` (2 %);
* ``quiet`` otherwise.

The two limits are the ones this artifact's fidelity targets state (0.5 per core, a change of 0.3).
"""
from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: refuse to start when the 1-minute load average exceeds this per core
MAX_LOAD_PER_CORE = 0.5
#: mark the run provisional when other processes' smoothed load rises by more than this (cores)
MAX_LOAD_CHANGE = 0.3
#: mark the run provisional when the sampled CPU frequency moves by more than this fraction
MAX_MHZ_CHANGE = 0.02
#: time constant (s) of the exponential average of other processes' CPU use (the 1-minute load average's)
FOREIGN_TAU_S = 60.0
#: seconds between samples
SAMPLE_S = 1.0
#: seconds ``check_start`` waits for the 1-minute load to fall under the limit before refusing
START_WAIT_S = 150.0
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def read_loadavg() -> tuple[float, float, float]:
    """``(1-, 5-, 15-minute)`` load averages; NaNs where ``/proc/loadavg`` is unreadable."""
    try:
        a = Path("/proc/loadavg").read_text().split()
        return float(a[0]), float(a[1]), float(a[2])
    except (OSError, ValueError, IndexError):
        return math.nan, math.nan, math.nan


def read_cpu_ticks() -> tuple[int, int]:
    """``(steal ticks, all ticks)`` of the ``cpu`` line of ``/proc/stat``; ``(0, 0)`` where unreadable."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return 0, 0
    return (f[7] if len(f) > 7 else 0), sum(f[:8])


def read_cpu_mhz() -> float:
    """Mean ``cpu MHz`` over the cores of ``/proc/cpuinfo``; NaN where absent."""
    try:
        vals = [float(line.split(":", 1)[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("cpu MHz")]
    except (OSError, ValueError):
        return math.nan
    return sum(vals) / len(vals) if vals else math.nan


def process_cpu_seconds() -> dict[int, tuple[int, str, float]]:
    """``{pid: (parent pid, command name, utime + stime in seconds)}`` of every readable process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            s = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        # the command name is in parentheses and may contain spaces: split after the last ')'
        lpar, rpar = s.find("("), s.rfind(")")
        rest = s[rpar + 2:].split()
        try:
            out[int(d)] = (int(rest[1]), s[lpar + 1:rpar], (int(rest[11]) + int(rest[12])) / _CLK_TCK)
        except (IndexError, ValueError):
            continue
    return out


def tree_of(root: int, procs: dict[int, tuple[int, str, float]]) -> set[int]:
    """``root`` and all its descendants among ``procs`` (from the parent pids)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    tree, stack = set(), [root]
    while stack:
        p = stack.pop()
        if p in tree:
            continue
        tree.add(p)
        stack.extend(children.get(p, ()))
    return tree


@dataclass
class QuietReport:
    """What ``QuietMonitor`` saw. Loads are in runnable tasks (the kernel's unit), ``*_cores`` in cores.

    ``foreign_top``: the other processes that used the most CPU during the run, ``[(command, CPU-seconds)]``.
    """

    cores: int
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    load1_max: float = math.nan
    foreign_start: float = math.nan
    foreign_max: float = math.nan
    foreign_mean: float = math.nan
    foreign_end: float = math.nan
    mhz_start: float = math.nan
    mhz_min: float = math.nan
    mhz_max: float = math.nan
    duration_s: float = 0.0
    samples: int = 0
    steal_share: float = math.nan
    foreign_top: list = field(default_factory=list)
    verdict: str = "quiet"
    reasons: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class QuietMonitor:
    """Samples load, other processes' CPU use and CPU frequency in a background thread (``with`` block).

    ``QuietMonitor.check_start()`` raises before anything runs when the machine is loaded (unless
    ``allow_loaded``); leaving the block fills ``report`` and its verdict (see the module docstring).

    Raises:
        MachineBusy: (from ``check_start``) the 1-minute load exceeds ``max_load_per_core`` per core.
    """

    def __init__(self, *, max_load_per_core: float = MAX_LOAD_PER_CORE, max_change: float = MAX_LOAD_CHANGE,
                 allow_loaded: bool = False, interval_s: float = SAMPLE_S, start_wait_s: float = START_WAIT_S):
        self.cores = os.cpu_count() or 1
        self.max_load = max_load_per_core * self.cores
        self.max_change = max_change
        self.allow_loaded = allow_loaded
        self.interval_s = interval_s
        self.start_wait_s = start_wait_s
        self.report = QuietReport(cores=self.cores, load_start=read_loadavg())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def check_start(self) -> QuietReport:
        """Wait up to ``start_wait_s`` for the 1-minute load to fall under the limit; then refuse a loaded machine
        (``MachineBusy``), or record why the run is provisional when allowed."""
        deadline = time.monotonic() + self.start_wait_s
        load = read_loadavg()
        while math.isfinite(load[0]) and load[0] > self.max_load and time.monotonic() < deadline:
            time.sleep(2.0)
            load = read_loadavg()
        self.report.load_start = load
        load1 = load[0]
        if math.isfinite(load1) and load1 > self.max_load:
            msg = (f"1-minute load {load1:.2f} > {self.max_load:.2f} ({MAX_LOAD_PER_CORE} per core x "
                   f"{self.cores} cores) at the start")
            if not self.allow_loaded:
                raise MachineBusy(f"{msg}: timings would be noisy; stop other jobs and retry")
            self.report.verdict = "provisional"
            self.report.reasons.append(msg)
        return self.report

    def __enter__(self) -> "QuietMonitor":
        self.check_start()
        self._t0 = time.monotonic()
        self._ticks0 = read_cpu_ticks()
        self._thread = threading.Thread(target=self._run, name="dlfp-quiet-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 5)
        self._finish()

    def _run(self) -> None:
        me = os.getpid()
        prev = process_cpu_seconds()
        t_prev = time.monotonic()
        ewma = None
        series, mhz, load1 = [], [read_cpu_mhz()], [self.report.load_start[0]]
        used: dict[tuple[int, str], float] = {}
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            cur = process_cpu_seconds()
            mine = tree_of(me, cur)
            dt = max(now - t_prev, 1e-6)
            foreign = 0.0
            for pid, (_, name, cpu) in cur.items():
                if pid in mine or pid not in prev:
                    continue
                d = cpu - prev[pid][2]
                if d > 0:
                    foreign += d
                    used[(pid, name)] = used.get((pid, name), 0.0) + d
            rate = foreign / dt
            ewma = rate if ewma is None else ewma + (rate - ewma) * (1 - math.exp(-dt / FOREIGN_TAU_S))
            series.append((rate, ewma))
            mhz.append(read_cpu_mhz())
            load1.append(read_loadavg()[0])
            prev, t_prev = cur, now
        self._series, self._mhz, self._load1, self._used = series, mhz, load1, used

    def _finish(self) -> None:
        self.report.duration_s = time.monotonic() - self._t0
        self.report.load_end = read_loadavg()
        (s0, a0), (s1, a1) = getattr(self, "_ticks0", (0, 0)), read_cpu_ticks()
        if a1 > a0:
            self.report.steal_share = (s1 - s0) / (a1 - a0)
        summarize_samples(self.report, getattr(self, "_series", []), getattr(self, "_mhz", []),
                          getattr(self, "_load1", []), getattr(self, "_used", {}), self.max_change)


def summarize_samples(r: QuietReport, series, mhz, load1, used, max_change: float = MAX_LOAD_CHANGE) -> QuietReport:
    """Fill ``r`` from the samples and judge the run (see the module docstring); returns ``r``.

    Args:
        series: ``(other processes' CPU use in cores, its 60 s exponential average)`` per sample.
        mhz, load1: sampled CPU frequency (MHz) and 1-minute load average.
        used: ``{(pid, command): CPU-seconds}`` of other processes during the run.
    """
    mhz = [m for m in mhz if math.isfinite(m)]
    load1 = [v for v in load1 if math.isfinite(v)]
    r.samples = len(series)
    if load1:
        r.load1_max = max(load1)
    if series:
        rates = [a for a, _ in series]
        ew = [b for _, b in series]
        r.foreign_start, r.foreign_end, r.foreign_max = ew[0], ew[-1], max(ew)
        r.foreign_mean = sum(rates) / len(rates)
        if r.foreign_max - r.foreign_start > max_change:
            r.verdict = "provisional"
            r.reasons.append(f"other processes' load rose by {r.foreign_max - r.foreign_start:.2f} "
                             f"(> {max_change}) during the run")
    if mhz:
        r.mhz_start, r.mhz_min, r.mhz_max = mhz[0], min(mhz), max(mhz)
        if r.mhz_start > 0 and (r.mhz_max - r.mhz_min) / r.mhz_start > MAX_MHZ_CHANGE:
            r.verdict = "provisional"
            r.reasons.append(f"CPU frequency moved {r.mhz_min:.0f}-{r.mhz_max:.0f} MHz during the run")
    top = sorted(used.items(), key=lambda kv: -kv[1])[:5]
    r.foreign_top = [[name, round(cpu, 2)] for (_, name), cpu in top]
    return r


class MachineBusy(RuntimeError):
    """The machine is too loaded to time anything; the message gives the load and the limit."""


__all__ = ["FOREIGN_TAU_S", "MAX_LOAD_CHANGE", "MAX_LOAD_PER_CORE", "MAX_MHZ_CHANGE", "MachineBusy",
           "QuietMonitor", "QuietReport", "process_cpu_seconds", "read_cpu_mhz", "read_loadavg", "summarize_samples",
           "tree_of"]
