"""Per-trial summaries, the headline table (per seed and over seeds) and the paired change behind both.

Changes follow ``dlfp.analysis.stats``: ``(candidate - baseline) / baseline``
of the same seed, here in percent, NEGATIVE = the candidate is lower.
Latencies are reported in milliseconds.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dlfp.analysis import metrics, stats
from dlfp.analysis.markdown import write_table
from dlfp.analysis.tables.checks import IDENTICAL_WORKLOADS, PartialTraceSet, identical_workload_seeds, pairing_problem
from dlfp.analysis.tables.loading import LoadedTrial, TraceSet, mark_incomplete
from dlfp.analysis.tables.trial_frames import token_agreement

#: Metrics whose paired change the headline table reports: column -> label.
CHANGE_METRICS: dict[str, str] = {
    "p99_itl_ms": "P99 ITL",
    "p99_ttft_ms": "P99 TTFT",
    "p99_e2el_ms": "P99 E2EL",
    "energy_per_token_j": "energy per output token",
}
SUMMARY_COLUMNS = ["backend", "experiment", "arm", "seed", "is_baseline", "measured", "completed", "failed"] + [
    f"p{p}_{m}_ms" for m in ("itl", "ttft", "tpot", "e2el") for p in (50, 90, 99)] + [
    "slo_passes", "slo_fraction", "goodput_rps", "output_tokens", "energy_per_token_j", "energy_reason",
    "tokens_agree", "tokens_compared", "path"]
PER_SEED_COLUMNS = ["backend", "experiment", "arm", "seed", "measured", "completed", "failed", "p50_itl_ms",
                    "p99_itl_ms", "p99_ttft_ms", "p99_e2el_ms", "slo_passes", "slo_fraction", "energy_per_token_j",
                    "tokens_agree", "tokens_compared"]


def change_column(col: str) -> str:
    """The name of the change column of a metric column: ``p99_itl_ms`` -> ``p99_itl_change_pct``."""
    return col.rsplit("_", 1)[0] + "_change_pct"


def change_pct(change: float) -> float:
    """A change fraction in percent, ``100 * change``.

    An exact zero (an unchanged metric) is returned as -0.0, so it prints as
    ``-0.00``: the form in which the headline and sim-vs-emu tables of
    ``data/results`` print an unchanged metric.
    """
    pct = 100.0 * change
    return -0.0 if pct == 0.0 else pct


def _agreement(ts: TraceSet, base: LoadedTrial, cand: LoadedTrial) -> tuple[int, int]:
    """``token_agreement`` of two trials, from their load-time token arrays when both share the positions."""
    db, dc = ts.digest(base), ts.digest(cand)
    if db is not None and dc is not None:
        (rb, ib, tb), (rc, ic, tc) = db["tokens"], dc["tokens"]
        if len(rb) == len(rc) and np.array_equal(ib, ic) and np.array_equal(rb, rc):
            return int((tb == tc).sum()), int(len(tb))  # same positions in both arms: compare directly
    return token_agreement(base.trial, cand.trial)


def _summary_row(ts: TraceSet, lt: LoadedTrial, base: LoadedTrial | None) -> dict[str, Any]:
    """One ``trial_summaries`` row of ``lt``; ``base`` is the baseline arm's trial of the same seed."""
    d = ts.digest(lt)
    s = d["summary"] if d is not None else metrics.summarize(lt.trial, lt.slo)
    is_base = base is lt
    if base is not None and not is_base and not ts.partial:
        problem = pairing_problem(base, lt)  # load_traces checks this too; a hand-built set is checked here
        if problem is not None:
            raise PartialTraceSet(problem)
    if base is not None and not is_base:
        agree, compared = _agreement(ts, base, lt)
    else:
        agree, compared = np.nan, np.nan
    row = dict(backend=lt.backend, experiment=lt.experiment, arm=lt.arm, seed=lt.seed, is_baseline=is_base,
               measured=s["measured"], completed=s["completed"], failed=s["failed"])
    for m in ("itl", "ttft", "tpot", "e2el"):
        for p in (50, 90, 99):
            row[f"p{p}_{m}_ms"] = metrics.to_ms(s[f"{m}_p{p}_s"])
    row.update(slo_passes=s["slo_passes"], slo_fraction=s["slo_fraction"], goodput_rps=s["goodput_rps"],
               output_tokens=s["output_tokens"], energy_per_token_j=s["energy_per_token_j"],
               energy_reason=s["energy_reason"], tokens_agree=agree, tokens_compared=compared, path=str(lt.path))
    return row


def trial_summaries(ts: TraceSet) -> pd.DataFrame:
    """One row per loaded trial: ``dlfp.analysis.metrics.summarize`` converted to ms, plus token agreement.

    Columns (``SUMMARY_COLUMNS``): backend, experiment, arm, seed,
    is_baseline, measured, completed, failed, p50/p90/p99 of itl, ttft, tpot
    and e2el in ms, slo_passes, slo_fraction, goodput_rps, output_tokens,
    energy_per_token_j, energy_reason, tokens_agree, tokens_compared (versus
    the baseline arm's trial of the same seed; NaN for the baseline itself or
    without one), path.
    """
    base_trials: dict[tuple[str, str, int], LoadedTrial] = {}
    for lt in ts.trials:
        if lt.arm == ts.baseline_arm(lt.backend, lt.experiment):
            base_trials[(lt.backend, lt.experiment, lt.seed)] = lt
    rows = [_summary_row(ts, lt, base_trials.get((lt.backend, lt.experiment, lt.seed))) for lt in ts.trials]
    return sort_rows(pd.DataFrame(rows, columns=SUMMARY_COLUMNS), ts)


def sort_rows(df: pd.DataFrame, ts: TraceSet) -> pd.DataFrame:
    """Rows in (backend, experiment, ``arm_order``, seed) order."""
    if df.empty:
        return df.reset_index(drop=True)
    rank = {}
    for b, e in ts.groups():
        for i, a in enumerate(ts.arms(b, e)):
            rank[(b, e, a)] = i
    df = df.assign(_rank=[rank.get((b, e, a), 0) for b, e, a in zip(df["backend"], df["experiment"], df["arm"])])
    keys = ["backend", "experiment", "_rank"] + (["seed"] if "seed" in df.columns else [])
    return df.sort_values(keys, kind="stable").drop(columns="_rank").reset_index(drop=True)


def _seed_change_pct(base: float, cand: float) -> float:
    """``change_pct`` of one seed; NaN when either value is missing or the baseline is 0."""
    if not (np.isfinite(base) and np.isfinite(cand)) or base == 0:
        return float("nan")
    return change_pct(stats.relative_change(base, cand))


def headline_per_seed(ts: TraceSet) -> pd.DataFrame:
    """The headline table, one row per backend x experiment x arm x seed (computed once per set).

    Columns: ``PER_SEED_COLUMNS`` (ms, SLO passes, joules per token, token
    agreement), then for each of ``CHANGE_METRICS`` the per-seed
    ``<metric>_change_pct`` versus the baseline arm's trial of the same seed
    (percent; NaN for the baseline, or without a baseline trial for that seed).
    """
    def compute() -> pd.DataFrame:
        s = ts.summary()
        out = s[PER_SEED_COLUMNS].copy()
        base = s[s["is_baseline"]].set_index(["backend", "experiment", "seed"])
        for col in CHANGE_METRICS:
            b = base[col].reindex(pd.MultiIndex.from_frame(s[["backend", "experiment", "seed"]])).to_numpy(float)
            c = s[col].to_numpy(float)
            out[change_column(col)] = [float("nan") if is_b else _seed_change_pct(bv, cv)
                                       for is_b, bv, cv in zip(s["is_baseline"], b, c)]
        return out.reset_index(drop=True)

    return ts.cached("per_seed", compute)


def _arm_rows(ts: TraceSet) -> dict[tuple[str, str, str], pd.DataFrame]:
    """``trial_summaries`` rows per (backend, experiment, arm), indexed by seed, in row order (computed once)."""
    def compute() -> dict[tuple[str, str, str], pd.DataFrame]:
        s = ts.summary()
        return {key: g.set_index("seed") for key, g in s.groupby(["backend", "experiment", "arm"], sort=False)}

    return ts.cached("arm_rows", compute)


def paired(ts: TraceSet, backend: str, experiment: str, arm: str, column: str) -> stats.PairedChange | None:
    """Paired change of ``column`` (a ``trial_summaries`` column) of ``arm`` vs the baseline, in percent.

    per_seed, mean, ci_low and ci_high are ``change_pct`` of
    ``dlfp.analysis.stats.paired_change`` over the seeds with finite values
    in both arms and a nonzero baseline (negative = candidate lower). ``None``
    when there is no such seed. When two of those seeds replayed the same
    workload (``checks.identical_workload_seeds``) the interval is NaN and
    ``note`` is ``IDENTICAL_WORKLOADS``.
    """
    rows = _arm_rows(ts)
    base_rows, cand_rows = rows.get((backend, experiment, ts.baseline_arm(backend, experiment))), \
        rows.get((backend, experiment, arm))
    if base_rows is None or cand_rows is None:
        return None
    b, c = base_rows[column], cand_rows[column]
    seeds = sorted(set(b.index) & set(c.index))
    seeds = [sd for sd in seeds if np.isfinite(b[sd]) and np.isfinite(c[sd]) and b[sd] != 0]
    if not seeds:
        return None
    r = stats.paired_change(b.loc[seeds].to_numpy(float), c.loc[seeds].to_numpy(float))
    if any(len(set(same) & set(seeds)) > 1 for same in identical_workload_seeds(ts, backend, experiment)):
        # copies of one workload: their spread is no sampling variation, so there is no interval to give
        return stats.PairedChange(per_seed=tuple(change_pct(v) for v in r.per_seed), mean=change_pct(r.mean),
                                  ci_low=float("nan"), ci_high=float("nan"), n=r.n, crosses_zero=True,
                                  confidence=r.confidence, note=IDENTICAL_WORKLOADS)
    return stats.PairedChange(per_seed=tuple(change_pct(v) for v in r.per_seed), mean=change_pct(r.mean),
                              ci_low=change_pct(r.ci_low), ci_high=change_pct(r.ci_high), n=r.n,
                              crosses_zero=r.crosses_zero, confidence=r.confidence, note=r.note)


def _headline_row(ts: TraceSet, g: pd.DataFrame, backend: str, experiment: str, arm: str) -> dict[str, Any]:
    """One ``headline`` row: ``g`` is the group's ``trial_summaries`` rows."""
    base_arm = ts.baseline_arm(backend, experiment)
    base_seeds = set(g.loc[g["arm"] == base_arm, "seed"])
    a = g[g["arm"] == arm]
    seeds = set(a["seed"])
    row: dict[str, Any] = dict(backend=backend, experiment=experiment, arm=arm, seeds=len(seeds),
                               missing_seeds=" ".join(str(x) for x in sorted(seeds ^ base_seeds)))
    for col in CHANGE_METRICS:
        v = a[col].to_numpy(float)
        row[f"{col}_mean"] = float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")
    for col in CHANGE_METRICS:
        name = change_column(col)
        pc = None if arm == base_arm else paired(ts, backend, experiment, arm, col)
        row[f"{name}_per_seed"] = "" if pc is None else " / ".join(f"{v:+.2f}" for v in pc.per_seed)
        row[f"{name}_mean"] = float("nan") if pc is None else pc.mean
        row[f"{name}_ci_low"] = float("nan") if pc is None else pc.ci_low
        row[f"{name}_ci_high"] = float("nan") if pc is None else pc.ci_high
        row[f"{name}_crosses_zero"] = None if pc is None else bool(pc.crosses_zero)
    for col in ("slo_passes", "measured", "completed", "failed"):
        row[col] = int(a[col].sum())
    for col in ("tokens_agree", "tokens_compared"):
        row[col] = float("nan") if arm == base_arm or a[col].isna().all() else int(a[col].sum())
    row["problems"] = len(ts.problems_for(backend, experiment))
    same = identical_workload_seeds(ts, backend, experiment)
    row["identical_workloads"] = "; ".join(" ".join(map(str, g)) for g in same)
    return row


def headline(ts: TraceSet) -> pd.DataFrame:
    """The headline table aggregated over seeds: one row per backend x experiment x arm.

    Columns: backend, experiment, arm, seeds (count), missing_seeds (seeds the
    baseline has and this arm lacks, or the reverse, space-separated),
    p99_itl_ms_mean, p99_ttft_ms_mean, p99_e2el_ms_mean,
    energy_per_token_j_mean; for each of ``CHANGE_METRICS`` (baseline rows
    NaN): ``<m>_change_pct_per_seed`` (text, seed order), ``_mean``,
    ``_ci_low``, ``_ci_high``, ``_crosses_zero``; then slo_passes, measured,
    completed, failed (sums over seeds), tokens_agree, tokens_compared (sums),
    problems (count of unloadable trial directories in the group); and, only
    when some experiment's seeds replayed identical workloads (then its
    intervals are NaN), identical_workloads (those seeds, space-separated).
    """
    s = ts.summary()
    rows = []
    for backend, experiment in ts.groups():
        g = s[(s["backend"] == backend) & (s["experiment"] == experiment)]
        rows += [_headline_row(ts, g, backend, experiment, arm) for arm in ts.arms(backend, experiment)]
    df = pd.DataFrame(rows)
    if "identical_workloads" in df.columns and not df["identical_workloads"].astype(bool).any():
        df = df.drop(columns="identical_workloads")
    return df


def _change_with_ci(r: pd.Series, name: str) -> str:
    """``"<mean> [<low>, <high>]"`` of change column ``name`` (one decimal, signed); "" on baseline rows."""
    m = r[f"{name}_mean"]
    if not np.isfinite(m):
        return ""
    lo, hi = r[f"{name}_ci_low"], r[f"{name}_ci_high"]
    if not np.isfinite(lo) and r.get("identical_workloads"):
        return f"{m:+.1f} ({IDENTICAL_WORKLOADS})"
    rng = f" [{lo:+.1f}, {hi:+.1f}]" if np.isfinite(lo) else " (n=1)"
    return f"{m:+.1f}{rng}"


def headline_markdown_frame(head: pd.DataFrame) -> pd.DataFrame:
    """A compact, human-readable view of ``headline`` (strings): one row per experiment x arm."""
    out = []
    for _, r in head.iterrows():
        agree = "" if not np.isfinite(r["tokens_compared"]) else f"{int(r['tokens_agree'])}/{int(r['tokens_compared'])}"
        notes = (f"missing seeds {r['missing_seeds']}" if r["missing_seeds"] else "",
                 f"{r['problems']} corrupt trial(s)" if r["problems"] else "",
                 f"seeds {r['identical_workloads']} replayed identical workloads" if r.get("identical_workloads")
                 else "")
        out.append({
            "backend": r["backend"], "experiment": r["experiment"], "arm": r["arm"], "seeds": r["seeds"],
            "P99 ITL ms (mean)": f"{r['p99_itl_ms_mean']:.1f}",
            "ΔP99 ITL % [95% CI]": _change_with_ci(r, "p99_itl_change_pct"),
            "ΔP99 TTFT % [95% CI]": _change_with_ci(r, "p99_ttft_change_pct"),
            "ΔP99 E2EL % [95% CI]": _change_with_ci(r, "p99_e2el_change_pct"),
            "SLO passes": f"{r['slo_passes']}/{r['measured']}",
            "ΔJ/token % [95% CI]": _change_with_ci(r, "energy_per_token_change_pct"),
            "completed": f"{r['completed']}/{r['measured']}",
            "tokens agree": agree,
            "notes": "; ".join(x for x in notes if x),
        })
    return pd.DataFrame(out)


def write_headline(ts: TraceSet, results_dir: str | Path) -> pd.DataFrame:
    """Write ``headline_per_seed`` and ``headline`` (CSV + Markdown); returns the aggregated table."""
    per_seed = headline_per_seed(ts)
    head = headline(ts)
    write_table(mark_incomplete(per_seed, ts), results_dir, "headline_per_seed", title="Headline numbers per seed")
    write_table(mark_incomplete(head, ts), results_dir, "headline",
                markdown=mark_incomplete(headline_markdown_frame(head), ts),
                title="Headline: paired change vs the baseline arm (negative = lower)")
    return head


__all__ = ["CHANGE_METRICS", "PER_SEED_COLUMNS", "SUMMARY_COLUMNS", "change_column", "change_pct", "headline",
           "headline_markdown_frame", "headline_per_seed", "paired", "sort_rows", "trial_summaries",
           "write_headline"]
