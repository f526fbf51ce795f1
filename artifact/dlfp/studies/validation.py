"""``dlfp validate-sim``: the simulator's error against the real engine on the same workload.

For every real trial of an experiment (default ``cpu-tiny``: vLLM 0.17.1 on this CPU, traces under
``data/traces/vllm/cpu-tiny/``) the simulator runs the SAME experiment config (taken from the real
trial's metadata), arm and seed, with the calibrated profile (``gpu: cpu`` = the ``kind: fitted``
profile written by ``dlfp calibrate``), and the workload fingerprints must agree. Reported:

* relative error ``sim / real - 1`` of P50 and P99 ITL, P50 and P99 TTFT and P99 E2EL, per
  (arm, seed) and for the seed mean of each arm; targets: |error| <= 10 % for the P50
  figures, <= 20 % for the P99 figures;
* the paired DLFP effect on P99 ITL (``dlfp / baseline - 1`` per seed), real vs simulated: same
  sign (target) and size;
* an attribution table (``step_parts``): per backend and step kind (decode-only / with prefill),
  the mean scheduler cost, execute (device) time and the rest of the loop, plus the number of
  steps and prefill tokens per step, so a miss can be traced to host cost, device (attention /
  compute) cost, or queueing (different batches);
* figures: pooled ITL CDFs overlaid (real solid, sim dashed) and the DLFP cap trajectories of both.

The calibration grid (``dlfp calibrate``) and this workload are disjoint: the workload is held out.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from dlfp.analysis.markdown import atomic_write
from dlfp.analysis.metrics import itl_samples, summarize
from dlfp.paths import REPO_ROOT as REPO
from dlfp.studies.validation_hosts import (SAME_HOST_COMMAND, audit_hosts, emu_over_profile, host_line,
                                          profile_host_problem, real_host)
from dlfp.studies.validation_runs import REPLICATE_RUNS, REPLICATES, RUN_RECORD, load_replicates, run_real
from dlfp.traces.format import Trial

#: metric name -> (summarize key, |relative error| target)
METRICS: dict[str, tuple[str, float]] = {
    "itl_p50": ("itl_p50_s", 0.10),
    "itl_p99": ("itl_p99_s", 0.20),
    "ttft_p50": ("ttft_p50_s", 0.10),
    "ttft_p99": ("ttft_p99_s", 0.20),
    "e2el_p99": ("e2el_p99_s", 0.20),
}


class ValidationError(ValueError):
    """Real and simulated trials that cannot be compared (different workload, missing trials, different hosts);
    names the trial."""


def rel_error(real: float, sim: float) -> float:
    """``sim / real - 1`` (NaN when ``real`` is 0 or either is NaN)."""
    if real is None or sim is None or not (math.isfinite(real) and math.isfinite(sim)) or real == 0:
        return float("nan")
    return sim / real - 1.0


# ----------------------------------------------------------------------------------------------- trials
TrialMap = Mapping[tuple[str, int], Trial]


def load_real(root: str | Path, experiment: str, backend: str = "vllm") -> dict[tuple[str, int], Trial]:
    """Complete real trials ``{(arm, seed): Trial}`` under ``root/<backend>/<experiment>/``."""
    from dlfp.traces.format import find_trials, load_trial

    out = {}
    for p in find_trials(root, backend=backend, experiment=experiment):
        t = load_trial(p)
        out[(str(t.metadata["arm"]), int(t.metadata["seed"]))] = t
    return out


def simulate_like(real: Trial, overrides: Mapping | None = None) -> Trial:
    """Run the simulator on the real trial's own config, arm and seed.

    ``overrides`` (optional) patch the config dict (e.g. ``{"gpu": "cpu"}``).

    Raises:
        ValidationError: the simulated workload fingerprint differs from the real one.
        dlfp.config.ConfigError: the config cannot run on the simulator (e.g. no profile for its ``gpu``).
    """
    from dlfp.config import ExperimentConfig
    from dlfp.backends.sim.runner import run_trial

    cfg_d = dict(real.metadata["config"])
    cfg_d.update(overrides or {})
    cfg = ExperimentConfig.model_validate(cfg_d)
    arm, seed = str(real.metadata["arm"]), int(real.metadata["seed"])
    sim = run_trial(cfg, arm, seed)
    fr, fs = real.metadata.get("workload_fingerprint"), sim.metadata.get("workload_fingerprint")
    if fr != fs:
        raise ValidationError(f"trial {cfg.name}/{arm}/seed-{seed}: workload fingerprint differs "
                              f"(real {str(fr)[:12]}, sim {str(fs)[:12]})")
    return sim


def summaries(trials: TrialMap) -> pd.DataFrame:
    """``metrics.summarize`` of each trial, indexed by (arm, seed)."""
    rows = []
    for (arm, seed), t in sorted(trials.items()):
        s = summarize(t)
        s["arm"], s["seed"] = arm, seed
        rows.append(s)
    return pd.DataFrame(rows).set_index(["arm", "seed"]).sort_index()


def error_table(real: TrialMap, sim: TrialMap) -> pd.DataFrame:
    """Relative errors per (arm, seed) and per arm for the seed mean.

    Columns: ``arm``, ``seed`` ("mean" for the seed-mean row), then for each metric of ``METRICS``:
    ``<m>_real_s``, ``<m>_sim_s``, ``<m>_err`` (sim/real - 1), and ``<m>_ok`` (|err| <= target).

    Raises:
        ValidationError: a real trial without its simulated twin.
    """
    missing = sorted(set(real) - set(sim))
    if missing:
        raise ValidationError(f"no simulated trial for {missing}")
    sr, ss = summaries(real), summaries({k: sim[k] for k in real})
    rows = []
    for arm in sorted(set(a for a, _ in real)):
        keys = sorted(k for k in real if k[0] == arm)
        for key in keys + [None]:
            row: dict = {"arm": arm, "seed": "mean" if key is None else str(key[1])}
            for m, (col, target) in METRICS.items():
                if key is None:
                    r = float(sr.loc[keys, col].mean())
                    s = float(ss.loc[keys, col].mean())
                else:
                    r, s = float(sr.loc[key, col]), float(ss.loc[key, col])
                e = rel_error(r, s)
                row.update({f"{m}_real_s": r, f"{m}_sim_s": s, f"{m}_err": e,
                            f"{m}_ok": bool(abs(e) <= target) if math.isfinite(e) else False})
            rows.append(row)
    return pd.DataFrame(rows)


def dlfp_effect(real: TrialMap, sim: TrialMap, baseline: str = "baseline", arm: str = "dlfp",
                metric: str = "itl_p99_s") -> pd.DataFrame:
    """Paired DLFP effect on ``metric`` (``arm / baseline - 1`` per seed), real vs simulated.

    Columns: ``seed`` (and a "mean" row), ``real_change``, ``sim_change``, ``same_sign``,
    ``size_error`` (sim change - real change, in fraction points). Seeds where either backend
    lacks one of the two arms are skipped.
    """
    rows = []
    seeds = sorted({s for a, s in real if a == baseline} & {s for a, s in real if a == arm})
    for s in seeds:
        if (baseline, s) not in sim or (arm, s) not in sim:
            continue
        rc = summarize(real[(arm, s)])[metric] / summarize(real[(baseline, s)])[metric] - 1
        sc = summarize(sim[(arm, s)])[metric] / summarize(sim[(baseline, s)])[metric] - 1
        rows.append({"seed": str(s), "real_change": rc, "sim_change": sc})
    df = pd.DataFrame(rows, columns=["seed", "real_change", "sim_change"])
    if len(df):
        df.loc[len(df)] = {"seed": "mean", "real_change": df["real_change"].mean(),
                           "sim_change": df["sim_change"].mean()}
    df["same_sign"] = np.sign(df["real_change"]) == np.sign(df["sim_change"])
    df["size_error"] = df["sim_change"] - df["real_change"]
    return df


def step_parts(trials: TrialMap, backend: str) -> pd.DataFrame:
    """Where an engine step's time goes, per arm and step kind, pooled over seeds (seconds, means).

    Step kinds: ``decode`` (no prefill tokens) and ``prefill`` (with prefill tokens, mixed or not).
    Columns: ``backend``, ``arm``, ``kind``, ``steps`` (per trial, mean), ``prefill_tokens`` (per step),
    ``num_decodes`` (per step), ``schedule_s`` (``issue_s - schedule_s``), ``execute_s``
    (``device_end_s - issue_s``: input preparation + device), ``rest_s`` (``host_interval_s``
    minus both: output processing and the engine loop), ``interval_s`` (``host_interval_s``).
    Iterations whose host interval spans an idle engine (> 5 x the median of their kind) are left out
    of the time columns. The ``steps`` and ``prefill_tokens`` columns show WHY a controller changes TTFT: a
    capped prefill takes more, smaller steps.
    """
    frames = []
    for (arm, _seed), t in trials.items():
        it = t.iterations.copy()
        it["arm"] = arm
        it["kind"] = np.where(it["prefill_tokens"] > 0, "prefill", "decode")
        it["schedule"] = it["issue_s"] - it["schedule_s"]
        it["execute"] = it["device_end_s"] - it["issue_s"]
        it["rest"] = it["host_interval_s"] - (it["device_end_s"] - it["schedule_s"])
        frames.append(it)
    if not frames:
        return pd.DataFrame()
    it = pd.concat(frames, ignore_index=True)
    n_trials = {a: sum(1 for (x, _) in trials if x == a) for a in {a for a, _ in trials}}
    rows = []
    for (arm, kind), g in it.groupby(["arm", "kind"]):
        med = g["host_interval_s"].median()
        busy = g[g["host_interval_s"] <= 5 * med]
        rows.append({"backend": backend, "arm": arm, "kind": kind, "steps": len(g) / n_trials[arm],
                     "prefill_tokens": g["prefill_tokens"].mean(), "num_decodes": g["num_decodes"].mean(),
                     "schedule_s": busy["schedule"].mean(), "execute_s": busy["execute"].mean(),
                     "rest_s": busy["rest"].mean(), "interval_s": busy["host_interval_s"].mean()})
    return pd.DataFrame(rows)


def attribution(real: TrialMap, sim: TrialMap) -> pd.DataFrame:
    """``step_parts`` of both backends side by side, per arm and kind, with ``sim/real - 1`` of each part."""
    a, b = step_parts(real, "real"), step_parts({k: sim[k] for k in real if k in sim}, "sim")
    if a.empty or b.empty:
        return pd.DataFrame()
    m = a.merge(b, on=["arm", "kind"], suffixes=("_real", "_sim"))
    for c in ("steps", "prefill_tokens", "num_decodes", "schedule_s", "execute_s", "rest_s", "interval_s"):
        m[f"{c}_err"] = m[f"{c}_sim"] / m[f"{c}_real"] - 1
    return m.drop(columns=["backend_real", "backend_sim"])


def decode_step_fit(trials: TrialMap) -> dict[str, float]:
    """Least-squares line of decode-only execute time (s) vs batch size: ``{"intercept_s", "per_seq_s", "n"}``."""
    xs, ys = [], []
    for t in trials.values():
        it = t.iterations
        d = it[it["prefill_tokens"] == 0]
        xs.append(d["num_decodes"].to_numpy(float))
        ys.append((d["device_end_s"] - d["issue_s"]).to_numpy(float))
    x, y = np.concatenate(xs) if xs else np.zeros(0), np.concatenate(ys) if ys else np.zeros(0)
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 2 or np.ptp(x) == 0:
        return {"intercept_s": float(np.mean(y)) if len(y) else math.nan, "per_seq_s": math.nan, "n": len(x)}
    b, a = np.polyfit(x, y, 1)
    return {"intercept_s": float(a), "per_seq_s": float(b), "n": int(len(x))}


# ----------------------------------------------------------------------------------------------- figures
def itl_cdf_overlay_figure(real: TrialMap, sim: TrialMap):
    """Pooled ITL CDFs (all seeds) per arm: real solid, simulated dashed; x in ms (log). Returns the Figure."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    arms = sorted({a for a, _ in real} | {a for a, _ in sim})
    colors = dict(zip(arms, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for src, trials, ls in (("real", real, "-"), ("sim", sim, "--")):
        for arm in arms:
            x = [itl_samples(t) for (a, _), t in trials.items() if a == arm]
            if not x:
                continue
            v = np.sort(np.concatenate(x)) * 1e3
            if v.size == 0:
                continue
            ax.plot(v, np.arange(1, v.size + 1) / v.size, ls, color=colors[arm], label=f"{arm} ({src})")
    ax.set(xscale="log", xlabel="ITL (ms)", ylabel="CDF", title="ITL: real engine (solid) vs simulator (dashed)")
    ax.axhline(0.99, color="grey", lw=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def cap_trajectories(real: TrialMap, sim: TrialMap, arm: str = "dlfp") -> pd.DataFrame:
    """Cap after each guarded iteration: ``backend``, ``seed``, ``time_s``, ``cap_after``, ``observed_interval_s``."""
    rows = []
    for src, trials in (("real", real), ("sim", sim)):
        for (a, s), t in sorted(trials.items()):
            if a != arm:
                continue
            it = t.iterations
            g = it[it["guarded"].astype(bool)]
            rows.append(pd.DataFrame({"backend": src, "seed": s, "time_s": g["schedule_s"].to_numpy(float),
                                      "cap_after": g["cap_after"].astype("float").to_numpy(),
                                      "observed_interval_s": g["observed_interval_s"].to_numpy(float)}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(
        columns=["backend", "seed", "time_s", "cap_after", "observed_interval_s"])


def cap_trajectory_overlay_figure(real: TrialMap, sim: TrialMap, arm: str = "dlfp"):
    """Cap after each guarded iteration vs time, one panel per seed, real solid vs sim dashed. Returns the Figure."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    df = cap_trajectories(real, sim, arm)
    seeds = sorted(df["seed"].unique()) if len(df) else []
    fig, axes = plt.subplots(1, max(1, len(seeds)), figsize=(4 * max(1, len(seeds)), 3.2), squeeze=False)
    for ax, s in zip(axes[0], seeds):
        for src, ls in (("real", "-"), ("sim", "--")):
            g = df[(df["seed"] == s) & (df["backend"] == src)]
            ax.step(g["time_s"], g["cap_after"], ls, where="post", label=f"{src} ({len(g)} updates)")
        ax.set(title=f"{arm}, seed {s}", xlabel="time (s)", ylabel="prefill cap (tokens)")
        ax.legend(fontsize=8)
    if not seeds:
        axes[0][0].text(0.5, 0.5, f"no {arm} trials", ha="center", va="center", transform=axes[0][0].transAxes)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------- report
def _backend_arg(text: str) -> str:
    """``--backend``: a registered backend name (``dlfp.backends.BACKENDS``)."""
    from dlfp.backends import BACKENDS

    if text not in BACKENDS:
        raise argparse.ArgumentTypeError(f"unknown backend {text!r}; known: {', '.join(BACKENDS)}")
    return text


def _seeds_arg(text: str) -> list[int]:
    """``--seeds``: comma-separated non-negative integers."""
    try:
        seeds = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if any(x < 0 for x in seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: seeds are non-negative integers")
    return seeds


#: the validation workloads: real-engine experiments on this CPU (the calibration grid never saw them)
VALIDATION_EXPERIMENTS = ("cpu-tiny", "cpu-tiny-r0.25", "cpu-tiny-long-prompt")
#: where the replicate trials (run-to-run noise) of the real engine are kept, under the default output directory
REPLICATE_DIR = "replicates"
#: the default fidelity directory: tables, figures, the replicate trials and the real runs' machine record
FIDELITY_DIR = REPO / "data" / "results" / "fidelity"


def _experiments_arg(text: str) -> list[str]:
    """``--experiments``: comma-separated experiment names."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated experiment names")
    return names


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dlfp validate-sim", description=__doc__.split("\n")[0])
    ap.add_argument("--experiments", default=list(VALIDATION_EXPERIMENTS), type=_experiments_arg,
                    help=f"comma-separated validation workloads (default {','.join(VALIDATION_EXPERIMENTS)})")
    ap.add_argument("--experiment", default=None, help="one validation workload (same as --experiments NAME)")
    ap.add_argument("--traces", default=str(REPO / "data" / "traces"), help="trace root with <backend>/<experiment>/")
    ap.add_argument("--backend", default="vllm", type=_backend_arg, help="backend of the real traces (default vllm)")
    ap.add_argument("--out", default=str(FIDELITY_DIR), help="output directory")
    ap.add_argument("--replicates", default=str(FIDELITY_DIR / REPLICATE_DIR),
                    help="folder of the replicate real-engine runs, one numbered trace root per run (the run-to-run "
                         "noise)")
    ap.add_argument("--run-real", action="store_true",
                    help="run missing real trials (and the replicates) on the vLLM engine first (needs vllm 0.17.1), "
                         "each on a quiet machine")
    ap.add_argument("--allow-loaded", action="store_true",
                    help="with --run-real: run on a loaded machine (recorded as provisional in real_runs.jsonl)")
    ap.add_argument("--gpu", default=None, help="simulate with this hardware key instead of the config's")
    ap.add_argument("--seeds", default=None, type=_seeds_arg,
                    help="comma-separated seeds to use (default: all found / configured)")
    return ap


def _real_and_simulated(a: argparse.Namespace, experiment: str) -> tuple[dict[tuple[str, int], Trial],
                                                                          dict[tuple[str, int], Trial]]:
    """The real trials of ``experiment`` selected by the arguments and their simulated twins.

    Raises:
        ValidationError: no real traces, or a workload fingerprint differs.
        dlfp.config.ConfigError: unknown experiment, or a config the simulator cannot run.
    """
    seeds = a.seeds
    real = load_real(a.traces, experiment, a.backend)
    if seeds is not None:
        real = {k: v for k, v in real.items() if k[1] in seeds}
    if not real:
        raise ValidationError(f"no {a.backend} traces of {experiment!r} under {a.traces} "
                              f"(run `dlfp run {experiment} --backend vllm` or pass --run-real)")
    over = {"gpu": a.gpu} if a.gpu else None
    host = real_host(experiment, real, load_replicates(a.replicates, experiment, a.backend, real))
    gpu_key = a.gpu or next(iter(real.values())).metadata.get("config", {}).get("gpu")
    refusal, note = profile_host_problem(experiment, str(gpu_key), host) if gpu_key else (None, None)
    if refusal is not None:
        raise ValidationError(refusal)
    if note is not None:
        print(f"dlfp validate-sim: note: {note}", file=sys.stderr)
    return real, {k: simulate_like(t, over) for k, t in real.items()}


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    """``df`` as CSV at ``path``, atomically (``dlfp.analysis.markdown.atomic_write``)."""
    atomic_write(path, df.to_csv(index=False))


def _write_outputs(results: dict[str, dict], out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write the tables (CSV, Markdown) and the figures of the first workload under ``out``; print the audit.

    ``results``: ``{experiment: {"real", "sim", "replicates", "emu"}}`` (trial maps; the last two may be empty).
    Returns the audit tables ``(errors, effects)``.
    """
    from dlfp.analysis.figures import atomic_savefig
    from dlfp.studies import validation_audit as va

    out.mkdir(parents=True, exist_ok=True)
    errs, audits, effs, atts, noises, tws = [], [], [], [], [], []
    for exp, r in results.items():
        real, sim, rep, emu = r["real"], r["sim"], r["replicates"], r["emu"]
        e = error_table(real, sim)
        errs.append(e.assign(experiment=exp)[["experiment", *e.columns]])
        mn, en = va.metric_noise(real, rep), va.effect_noise(real, rep)
        noises.append({"experiment": exp, "replicates": sum(len([k for k in run if k in real]) for run in rep),
                       **{f"{m}_noise": v for m, v in mn.items()},
                       **{f"{m}_effect_noise_pp": v for m, v in en.items()}})
        audits.append(va.audit_errors(exp, real, sim, mn, errors=e))
        effs.append(va.audit_effects(exp, real, sim, en))
        att = attribution(real, sim)
        if len(att):
            att.insert(0, "experiment", exp)
            atts.append(att)
        if emu:
            tws.append(va.three_way(real, emu, sim, exp))
    err, aud, eff = pd.concat(errs, ignore_index=True), pd.concat(audits, ignore_index=True), \
        pd.concat(effs, ignore_index=True)
    _write_csv(err, out / "errors.csv")
    _write_csv(aud, out / "audit_errors.csv")
    _write_csv(eff, out / "effects.csv")
    _write_csv(pd.DataFrame(noises), out / "noise.csv")
    if atts:
        _write_csv(pd.concat(atts, ignore_index=True), out / "attribution.csv")
    md = va.audit_markdown(aud, eff)
    if tws:
        tw = pd.concat(tws, ignore_index=True)
        _write_csv(tw, out / "three_way.csv")
        md += "\n\nReal engine, emulator (vLLM's real loop over the fitted CPU device) and simulator:\n\n" + \
            va.three_way_markdown(tw)
    hosts = audit_hosts(results)
    atomic_write(out / "hosts.json", json.dumps(hosts, indent=1, sort_keys=True) + "\n")
    line = host_line(hosts)
    if line:
        md = f"{line}\n\n{md}"
    atomic_write(out / "fidelity.md", md + "\n")
    first = next(iter(results))
    real, sim = results[first]["real"], results[first]["sim"]
    _write_csv(cap_trajectories(real, sim), out / "cap_trajectories.csv")
    atomic_savefig(itl_cdf_overlay_figure(real, sim), out / "itl_cdf_overlay.png", "png", dpi=120)
    atomic_savefig(cap_trajectory_overlay_figure(real, sim), out / "cap_trajectories.png", "png", dpi=120)
    print(md)
    return aud, eff


def main_validate(argv: Sequence[str] | None = None) -> int:
    """``dlfp validate-sim``: the simulator against the real engine on every validation workload.

    Writes the tables and figures and prints the audit. Returns the exit status: 0 every target met within the
    run-to-run noise, 1 a target missed by more than the noise (each named on stderr), 2 bad input (no real
    traces, missing profile, fingerprint mismatch, unknown experiment).
    """
    a = _parser().parse_args(list(argv) if argv is not None else None)
    from dlfp.config import ConfigError, load_experiment
    from dlfp.studies.calibration.quiet import MachineBusy

    experiments = [a.experiment] if a.experiment else list(a.experiments)
    out = Path(a.out)
    results: dict[str, dict] = {}
    try:
        for exp in experiments:
            load_experiment(exp)  # an unknown experiment is named (with the known ones) before anything runs
        for exp in experiments:
            if a.run_real:
                run_real(exp, a.traces, a.seeds, record=out / RUN_RECORD, replicate_root_dir=a.replicates,
                          allow_loaded=a.allow_loaded)
            real, sim = _real_and_simulated(a, exp)
            rep = load_replicates(a.replicates, exp, a.backend, real)
            gpu_key = a.gpu or next(iter(real.values())).metadata.get("config", {}).get("gpu")
            emu, stale = emu_over_profile({k: v for k, v in load_real(a.traces, exp, "emu").items() if k in real},
                                          str(gpu_key))
            if stale:
                print(f"dlfp validate-sim: note: {exp}: {stale} emulator trials ran over another CPU profile and are "
                      f"left out (`dlfp run {exp} --backend emu --force` reruns them)", file=sys.stderr)
            results[exp] = {"real": real, "sim": sim, "replicates": rep, "emu": emu,
                            "host": real_host(exp, real, rep), "gpu": gpu_key}
    except (ValidationError, ConfigError, MachineBusy) as e:
        print(f"dlfp validate-sim: {e}", file=sys.stderr)
        return 2
    aud, eff = _write_outputs(results, out)
    print(f"wrote {out}")
    missed = [f"{r.experiment}/{r.arm} {r.metric}: {r.error * 100:+.1f} % (target {r.target * 100:.0f} %, noise "
              f"{r.noise * 100:.1f} %)" for r in aud.itertuples() if r.beyond_noise]
    missed += [f"{r.experiment}/{r.arm} effect on {r.metric}, seed {r.seed}: sim - real {r.diff_pp:+.1f} pp "
               f"(target {r.target_pp:.0f} pp, noise {r.noise_pp:.1f} pp)" for r in eff.itertuples()
               if r.beyond_noise and r.seed != "mean"]
    for m in missed:
        print(f"dlfp validate-sim: target missed beyond noise: {m}", file=sys.stderr)
    return 1 if missed else 0


__all__ = ["METRICS", "ValidationError", "attribution", "cap_trajectories", "cap_trajectory_overlay_figure",
           "decode_step_fit", "dlfp_effect", "error_table", "itl_cdf_overlay_figure", "audit_hosts", "host_line",
           "load_real", "load_replicates", "main_validate", "profile_host_problem", "real_host", "rel_error",
           "simulate_like", "step_parts", "summaries", "REPLICATE_RUNS", "REPLICATES", "SAME_HOST_COMMAND",
           "VALIDATION_EXPERIMENTS"]

if __name__ == "__main__":
    raise SystemExit(main_validate())
