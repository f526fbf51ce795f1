"""DLFP-S target checks and its ablation table, from per-trial summaries.

Input everywhere: a summary frame with one row per (experiment, arm, seed), as
``dlfp.analysis.metrics.summarize_trials`` makes it (columns ``experiment``, ``arm``,
``seed``, ``itl_p99_s``, ``ttft_p99_s``, ``slo_passes``). Changes follow
``dlfp.analysis.stats``: per seed ``(candidate - baseline) / baseline``, NEGATIVE =
the candidate is lower; paired across seeds with a two-sided 95 % Student-t
interval. The ITL targets are stated as reductions, ``-change`` (positive =
lower), and ``target_table`` reports them so. Reports print percent; the code
keeps fractions.

The targets DLFP-S is held to, as checked here:

* ``itl_no_worse`` (each experiment): the paired 95 % interval of the P99 ITL
  change is not entirely on the "worse" side, i.e. NOT ``ci_low > 0``
  (with one seed: the change is <= 0).
* ``itl_headline`` (``qwen3-0.6b-tp1``): mean P99 ITL reduction >= 20 %.
* ``itl_lower_where_paper_failed``: in at least one experiment where
  paper-DLFP failed, the candidate's P99 ITL is lower: mean reduction > 0 and
  the reduction's interval above zero (``ci_low > 0``).
* ``slo_passes`` (each experiment): mean SLO passes over seeds >= the
  baseline's mean.
* ``ttft_headline`` (``qwen3-0.6b-tp1``): the candidate's mean P99 TTFT
  increase <= half of paper-DLFP's (the ``dlfp`` arm of the same matrix);
  when paper-DLFP does not raise TTFT the candidate must not either.
* ``frontier`` (each experiment with fixed-cap arms): the candidate's (mean
  P99 ITL, mean P99 TTFT) point is not dominated by any fixed cap: no fixed
  cap has P99 ITL <= candidate * (1 - tol) AND P99 TTFT <= candidate * (1 + tol)
  (``tol`` = 1 % absorbs ties and round-off).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from dlfp.analysis.stats import PairedChange, paired_from_frame

HEADLINE = "qwen3-0.6b-tp1"
#: Experiments where the paper reports that DLFP failed (arXiv v1, 2026-09-29; their ``verdict`` rows in
#: ``data/paper/published.csv``).
PAPER_FAILED = (
    "qwen3-0.6b-tp2",
    "qwen3-8b-r0.10",
    "qwen3-8b-r0.25",
    "qwen3-32b-tp2",
    "qwen3-32b-tp2-completion-sync",
)
HEADLINE_ITL_REDUCTION = 0.20  # DLFP-S target: P99 ITL ">= 20 % lower in qwen3-0.6b-tp1"
FRONTIER_TOL = 0.01
TARGET_COLUMNS = ["target", "experiment", "reached", "value", "threshold", "detail"]
ABLATION_COLUMNS = ["experiment", "arm", "itl_change", "itl_ci_low", "itl_ci_high", "ttft_change", "slo_passes",
                    "slo_passes_baseline"]
REQUIRED = ("experiment", "arm", "seed", "itl_p99_s", "ttft_p99_s", "slo_passes")


def _check(df: pd.DataFrame) -> None:
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"summary frame lacks column(s) {missing}")


def _paired(df: pd.DataFrame, experiment: str, metric: str, arm: str, baseline: str) -> PairedChange:
    return paired_from_frame(df[df["experiment"] == experiment], metric, arm, baseline)


def reduction(change: PairedChange) -> PairedChange:
    """``change`` as a reduction, ``-change`` (positive = the candidate is lower), interval ends swapped.

    Each value is ``0.0 - x``, so an unchanged metric is a reduction of 0.0
    (not -0.0), as the target table prints it.
    """
    return PairedChange(per_seed=tuple(0.0 - v for v in change.per_seed), mean=0.0 - change.mean,
                        ci_low=0.0 - change.ci_high, ci_high=0.0 - change.ci_low, n=change.n,
                        crosses_zero=change.crosses_zero, confidence=change.confidence, note=change.note)


def itl_no_worse(change: PairedChange) -> bool:
    """True unless the P99 ITL change is significantly worse (``ci_low > 0``; one seed: change > 0)."""
    if change.n < 2 or not np.isfinite(change.ci_low):
        return bool(change.mean <= 0)
    return not bool(change.ci_low > 0)


def frontier_dominators(points: pd.DataFrame, candidate: str, fixed: Sequence[str],
                        tol: float = FRONTIER_TOL) -> list[str]:
    """Fixed-cap arms that dominate ``candidate`` on (P99 ITL, P99 TTFT).

    ``points``: index = arm, columns ``itl_p99_s``, ``ttft_p99_s`` (seed means).
    An arm dominates when its P99 ITL <= candidate's * (1 - tol) and its P99
    TTFT <= candidate's * (1 + tol).

    Raises:
        KeyError: ``candidate`` not in ``points``.
    """
    c = points.loc[candidate]
    out = []
    for a in fixed:
        f = points.loc[a]
        if f["itl_p99_s"] <= c["itl_p99_s"] * (1 - tol) and f["ttft_p99_s"] <= c["ttft_p99_s"] * (1 + tol):
            out.append(a)
    return out


def _itl_no_worse_row(experiment: str, change: PairedChange) -> dict:
    red = reduction(change)
    return dict(target="itl_no_worse", experiment=experiment, reached=itl_no_worse(change), value=red.mean,
                threshold=0.0,
                detail=f"P99 ITL change {-100 * red.mean:+.1f} % (95 % CI of reduction "
                       f"{100 * red.ci_low:.1f}..{100 * red.ci_high:.1f} %; per seed "
                       f"{', '.join(f'{-100 * v:+.1f}' for v in red.per_seed)} %)")


def _itl_headline_row(headline: str, change: PairedChange) -> dict:
    red = reduction(change)
    return dict(target="itl_headline", experiment=headline, reached=bool(red.mean >= HEADLINE_ITL_REDUCTION),
                value=red.mean, threshold=HEADLINE_ITL_REDUCTION,
                detail=f"mean P99 ITL reduction {100 * red.mean:.1f} % (need >= 20 %)")


def _paper_failed_row(failed: Sequence[str], itl: dict[str, PairedChange]) -> dict:
    red = {e: reduction(itl[e]) for e in failed}
    wins = [e for e in failed if red[e].mean > 0 and np.isfinite(red[e].ci_low) and red[e].ci_low > 0]
    best = max(failed, key=lambda e: red[e].mean)
    return dict(target="itl_lower_where_paper_failed", experiment="any", reached=bool(wins),
                value=red[best].mean, threshold=0.0,
                detail=(f"significantly lower in {wins}" if wins else
                        f"in none of {list(failed)}; best mean reduction {100 * red[best].mean:.1f} % ({best})"))


def _slo_row(df: pd.DataFrame, experiment: str, candidate: str, baseline: str) -> dict:
    sub = df[df["experiment"] == experiment]
    c = float(sub.loc[sub["arm"] == candidate, "slo_passes"].mean())
    b = float(sub.loc[sub["arm"] == baseline, "slo_passes"].mean())
    return dict(target="slo_passes", experiment=experiment, reached=bool(c >= b - 1e-9), value=c, threshold=b,
                detail=f"mean SLO passes {c:.2f} vs baseline {b:.2f}")


def _ttft_headline_row(df: pd.DataFrame, headline: str, candidate: str, paper_arm: str, baseline: str) -> dict:
    # the increase is minus the reduction: an unchanged TTFT is printed as "-0.0 %"
    inc_c = -reduction(_paired(df, headline, "ttft_p99_s", candidate, baseline)).mean
    inc_p = -reduction(_paired(df, headline, "ttft_p99_s", paper_arm, baseline)).mean
    limit = 0.5 * max(inc_p, 0.0)
    return dict(target="ttft_headline", experiment=headline, reached=bool(inc_c <= limit + 1e-12),
                value=inc_c, threshold=limit,
                detail=f"P99 TTFT increase {100 * inc_c:+.1f} % vs paper-DLFP {100 * inc_p:+.1f} % "
                       f"(limit {100 * limit:.1f} %)")


def _fixed_arms(arms: Iterable[str], fixed_prefix: str) -> list[str]:
    """Arms named ``<fixed_prefix><cap>``, sorted by cap (non-numeric caps first)."""
    def cap(a: str) -> int:
        tail = str(a)[len(fixed_prefix):]
        return int(tail) if tail.isdigit() else 0

    return sorted((a for a in set(arms) if str(a).startswith(fixed_prefix)), key=cap)


def _frontier_row(df: pd.DataFrame, experiment: str, candidate: str, fixed_prefix: str, tol: float) -> dict | None:
    sub = df[df["experiment"] == experiment]
    fixed = _fixed_arms(sub["arm"], fixed_prefix)
    if not fixed:
        return None
    pts = sub.groupby("arm")[["itl_p99_s", "ttft_p99_s"]].mean()
    dom = frontier_dominators(pts, candidate, fixed, tol)
    best = min(fixed, key=lambda a: pts.loc[a, "itl_p99_s"])
    return dict(target="frontier", experiment=experiment, reached=not dom,
                value=float(pts.loc[candidate, "itl_p99_s"]), threshold=float(pts.loc[best, "itl_p99_s"]),
                detail=(f"P99 ITL {1e3 * pts.loc[candidate, 'itl_p99_s']:.1f} ms / TTFT "
                        f"{1e3 * pts.loc[candidate, 'ttft_p99_s']:.0f} ms; best fixed cap {best}: "
                        f"{1e3 * pts.loc[best, 'itl_p99_s']:.1f} ms / {1e3 * pts.loc[best, 'ttft_p99_s']:.0f} ms; "
                        + (f"dominated by {dom}" if dom else "not dominated")))


def target_table(
    df: pd.DataFrame,
    candidate: str = "dlfps",
    paper_arm: str = "dlfp",
    baseline: str = "baseline",
    *,
    headline: str = HEADLINE,
    paper_failed: Iterable[str] = PAPER_FAILED,
    fixed_prefix: str = "fixed-",
    tol: float = FRONTIER_TOL,
) -> pd.DataFrame:
    """One row per (target, experiment) with ``reached`` (bool) and the number it rests on.

    Columns ``TARGET_COLUMNS``: ``value`` and ``threshold`` are fractions
    (ITL rows: reductions, positive = lower than the baseline; TTFT rows:
    increases), mean SLO passes for ``slo_passes``, and P99 ITL in seconds for
    ``frontier``; ``detail`` says it in words (percent). The
    ``itl_lower_where_paper_failed`` row has experiment ``"any"``. Experiments
    without the candidate arm are skipped; targets whose experiment is absent
    are left out.

    Raises:
        ValueError: a missing column, or the errors of ``dlfp.analysis.stats.paired_from_frame``.
    """
    _check(df)
    exps = [e for e in dict.fromkeys(df["experiment"]) if candidate in set(df.loc[df["experiment"] == e, "arm"])]
    itl = {e: _paired(df, e, "itl_p99_s", candidate, baseline) for e in exps}
    rows: list[dict] = [_itl_no_worse_row(e, itl[e]) for e in exps]
    if headline in itl:
        rows.append(_itl_headline_row(headline, itl[headline]))
    failed = [e for e in paper_failed if e in itl]
    if failed:
        rows.append(_paper_failed_row(failed, itl))
    rows += [_slo_row(df, e, candidate, baseline) for e in exps]
    if headline in itl and paper_arm in set(df.loc[df["experiment"] == headline, "arm"]):
        rows.append(_ttft_headline_row(df, headline, candidate, paper_arm, baseline))
    frontier = (_frontier_row(df, e, candidate, fixed_prefix, tol) for e in exps)
    rows += [r for r in frontier if r is not None]
    return pd.DataFrame(rows, columns=TARGET_COLUMNS)


def ablation_table(df: pd.DataFrame, arms: Sequence[str], baseline: str = "baseline") -> pd.DataFrame:
    """Per (experiment, arm): paired P99 ITL and P99 TTFT changes vs the baseline, and SLO passes.

    Columns ``ABLATION_COLUMNS``: ``experiment``, ``arm``, ``itl_change``
    (mean fraction, negative = lower), ``itl_ci_low``, ``itl_ci_high`` (its
    95 % interval), ``ttft_change`` (mean fraction, negative = lower),
    ``slo_passes`` (mean), ``slo_passes_baseline`` (mean). Arms absent from
    an experiment are skipped.

    Raises:
        ValueError: a missing column, or the errors of ``dlfp.analysis.stats.paired_from_frame``.
    """
    _check(df)
    rows = []
    for e in dict.fromkeys(df["experiment"]):
        sub = df[df["experiment"] == e]
        present = set(sub["arm"])
        b_slo = float(sub.loc[sub["arm"] == baseline, "slo_passes"].mean())
        for a in arms:
            if a not in present:
                continue
            pi = paired_from_frame(sub, "itl_p99_s", a, baseline)
            pt = paired_from_frame(sub, "ttft_p99_s", a, baseline)
            rows.append(dict(experiment=e, arm=a, itl_change=pi.mean, itl_ci_low=pi.ci_low, itl_ci_high=pi.ci_high,
                             ttft_change=pt.mean, slo_passes=float(sub.loc[sub["arm"] == a, "slo_passes"].mean()),
                             slo_passes_baseline=b_slo))
    return pd.DataFrame(rows, columns=ABLATION_COLUMNS)


__all__ = ["ABLATION_COLUMNS", "FRONTIER_TOL", "HEADLINE", "PAPER_FAILED", "TARGET_COLUMNS", "ablation_table",
           "frontier_dominators", "itl_no_worse", "reduction", "target_table"]
