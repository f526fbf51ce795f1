"""What the measured host changes: the paper experiments on the simulator with the engine loop's host costs as
they were assumed, as measured on the real engine, and with the API server in front (the default), side by side.

Settings (``SETTINGS``), each a ``backend_options.sim`` override:

* ``assumed``: ``HostCosts`` as they were assumed before any measurement (``ASSUMED_HOST``; schedule 80 + 4 us
  per request, input preparation 150 + 3 us per request + 0.02 us per token, update 60 + 5 us per request, no
  bookkeeping or engine-loop term, ingest 200 us, token to the client 300 us) and no API server;
* ``engine loop measured``: ``HostCosts``' defaults (``dlfp calibrate`` on this project's host, and ``dlfp
  frontend``'s two transports), no API server;
* ``+ API server``: the defaults and the completions endpoint's API server (``dlfp.devices.frontend``), what the
  shipped traces use.

The sampler's measured device time (``dlfp.devices.sampler``) is in all three. Reported per experiment: the DLFP
effect on P99 ITL and P99 TTFT (mean over seeds of the paired change, ``dlfp.analysis.stats.paired_change``) and
the baseline's P99 ITL and P50 TTFT (arm means). Nothing is fitted here.

    python -m dlfp.studies.host_switch [--out data/results/device] [--jobs N]
"""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from dlfp.analysis.markdown import atomic_write, to_markdown
from dlfp.analysis.stats import paired_change
from dlfp.config import load_experiment
from dlfp.studies.model_switch import EXPERIMENTS, study_main

ASSUMED_HOST = {"schedule_base_s": 80e-6, "schedule_per_req_s": 4e-6, "prep_base_s": 150e-6, "prep_per_req_s": 3e-6,
                "prep_per_token_s": 0.02e-6, "update_base_s": 60e-6, "update_per_req_s": 5e-6,
                "bookkeeping_base_s": 0.0, "bookkeeping_per_req_s": 0.0, "engine_loop_s": 0.0,
                "ingest_s": 200e-6, "frontend_output_s": 300e-6}
SETTINGS = {"assumed": {"host": ASSUMED_HOST, "frontend": "none"},
            "engine loop measured": {"frontend": "none"},
            "+ API server": {"frontend": "completions"}}
ARMS = ("baseline", "dlfp")
COLUMNS = ["experiment", "setting", "dlfp_itl_p99_change_pct", "dlfp_ttft_p99_change_pct", "baseline_itl_p99_ms",
           "dlfp_itl_p99_ms", "baseline_ttft_p50_ms"]


def _config(experiment: str, setting: str):
    cfg = load_experiment(experiment)
    sim = {**dict(cfg.backend_options.get("sim") or {}), **SETTINGS[setting]}
    return cfg.with_overrides({"backend_options.sim": sim})


def _trial(task: tuple[str, str, str, int]) -> tuple:
    """One simulator trial: ``(experiment, setting, arm, seed, P99 ITL s, P99 TTFT s, P50 TTFT s)``."""
    from dlfp.analysis.metrics import summarize
    from dlfp.backends import run_trial

    experiment, setting, arm, seed = task
    s = summarize(run_trial(_config(experiment, setting), arm, seed, backend="sim"))
    return experiment, setting, arm, seed, float(s["itl_p99_s"]), float(s["ttft_p99_s"]), float(s["ttft_p50_s"])


def run(experiments=EXPERIMENTS, jobs: int | None = None) -> pd.DataFrame:
    """Every (experiment, setting, arm, seed) trial summary, one row each."""
    tasks = [(e, st, a, s) for e in experiments for st in SETTINGS for a in ARMS for s in load_experiment(e).seeds]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        rows = list(pool.map(_trial, tasks, chunksize=4))
    return pd.DataFrame(rows, columns=["experiment", "setting", "arm", "seed", "itl_p99_s", "ttft_p99_s",
                                       "ttft_p50_s"])


def table(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per (experiment, setting): the DLFP effects and the baseline's latencies."""
    out = []
    for (exp, setting), g in trials.groupby(["experiment", "setting"], sort=False):
        b, d = (g[g["arm"] == a].sort_values("seed") for a in ARMS)
        out.append((exp, setting, paired_change(b["itl_p99_s"], d["itl_p99_s"]).mean * 100,
                    paired_change(b["ttft_p99_s"], d["ttft_p99_s"]).mean * 100, b["itl_p99_s"].mean() * 1e3,
                    d["itl_p99_s"].mean() * 1e3, b["ttft_p50_s"].mean() * 1e3))
    return pd.DataFrame(out, columns=COLUMNS)


def write(tab: pd.DataFrame, trials: pd.DataFrame, out_dir: Path) -> None:
    """``host_switch.csv``/``.md`` and the per-trial ``host_switch_trials.csv`` (atomic writes)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "host_switch_trials.csv", trials.to_csv(index=False, float_format="%.6g"))
    atomic_write(out_dir / "host_switch.csv", tab.to_csv(index=False, float_format="%.6g"))
    shown = tab.copy()
    for c in COLUMNS[2:]:
        shown[c] = shown[c].map(lambda v: f"{v:+.1f}" if c.endswith("pct") else f"{v:.1f}")
    note = ("Simulator, seeds of each experiment. Changes are the mean over seeds of the paired change "
            "(DLFP - baseline) / baseline, in percent (negative = lower); latencies are arm means. Settings: "
            "assumed = the host costs assumed before any measurement, no API server; engine loop measured = "
            "HostCosts' measured defaults, no API server; + API server = the shipped setting (completions "
            "endpoint). Command: python -m dlfp.studies.host_switch.")
    atomic_write(out_dir / "host_switch.md", "# The measured host: engine loop and API server\n\n" + note
                 + "\n\n" + to_markdown(shown))


def main(argv: list[str] | None = None) -> int:
    return study_main(argv, "dlfp.studies.host_switch", __doc__.splitlines()[0], run, table, write, COLUMNS)


if __name__ == "__main__":
    raise SystemExit(main())
