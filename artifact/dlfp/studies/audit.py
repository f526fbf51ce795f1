"""``dlfp audit``: the simulator against the real engine, every part measured on this host, from one command.

The steps, each kept when it is already done on this host (so an interrupted audit resumes):

1. **CPU profile** (``dlfp calibrate``): fitted again unless ``hardware/cpu-calibrated.yaml`` was fitted on this
   host (its ``machine.host_key`` equals this host's key, ``dlfp.hostinfo``, with the engine's thread pinning of
   ``dlfp.backends.vllm.runner.pin_cpu_threads`` applied) or ``--recalibrate`` is given;
2. **real-engine trials** of every validation workload (``dlfp.studies.validation.VALIDATION_EXPERIMENTS``): each
   (arm, seed) that is missing or was recorded on another host runs on vLLM 0.17.1
   (``dlfp.studies.validation_runs.run_real``);
3. **replicates**: each pair of ``REPLICATES`` runs ``--replicate-runs`` more times (default ``REPLICATE_RUNS``),
   the run-to-run noise;
4. **emulator** (``--emu``): the emulator traces of the workloads rerun over the new profile (the three-way table
   of real engine, emulator and simulator; without it, emulator traces over another profile are left out);
5. **the audit** (``dlfp validate-sim``): the simulator on the same workloads, every error against its target and
   the noise, written to ``data/results/fidelity/`` with the host named.

Every real-engine trial runs on a quiet machine (``dlfp.studies.calibration.quiet``; ``--allow-loaded`` runs
anyway and marks it). ``audit_run.json`` in the output folder records the host and each step's wall time
(seconds). Exit status: 0 every target met or within noise, 1 a target missed beyond noise (named on stderr),
2 bad input or a machine that is not quiet (one line), 130 interrupted (what finished is kept).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from dlfp.studies.validation import FIDELITY_DIR, REPLICATE_DIR, VALIDATION_EXPERIMENTS, _experiments_arg
from dlfp.studies.validation_runs import REPLICATE_RUNS, RUN_RECORD


def _parser() -> argparse.ArgumentParser:
    from dlfp.paths import REPO_ROOT

    ap = argparse.ArgumentParser(prog="dlfp audit", description=__doc__.split("\n")[0])
    ap.add_argument("--experiments", default=list(VALIDATION_EXPERIMENTS), type=_experiments_arg,
                    help=f"comma-separated validation workloads (default {','.join(VALIDATION_EXPERIMENTS)})")
    ap.add_argument("--replicate-runs", type=int, default=REPLICATE_RUNS,
                    help=f"extra runs of each replicated (arm, seed) pair (default {REPLICATE_RUNS}; at least 1)")
    ap.add_argument("--recalibrate", action="store_true", help="fit the CPU profile again even if it is this host's")
    ap.add_argument("--emu", action="store_true",
                    help="also rerun the emulator traces of the workloads over the new profile (three-way table)")
    ap.add_argument("--allow-loaded", action="store_true",
                    help="run on a loaded machine anyway (each run is recorded as provisional)")
    ap.add_argument("--traces", default=str(REPO_ROOT / "data" / "traces"), help="trace root of the real-engine trials")
    ap.add_argument("--out", default=str(FIDELITY_DIR), help="output folder of the audit")
    return ap


def this_host_key() -> str:
    """This host's key as the real engine's trials record it: the engine's thread pinning applied first."""
    from dlfp.backends.vllm.runner import pin_cpu_threads
    from dlfp.hostinfo import identity_record

    pin_cpu_threads()
    return identity_record()["host_key"]


def profile_host_key(key: str = "cpu") -> str | None:
    """The ``host_key`` of the fitted CPU profile ``key`` (None when there is none, or it predates host keys)."""
    from dlfp.devices import roofline as cm
    from dlfp.hostinfo import record_key

    try:
        spec = cm.load_gpu(key)
    except Exception:  # no profile shipped, or an unreadable one: it is fitted again
        return None
    return record_key(spec.machine)


def _step(name: str, steps: dict, fn) -> int:
    """Run ``fn()`` (returns an exit status), record its wall time (s) in ``steps[name]`` and print it."""
    t0 = time.monotonic()
    status = fn()
    steps[name] = round(time.monotonic() - t0, 1)
    print(f"dlfp audit: {name}: {steps[name]:.0f} s", file=sys.stderr, flush=True)
    return status


def _calibrate(a: argparse.Namespace, key: str) -> int:
    """Step 1: fit the CPU profile unless it is this host's already; the exit status of ``dlfp calibrate``."""
    from dlfp.studies.calibration import main_calibrate

    if not a.recalibrate and profile_host_key() == key:
        print("dlfp audit: CPU profile fitted on this host already; kept (--recalibrate fits it again)",
              file=sys.stderr)
        return 0
    return main_calibrate(["--allow-loaded"] if a.allow_loaded else [])


def _real(a: argparse.Namespace, key: str) -> int:
    """Steps 2-3: the real-engine trials and replicates missing on this host; 0, or 2 on a busy machine."""
    from dlfp.studies.calibration.quiet import MachineBusy
    from dlfp.studies.validation_runs import run_real

    out = Path(a.out)
    try:
        for exp in a.experiments:
            n = run_real(exp, a.traces, record=out / RUN_RECORD, replicate_root_dir=out / REPLICATE_DIR,
                         allow_loaded=a.allow_loaded, host_key=key, replicate_runs=a.replicate_runs)
            print(f"dlfp audit: {exp}: {n} real-engine trials run on this host", file=sys.stderr, flush=True)
    except MachineBusy as e:
        print(f"dlfp audit: {e}", file=sys.stderr)
        return 2
    return 0


def _emu(a: argparse.Namespace) -> int:
    """Step 4: the emulator traces of every workload, rerun over the current profile."""
    from dlfp.cli import main as dlfp_main

    for exp in a.experiments:
        status = dlfp_main(["run", exp, "--backend", "emu", "--force", "--out", a.traces, "--no-progress"])
        if status:
            return status
    return 0


def main_audit(argv: Sequence[str] | None = None) -> int:
    """``dlfp audit`` (see the module docstring); returns the exit status."""
    a = _parser().parse_args(list(argv) if argv is not None else None)
    if a.replicate_runs < 1:
        print(f"dlfp audit: --replicate-runs {a.replicate_runs}: at least 1 replicate run is needed for the noise",
              file=sys.stderr)
        return 2
    from dlfp.backends import BackendUnavailable
    from dlfp.backends.vllm.runner import require_vllm
    from dlfp.config import ConfigError, load_experiment
    from dlfp.hostinfo import host_label, identity_record
    from dlfp.studies.validation import main_validate

    try:
        for exp in a.experiments:
            load_experiment(exp)
        require_vllm()
    except (BackendUnavailable, ConfigError) as e:
        print(f"dlfp audit: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    t0, steps = time.monotonic(), {}
    key = this_host_key()
    status = _step("CPU profile", steps, lambda: _calibrate(a, key))
    key = this_host_key()  # the same, unless fitting changed this process's thread settings
    if not status:
        status = _step("real-engine trials and replicates", steps, lambda: _real(a, key))
    if not status and a.emu:
        status = _step("emulator traces", steps, lambda: _emu(a))
    if status:
        return status
    args = ["--experiments", ",".join(a.experiments), "--traces", a.traces, "--out", a.out,
            "--replicates", str(Path(a.out) / REPLICATE_DIR)]
    status = _step("simulator and audit", steps, lambda: main_validate(args))
    record = {"host": host_label(identity_record()), "host_key": key, "experiments": list(a.experiments),
              "replicate_runs": a.replicate_runs, "steps_s": steps, "total_s": round(time.monotonic() - t0, 1)}
    from dlfp.analysis.markdown import atomic_write

    atomic_write(Path(a.out) / "audit_run.json", json.dumps(record, indent=1) + "\n")
    print(f"dlfp audit: done in {record['total_s'] / 60:.1f} min on {record['host']}", file=sys.stderr)
    return status


__all__ = ["main_audit", "profile_host_key", "this_host_key"]

if __name__ == "__main__":
    raise SystemExit(main_audit())
