"""``dlfp calibrate``: fit a measured cost profile of the real vLLM engine on this machine.

Runs the calibration grid on the real engine (or refits saved measurements), writes the profile YAML,
the raw measurements and the residual figure, and prints the coefficient table and fit quality.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Sequence

from dlfp.paths import REPO_ROOT
from dlfp.studies.calibration.features import CalibrationError
from dlfp.studies.calibration.grid import default_grid, run_grid
from dlfp.studies.calibration.measurements import load_measurements, save_measurements
from dlfp.studies.calibration.profile import DEFAULT_KEY, DEFAULT_PROFILE, calibrate, machine_description, \
    write_profile
from dlfp.studies.calibration.report import coefficient_table, cost_form_markdown, residual_figure

#: default directory of the raw measurements and the residual figure
DEFAULT_MEASUREMENTS = REPO_ROOT / "data" / "results" / "calibration"
#: the cost form and fit quality of the profile, Markdown, beside the measurements (REPRODUCE.md quotes it)
COST_FORM = "cost_form.md"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dlfp calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("--experiment", default="cpu-tiny", help="engine settings from this experiment (default cpu-tiny)")
    ap.add_argument("--out", default=str(DEFAULT_PROFILE), help="profile YAML to write")
    ap.add_argument("--key", default=DEFAULT_KEY, help="profile key (the config's `gpu`)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="grid repeats (default 3): each phase's step time gets a 95 %% confidence interval")
    ap.add_argument("--quick", action="store_true", help="small grid (development)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measurements", default=None,
                    help="directory to save raw measurements (steps.csv, tokens.csv, meta.json); "
                         "default data/results/calibration")
    ap.add_argument("--refit", default=None, help="refit from a saved measurements directory (no engine run)")
    ap.add_argument("--figure", default=None, help="write the residual figure here (png/pdf)")
    ap.add_argument("--max-load", type=float, default=None,
                    help="refuse to run when the 1-minute load average exceeds this (default 0.5 per core)")
    ap.add_argument("--allow-loaded", action="store_true",
                    help="run on a loaded machine anyway; the profile is then marked provisional")
    return ap


def _measure(a: argparse.Namespace, mdir: Path) -> tuple[dict, dict]:
    """``(measurements, machine description)``: loaded from ``--refit``, or measured and saved under ``mdir``.

    Raises:
        CalibrationError: the load average is above ``--max-load``, or the measurements are unusable.
        BackendUnavailable: vLLM missing.
    """
    if a.refit:
        meas = load_measurements(a.refit)
        return meas, meas.get("machine") or machine_description()
    from dlfp.studies.calibration.quiet import MAX_LOAD_PER_CORE, MachineBusy, QuietMonitor

    per_core = MAX_LOAD_PER_CORE if a.max_load is None else a.max_load / (os.cpu_count() or 1)
    mon = QuietMonitor(max_load_per_core=per_core, allow_loaded=a.allow_loaded)
    try:
        with mon:
            meas = run_grid(default_grid(quick=a.quick), experiment=a.experiment, repeats=a.repeats, seed=a.seed)
    except MachineBusy as e:
        raise CalibrationError(str(e)) from None
    machine = machine_description()
    machine["loadavg_at_start"] = list(mon.report.load_start)
    machine["quiet"] = mon.report.as_dict()
    meas["machine"] = machine
    save_measurements(meas, mdir)
    r = mon.report
    print(f"machine: {r.verdict}; 1-minute load {r.load_start[0]:.2f} at the start, {r.load_end[0]:.2f} at the end; "
          f"other processes {r.foreign_mean:.2f} cores on average (max {r.foreign_max:.2f} smoothed); "
          f"CPU {r.mhz_min:.0f}-{r.mhz_max:.0f} MHz" + (f"; {'; '.join(r.reasons)}" if r.reasons else ""),
          file=sys.stderr)
    return meas, machine


def _bad_input_status(e: Exception, a: argparse.Namespace) -> int | None:
    """Print the one-line message of a bad-input error and return 2; None for an error that is not bad input."""
    from dlfp.backends import BackendUnavailable
    from dlfp.config import ConfigError

    if isinstance(e, (BackendUnavailable, CalibrationError)):
        print(f"dlfp calibrate: {e}", file=sys.stderr)
        return 2
    if isinstance(e, ConfigError):
        print(f"dlfp calibrate: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    if not a.refit:
        return None
    # garbage in a saved measurements directory (a missing column, an unparsable cell): one line, exit 2
    detail = (str(e).splitlines() or [""])[0]
    print(f"dlfp calibrate: --refit {a.refit}: not valid saved measurements "
          f"(steps.csv, tokens.csv, meta.json): {type(e).__name__}: {detail}", file=sys.stderr)
    return 2


def main_calibrate(argv: Sequence[str] | None = None) -> int:
    """``dlfp calibrate``: run the grid on the real engine (or refit a saved measurement) and write the profile.

    Returns the exit status (0 ok, 2 bad input / vLLM missing).
    """
    a = _parser().parse_args(list(argv) if argv is not None else None)
    from dlfp.backends import BackendUnavailable
    from dlfp.config import load_experiment

    mdir = Path(a.measurements) if a.measurements else DEFAULT_MEASUREMENTS
    try:
        meas, machine = _measure(a, mdir)
        model = load_experiment(a.experiment).model
        prof, _, steps = calibrate(meas, model=model, machine=machine)
        path = write_profile(prof, a.out, a.key)
    except (BackendUnavailable, CalibrationError, KeyError, ValueError, TypeError, IndexError) as e:
        status = _bad_input_status(e, a)
        if status is None:
            raise
        return status
    from dlfp.studies.calibration.profile import phase_table

    if not a.refit or Path(a.refit).resolve() == mdir.resolve():
        from dlfp.analysis.markdown import atomic_write

        atomic_write(mdir / "phases.csv",
                     phase_table(steps, prof["fit"]["grid"], prof["fit"]["grid"]["fit_target"]).to_csv(index=False))
        if "part_medians_s" in prof["fit"]["grid"]:
            atomic_write(mdir / COST_FORM, cost_form_markdown(prof))
    figpath = Path(a.figure) if a.figure else mdir / "residuals.png"
    figpath.parent.mkdir(parents=True, exist_ok=True)
    residual_figure(steps).savefig(figpath, dpi=120)
    print(coefficient_table(prof).to_string(index=False))
    print(f"in-sample: {json.dumps(prof['fit']['in_sample'])}")
    print(f"held-out:  {json.dumps(prof['fit']['held_out'])}")
    if "whole_step" in prof["fit"]["grid"]:
        print(f"whole step (prep + device + bookkeeping), held-out: "
              f"{json.dumps(prof['fit']['grid']['whole_step']['held_out'])}")
    if prof["fit"].get("provisional"):
        print("profile marked provisional: the machine was not quiet (see machine.quiet in the profile)")
    print(f"wrote {path} and {figpath}")
    return 0
