"""The audit of ``dlfp validate-sim``: every error against its target, beside the real engine's run-to-run noise.

Per validation workload (an experiment with real-engine traces), per arm:

* ``audit_errors``: the seed-mean relative error ``sim / real - 1`` of each metric of
  ``dlfp.studies.validation.METRICS`` (targets: 10 % for P50 ITL and TTFT, 20 % for P99 ITL, TTFT, E2EL);
* ``audit_effects``: the paired effect of each controller arm against the baseline (``arm / baseline - 1``),
  per seed, on P99 ITL and P99 TTFT, real against simulated; target: within ``EFFECT_TARGET_PP`` (10)
  percentage points.

The run-to-run noise comes from replicate trials: the same (experiment, arm, seed) run again on the real engine
(``dlfp.studies.validation_runs.REPLICATES``, ``REPLICATE_RUNS`` more times each). The noise of a metric is the
largest ``|replicate / original - 1|`` over every replicate run of the replicated arms of that workload; the
noise of an effect is the larger of the change of the effect when both arms are replaced by the replicates of
one run and the metric's own noise (in points; see ``effect_noise``). A target is MISSED when the error
exceeds it; it is missed BEYOND NOISE when the error exceeds target + noise. ``dlfp validate-sim`` exits 1
when any target is missed beyond noise.

Inputs are ``{(arm, seed): Trial}`` maps; outputs are DataFrames (fractions, seconds).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from dlfp.analysis.metrics import summarize
from dlfp.traces.format import Trial

#: the effect target: simulated and real paired change within this many percentage points, per seed
EFFECT_TARGET_PP = 10.0
#: metrics of the effect target (summarize keys)
EFFECT_METRICS = {"itl_p99": "itl_p99_s", "ttft_p99": "ttft_p99_s"}

TrialMap = Mapping[tuple[str, int], Trial]
#: replicate trials: one map per replicate run, or a single map (one run)
Replicates = TrialMap | Sequence[TrialMap]


def replicate_runs(replicates: Replicates) -> list[TrialMap]:
    """The replicate runs as a list of ``{(arm, seed): Trial}`` maps (a single map is one run)."""
    return [replicates] if isinstance(replicates, Mapping) else list(replicates)


def _summ(trials: TrialMap) -> dict[tuple[str, int], dict]:
    return {k: summarize(t) for k, t in trials.items()}


def metric_noise(real: TrialMap, replicates: Replicates) -> dict[str, float]:
    """``{metric: largest |replicate / original - 1|}`` over every replicate run of the replicated (arm, seed)
    pairs; NaN without any. Metrics: those of ``dlfp.studies.validation.METRICS``."""
    from dlfp.studies.validation import METRICS, rel_error

    out = {}
    runs = [{k: t for k, t in run.items() if k in real} for run in replicate_runs(replicates)]
    sr = _summ({k: real[k] for run in runs for k in run})
    sps = [_summ(run) for run in runs]
    for m, (col, _) in METRICS.items():
        vals = [abs(rel_error(sr[k][col], sp[k][col])) for sp in sps for k in sp]
        vals = [v for v in vals if math.isfinite(v)]
        out[m] = max(vals) if vals else math.nan
    return out


def effect_noise(real: TrialMap, replicates: Replicates, baseline: str = "baseline") -> dict[str, float]:
    """``{metric: run-to-run noise of a paired effect on it}`` in percentage points; NaN without replicates.

    The larger of: (a) the change of an effect when both of its arms are replaced by their replicates of one run
    (``|effect(replicates) - effect(originals)|``, over every replicate run and every replicated arm whose
    baseline of the same seed is replicated in that run too), and (b) the metric's own noise,
    ``|replicate / original - 1|`` of any replicated arm: an effect compares two runs, each carrying that noise,
    so a controller that leaves the cap alone shows an effect of that size on the real engine and of 0 on the
    deterministic simulator.
    """
    out = {}
    runs = replicate_runs(replicates)
    for m, col in EFFECT_METRICS.items():
        vals = []
        for run in runs:
            pairs = [(a, s) for a, s in run if a != baseline and (baseline, s) in run
                     and (a, s) in real and (baseline, s) in real]
            for a, s in pairs:
                e0 = summarize(real[(a, s)])[col] / summarize(real[(baseline, s)])[col] - 1
                e1 = summarize(run[(a, s)])[col] / summarize(run[(baseline, s)])[col] - 1
                vals.append(abs(e1 - e0) * 100)
            for k in [k for k in run if k in real]:
                vals.append(abs(summarize(run[k])[col] / summarize(real[k])[col] - 1) * 100)
        vals = [v for v in vals if math.isfinite(v)]
        out[m] = max(vals) if vals else math.nan
    return out


def judge(miss: float, target: float, noise: float) -> tuple[bool, bool]:
    """``(met, beyond_noise)`` of one miss (an error or an effect difference, in the target's unit).

    ``met``: ``|miss| <= target``; ``beyond_noise``: ``|miss| > target + noise`` (an unknown, NaN, noise
    counts as 0). A NaN miss is neither met nor within noise.
    """
    if not math.isfinite(miss):
        return False, True
    return abs(miss) <= target, abs(miss) > target + (noise if math.isfinite(noise) else 0.0)


def audit_errors(experiment: str, real: TrialMap, sim: TrialMap, noise: Mapping[str, float],
                 errors: pd.DataFrame | None = None) -> pd.DataFrame:
    """Seed-mean errors of one workload against the targets and the noise.

    ``errors``: ``dlfp.studies.validation.error_table(real, sim)`` when the caller has it already.

    Columns: ``experiment``, ``arm``, ``metric``, ``real_s``, ``sim_s``, ``error`` (fraction), ``target``,
    ``noise`` (fraction, NaN when no replicate), ``met`` and ``beyond_noise`` (``judge``).
    """
    from dlfp.studies.validation import METRICS, error_table

    err = error_table(real, sim) if errors is None else errors
    rows = []
    for _, r in err[err["seed"] == "mean"].iterrows():
        for m, (_, target) in METRICS.items():
            e = float(r[f"{m}_err"])
            nz = float(noise.get(m, math.nan))
            ok, beyond = judge(e, target, nz)
            rows.append({"experiment": experiment, "arm": r["arm"], "metric": m, "real_s": r[f"{m}_real_s"],
                         "sim_s": r[f"{m}_sim_s"], "error": e, "target": target, "noise": nz, "met": ok,
                         "beyond_noise": beyond})
    return pd.DataFrame(rows)


def audit_effects(experiment: str, real: TrialMap, sim: TrialMap, noise_pp: Mapping[str, float],
                  baseline: str = "baseline") -> pd.DataFrame:
    """Paired effects of every non-baseline arm, per seed (and the seed mean), real against simulated.

    Each (arm, metric) is ``dlfp.studies.validation.dlfp_effect``, judged against ``EFFECT_TARGET_PP``.
    Columns: ``experiment``, ``arm``, ``metric`` (``itl_p99`` / ``ttft_p99``), ``seed`` (or ``mean``),
    ``real_change``, ``sim_change`` (fractions), ``diff_pp`` (sim - real, points), ``same_sign``,
    ``target_pp``, ``noise_pp``, ``met`` and ``beyond_noise`` (``judge``).
    """
    from dlfp.studies.validation import dlfp_effect

    rows = []
    for arm in sorted({a for a, _ in real if a != baseline}):
        for m, col in EFFECT_METRICS.items():
            nz = float(noise_pp.get(m, math.nan))
            for r in dlfp_effect(real, sim, baseline, arm, col).itertuples():
                d = r.size_error * 100
                ok, beyond = judge(d, EFFECT_TARGET_PP, nz)
                rows.append({"experiment": experiment, "arm": arm, "metric": m, "seed": r.seed,
                             "real_change": r.real_change, "sim_change": r.sim_change, "diff_pp": d,
                             "same_sign": bool(r.same_sign), "target_pp": EFFECT_TARGET_PP, "noise_pp": nz,
                             "met": ok, "beyond_noise": beyond})
    return pd.DataFrame(rows)


def three_way(real: TrialMap, emu: TrialMap, sim: TrialMap, experiment: str) -> pd.DataFrame:
    """Real engine, emulator (vLLM's real loop over the modelled device) and simulator, seed means per arm.

    Columns: ``experiment``, ``arm``, ``metric``, ``real_s``, ``emu_s``, ``sim_s``, ``emu_error``,
    ``sim_error`` (against real), ``sim_vs_emu`` (``sim / emu - 1``: the engine model's own error, since the
    two share the device model). Only (arm, seed) pairs present in all three are used.
    """
    from dlfp.studies.validation import METRICS, rel_error

    keys = sorted(set(real) & set(emu) & set(sim))
    sr, se, ss = _summ({k: real[k] for k in keys}), _summ({k: emu[k] for k in keys}), _summ({k: sim[k] for k in keys})
    rows = []
    for arm in sorted({a for a, _ in keys}):
        ks = [k for k in keys if k[0] == arm]
        for m, (col, _) in METRICS.items():
            r = float(np.mean([sr[k][col] for k in ks]))
            e = float(np.mean([se[k][col] for k in ks]))
            s = float(np.mean([ss[k][col] for k in ks]))
            rows.append({"experiment": experiment, "arm": arm, "metric": m, "real_s": r, "emu_s": e, "sim_s": s,
                         "emu_error": rel_error(r, e), "sim_error": rel_error(r, s), "sim_vs_emu": rel_error(e, s)})
    return pd.DataFrame(rows)


def _noise_and_verdict(noise: float, unit: str, met: bool, beyond: bool) -> str:
    """The ``noise | met |`` cells of an audit row: the noise (``n/a`` when unknown) and the verdict."""
    nz = "n/a" if not math.isfinite(noise) else f"{noise:.1f} {unit}"
    verdict = "yes" if met else ("no, within noise" if not beyond else "NO")
    return f"{nz} | {verdict} |"


def audit_markdown(errors: pd.DataFrame, effects: pd.DataFrame) -> str:
    """The audit as Markdown: one error table (ms, %) and one effect table (per seed, points)."""
    lines = ["| workload | arm | metric | real (ms) | sim (ms) | error | target | noise | met |",
             "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for _, r in errors.iterrows():
        lines.append(f"| {r['experiment']} | {r['arm']} | {r['metric']} | {r['real_s'] * 1e3:.1f} | "
                     f"{r['sim_s'] * 1e3:.1f} | {r['error'] * 100:+.1f} % | {r['target'] * 100:.0f} % | "
                     + _noise_and_verdict(r["noise"] * 100, "%", r["met"], r["beyond_noise"]))
    if len(effects):
        lines += ["", "| workload | arm | metric | seed | real change | sim change | sim - real | target | noise | "
                  "met |", "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
        for _, r in effects.iterrows():
            lines.append(f"| {r['experiment']} | {r['arm']} | {r['metric']} | {r['seed']} | "
                         f"{r['real_change'] * 100:+.1f} % | {r['sim_change'] * 100:+.1f} % | "
                         f"{r['diff_pp']:+.1f} pp | {r['target_pp']:.0f} pp | "
                         + _noise_and_verdict(r["noise_pp"], "pp", r["met"], r["beyond_noise"]))
    return "\n".join(lines)


def three_way_markdown(tw: pd.DataFrame) -> str:
    """The three-way table as Markdown (ms and %)."""
    lines = ["| workload | arm | metric | real (ms) | emu (ms) | sim (ms) | emu error | sim error | sim vs emu |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for _, r in tw.iterrows():
        lines.append(f"| {r['experiment']} | {r['arm']} | {r['metric']} | {r['real_s'] * 1e3:.1f} | "
                     f"{r['emu_s'] * 1e3:.1f} | {r['sim_s'] * 1e3:.1f} | {r['emu_error'] * 100:+.1f} % | "
                     f"{r['sim_error'] * 100:+.1f} % | {r['sim_vs_emu'] * 100:+.1f} % |")
    return "\n".join(lines)


__all__ = ["EFFECT_METRICS", "EFFECT_TARGET_PP", "Replicates", "audit_effects", "audit_errors", "audit_markdown",
           "effect_noise", "judge", "metric_noise", "replicate_runs", "three_way", "three_way_markdown"]
