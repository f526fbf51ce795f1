"""DLFP-G tables (this artifact's own controller, not the paper's): its targets, the frontier, its ablations.

Written by ``dlfp figures`` (``write_dlfpg``):

* ``dlfpg_targets``: one row per (backend, target, experiment) with ``reached`` and the figure it rests on:
  ``worst_gap`` (request-list experiments: the worst decode gap against ``WORST_GAP_FACTOR`` x the device time
  of one smallest-allowed chunk at the long prompt's deepest context plus the decode batch, from the
  experiment's device model), ``frontier`` (``dlfp.analysis.frontier.frontier_comparison``), ``slo_passes``
  (sum over seeds >= the baseline's) and, on a backend that runs the real engine, ``real_engine`` (DLFP-G's
  P99 ITL change no worse than DLFP's, and its P99 TTFT rise no larger).
* ``dlfpg_frontier``: the frontier comparison itself, per backend and experiment.
* ``dlfpg_ablation``: DLFP, DLFP-G and each ablation arm (``dlfpg-<part switched off>``): paired P99 ITL / TTFT
  changes against the baseline, SLO passes, worst decode gap.
* ``dlfpg_dev``: the same targets on the development seeds 901-903 (``data/results/dlfpg/dev.csv`` from
  ``dlfp dlfpg-dev``) beside the reported seeds'.

Changes follow ``dlfp.analysis.stats`` (percent, negative = lower than the baseline); latencies in the tables
are milliseconds, seconds in code.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dlfp.analysis import evaluation, metrics
from dlfp.analysis.stats import paired_from_frame
from dlfp.analysis.frontier import FRONTIER_COLUMNS, frontier_comparison
from dlfp.analysis.markdown import write_table
from dlfp.analysis.tables.dlfps import evaluation_frame
from dlfp.analysis.tables.loading import TraceSet, mark_incomplete

DLFPG_ARM = "dlfpg"
#: The worst-gap target: at most 1.25 x one smallest-allowed chunk at that context plus the decode batch.
WORST_GAP_FACTOR = 1.25
TARGET_COLUMNS = ["backend", "target", "experiment", "reached", "value", "threshold", "detail"]
ABLATION_COLUMNS = ["backend", "experiment", "arm", "p99_itl_change_pct_mean", "p99_itl_change_pct_ci_low",
                    "p99_itl_change_pct_ci_high", "p99_ttft_change_pct_mean", "slo_passes_sum",
                    "slo_passes_baseline_sum", "worst_gap_ms"]
DEV_COLUMNS = ["experiment", "seeds", "target", "reached", "value", "threshold", "detail"]


def worst_gap_bound_s(cfg, arm: str = DLFPG_ARM) -> float:
    """``WORST_GAP_FACTOR`` x the device time (s) of one smallest-allowed chunk at the long prompt's deepest context.

    For a request-list experiment: the longest prompt is the long prompt; every other request decodes beside it
    at its largest context (prompt + output tokens, an upper bound); the chunk is the arm's ``min_chunk``, after
    ``prompt - min_chunk`` cached tokens. The time is the experiment's simulator device model's.

    Raises:
        ValueError: the experiment is not a request list, or the arm is not a DLFP-G arm.
    """
    from dlfp.backends.sim.runner import build_engine_parts
    from dlfp.devices.batch import Batch
    from dlfp.policies.dlfpg import DLFPGOptions

    if cfg.workload.kind != "requests":
        raise ValueError(f"experiment {cfg.name}: the worst-gap bound is defined for request lists only")
    pc = cfg.arms[arm]
    if pc.policy != DLFPG_ARM:
        raise ValueError(f"arm {arm} of {cfg.name} is not a DLFP-G arm (policy {pc.policy})")
    chunk = DLFPGOptions.from_options(pc.options).min_chunk
    reqs = list(cfg.workload.requests)
    long = max(range(len(reqs)), key=lambda i: reqs[i].prompt_tokens)
    decodes = [r.prompt_tokens + r.output_tokens for i, r in enumerate(reqs) if i != long]
    dm = build_engine_parts(cfg)[2]
    t, _ = dm.time_batch(Batch(prefill=[(chunk, reqs[long].prompt_tokens - chunk)], decodes=decodes,
                               sampled=len(decodes) + 1))
    return WORST_GAP_FACTOR * float(t)


def worst_gaps(ts: TraceSet, backend: str) -> pd.DataFrame:
    """Per trial of ``backend``: experiment, arm, seed, worst_gap_s (``metrics.worst_gap_s``; computed once per set)."""
    def compute() -> pd.DataFrame:
        rows = [dict(experiment=lt.experiment, arm=lt.arm, seed=lt.seed, worst_gap_s=metrics.worst_gap_s(lt.trial))
                for lt in ts.trials if lt.backend == backend]
        return pd.DataFrame(rows, columns=["experiment", "arm", "seed", "worst_gap_s"])

    return ts.cached(f"dlfpg_worst_gaps:{backend}", compute)


def _backends(ts: TraceSet) -> list[str]:
    return sorted({b for b, e in ts.groups() if DLFPG_ARM in set(ts.arms(b, e))
                   and ts.baseline_arm(b, e) == "baseline"})


def _worst_gap_rows(ts: TraceSet, backend: str, wg: pd.DataFrame) -> list[dict]:
    rows = []
    for b, e in ts.groups():
        cfg = ts.config(b, e)
        if b != backend or cfg is None or cfg.workload.kind != "requests" or DLFPG_ARM not in cfg.arms:
            continue
        sub = wg[wg["experiment"] == e].groupby("arm")["worst_gap_s"].max()
        if DLFPG_ARM not in sub.index:
            continue
        bound = worst_gap_bound_s(cfg)
        v = float(sub[DLFPG_ARM])
        others = ", ".join(f"{a} {1e3 * sub[a]:,.1f}" for a in ("baseline", "dlfp", "dlfps") if a in sub.index)
        rows.append(dict(backend=backend, target="worst_gap", experiment=e, reached=bool(v <= bound), value=v,
                         threshold=bound, detail=f"worst decode gap {1e3 * v:,.1f} ms vs bound {1e3 * bound:,.1f} ms "
                                                 f"({'met' if v <= bound else f'over by {1e3 * (v - bound):,.1f} ms'}"
                                                 f"; {others} ms)"))
    return rows


def _slo_rows(backend: str, df: pd.DataFrame, candidate: str = DLFPG_ARM) -> list[dict]:
    rows = []
    for e, sub in df.groupby("experiment", sort=True):
        if candidate not in set(sub["arm"]):
            continue
        c = float(sub.loc[sub["arm"] == candidate, "slo_passes"].sum())
        b = float(sub.loc[sub["arm"] == "baseline", "slo_passes"].sum())
        n = int((sub["arm"] == candidate).sum())
        rows.append(dict(backend=backend, target="slo_passes", experiment=e, reached=bool(c >= b), value=c,
                         threshold=b, detail=f"SLO passes {c:.0f} vs baseline {b:.0f} (sum over {n} seed(s))"))
    return rows


def _frontier_rows(backend: str, fc: pd.DataFrame) -> list[dict]:
    return [dict(backend=backend, target="frontier", experiment=r.experiment, reached=bool(r.on_or_below),
                 value=r.gap_s_mean, threshold=0.0, detail=r.detail) for r in fc.itertuples()]


def _real_engine_rows(backend: str, df: pd.DataFrame) -> list[dict]:
    """DLFP-G against DLFP on a real-engine backend: P99 ITL change <= DLFP's, P99 TTFT rise <= DLFP's."""
    rows = []
    for e, sub in df.groupby("experiment", sort=True):
        arms = set(sub["arm"])
        if not {"baseline", "dlfp", DLFPG_ARM} <= arms:
            continue
        ch = {(a, m): paired_from_frame(sub, m, a, "baseline") for a in ("dlfp", DLFPG_ARM)
              for m in ("itl_p99_s", "ttft_p99_s")}
        gi, gt = ch[(DLFPG_ARM, "itl_p99_s")], ch[(DLFPG_ARM, "ttft_p99_s")]
        pi, pt = ch[("dlfp", "itl_p99_s")], ch[("dlfp", "ttft_p99_s")]
        ok = bool(gi.mean <= pi.mean and gt.mean <= max(pt.mean, 0.0))
        rows.append(dict(backend=backend, target="real_engine", experiment=e, reached=ok, value=gi.mean,
                         threshold=pi.mean,
                         detail=f"P99 ITL {100 * gi.mean:+.1f} % [{100 * gi.ci_low:+.1f}, {100 * gi.ci_high:+.1f}] vs "
                                f"DLFP {100 * pi.mean:+.1f} %; P99 TTFT {100 * gt.mean:+.1f} % vs DLFP "
                                f"{100 * pt.mean:+.1f} % (paired over {gi.n} seeds, against the baseline)"))
    return rows


def dlfpg_targets(ts: TraceSet) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(targets, frontier)``: the target rows (``TARGET_COLUMNS``) and the frontier comparison per backend.

    ``value``/``threshold``: seconds for ``worst_gap`` and ``frontier`` (the mean gap to the frontier, 0), sums
    of SLO passes for ``slo_passes``, change fractions (DLFP-G's and DLFP's P99 ITL) for ``real_engine``.
    """
    from dlfp.backends import get_backend

    rows: list[dict] = []
    fronts = []
    for backend in _backends(ts):
        df = evaluation_frame(ts, backend)
        df = df[df["experiment"].isin([e for b, e in ts.groups() if b == backend
                                       and ts.baseline_arm(b, e) == "baseline"])]
        rows += _worst_gap_rows(ts, backend, worst_gaps(ts, backend))
        fc = frontier_comparison(df, DLFPG_ARM)
        fronts.append(fc.assign(backend=backend))
        rows += _frontier_rows(backend, fc)
        rows += _slo_rows(backend, df)
        if not get_backend(backend).modelled_outputs:
            rows += _real_engine_rows(backend, df)
    cols = ["backend"] + list(FRONTIER_COLUMNS)
    front = pd.concat(fronts, ignore_index=True)[cols] if fronts else pd.DataFrame(columns=cols)
    return pd.DataFrame(rows, columns=TARGET_COLUMNS), front


def dlfpg_ablation(ts: TraceSet) -> pd.DataFrame:
    """Per backend and experiment: ``dlfp``, ``dlfpg`` and each ``dlfpg-*`` arm against the baseline.

    Columns ``ABLATION_COLUMNS``.
    """
    frames = []
    for backend in _backends(ts):
        df = evaluation_frame(ts, backend)
        present = set(df["arm"])
        arms = [a for a in ("dlfp", DLFPG_ARM) if a in present] + sorted(a for a in present
                                                                          if a.startswith(DLFPG_ARM + "-"))
        ab = evaluation.ablation_table(df, arms)
        wg = worst_gaps(ts, backend).groupby(["experiment", "arm"])["worst_gap_s"].max()
        sums = df.groupby(["experiment", "arm"])["slo_passes"].sum()
        frames.append(pd.DataFrame({
            "backend": backend, "experiment": ab["experiment"], "arm": ab["arm"],
            "p99_itl_change_pct_mean": 100 * ab["itl_change"], "p99_itl_change_pct_ci_low": 100 * ab["itl_ci_low"],
            "p99_itl_change_pct_ci_high": 100 * ab["itl_ci_high"], "p99_ttft_change_pct_mean": 100 * ab["ttft_change"],
            "slo_passes_sum": [float(sums.get((e, a), np.nan)) for e, a in zip(ab["experiment"], ab["arm"])],
            "slo_passes_baseline_sum": [float(sums.get((e, "baseline"), np.nan)) for e in ab["experiment"]],
            "worst_gap_ms": [1e3 * float(wg.get((e, a), np.nan)) for e, a in zip(ab["experiment"], ab["arm"])]}))
    if not frames:
        return pd.DataFrame(columns=ABLATION_COLUMNS)
    return pd.concat(frames, ignore_index=True)[ABLATION_COLUMNS].sort_values(
        ["backend", "experiment"], kind="stable").reset_index(drop=True)


def dev_targets(dev: pd.DataFrame) -> pd.DataFrame:
    """The frontier and SLO targets on the development set (``dlfp.studies.controller_dev`` rows; ``DEV_COLUMNS``)."""
    fc = frontier_comparison(dev, DLFPG_ARM)
    rows = [dict(experiment=r.experiment, seeds=int(r.n_seeds), target="frontier", reached=bool(r.on_or_below),
                 value=r.gap_s_mean, threshold=0.0, detail=r.detail) for r in fc.itertuples()]
    rows += [{k: v for k, v in r.items() if k != "backend"} | {"seeds": int(
        (dev["experiment"].eq(r["experiment"]) & dev["arm"].eq(DLFPG_ARM)).sum())} for r in _slo_rows("", dev)]
    return pd.DataFrame(rows, columns=DEV_COLUMNS).sort_values(["target", "experiment"], kind="stable")


def write_dlfpg(ts: TraceSet, results_dir: str | Path, dev_csv: str | Path | None = None) -> pd.DataFrame:
    """Write ``dlfpg_targets``, ``dlfpg_frontier``, ``dlfpg_ablation`` and, with ``dev_csv``, ``dlfpg_dev``.

    Each as ``.csv`` and ``.md``; returns the target table.

    Raises:
        ValueError: ``dev_csv`` exists but is not a development-set table (one line naming it).
    """
    tt, front = dlfpg_targets(ts)
    ab = dlfpg_ablation(ts)
    none = [] if len(tt) else [f"NO DATA: no traces have the {DLFPG_ARM!r} arm."]
    label = "DLFP-G (this artifact's own controller, not the paper's)"
    write_table(mark_incomplete(tt, ts), results_dir, "dlfpg_targets",
                markdown=mark_incomplete(tt[["backend", "target", "experiment", "reached", "detail"]], ts),
                title=f"{label} against its targets, seeds 801-803 (801 alone for request lists; what is reached, "
                      "not what was hoped)",
                notes=none + ["worst_gap: request-list experiments, bound = 1.25 x the device model's time of one "
                              "smallest-allowed chunk at the long prompt's deepest context plus the decode batch.",
                              "frontier: on or below the fixed-cap frontier interpolated between caps at DLFP-G's "
                              "P99 TTFT, per seed; reached unless the 95 % interval of the gap lies above zero.",
                              "slo_passes: sum over seeds, DLFP-G >= baseline."])
    fm = front[["backend", "experiment", "n_seeds", "on_or_below", "detail"]]
    write_table(mark_incomplete(front, ts), results_dir, "dlfpg_frontier", markdown=mark_incomplete(fm, ts),
                title=f"{label} against the fixed-cap frontier interpolated between caps",
                notes=none + ["gap = DLFP-G's P99 ITL minus the frontier's P99 ITL at DLFP-G's P99 TTFT, per seed "
                              "against that seed's fixed caps (negative = below the frontier); straight lines "
                              "between caps are an assumption."])
    write_table(mark_incomplete(ab, ts), results_dir, "dlfpg_ablation",
                title=f"{label}: ablations, paired change vs the baseline",
                notes=none + ["ΔP99 in percent, negative = lower than the baseline; 95 % paired t-interval over "
                              "seeds; SLO passes summed over seeds; worst decode gap in ms (largest over seeds)."])
    if dev_csv is not None and Path(dev_csv).exists():
        from dlfp.studies.controller_dev import read_dev

        dt = dev_targets(read_dev(dev_csv))
        write_table(dt, results_dir, "dlfpg_dev",
                    markdown=dt[["target", "experiment", "seeds", "reached", "detail"]],
                    title=f"{label} on the development seeds 901-903, where its constants were chosen",
                    notes=["The reported numbers (dlfpg_targets) come from seeds 801-803, which the constants never "
                           "saw. Request-list experiments are not in the development set (their seed changes only "
                           "token ids)."])
    return tt


__all__ = ["ABLATION_COLUMNS", "DEV_COLUMNS", "DLFPG_ARM", "TARGET_COLUMNS", "WORST_GAP_FACTOR", "dev_targets",
           "dlfpg_ablation", "dlfpg_targets", "worst_gap_bound_s", "worst_gaps", "write_dlfpg"]
