"""Paired statistics across seeds: relative change and a Student-t interval.

The paper (arXiv v1, 2026-09-29) pairs a baseline arm and a candidate arm on
the same seeds (801/802/803), computes per seed the relative change and
reports the mean over seeds with a two-sided 95 % Student-t interval
(``mean +- t_{0.975, n-1} * sd / sqrt(n)``, ``sd`` with ``ddof = 1``).

Sign convention of every "change" in ``dlfp`` (this module, the tables, the
sensitivity sweep, ``data/paper/published.csv``)::

    change = (candidate - baseline) / baseline

NEGATIVE = the candidate is LOWER than the baseline (e.g. the paper's P99 ITL
change of -27.7 %, 95 % CI -34.4..-21.0 %). A fraction in code (-0.277 =
-27.7 %); ``summarize_changes`` works in whatever unit it is given. Where a
target is stated as a reduction (``dlfp.analysis.evaluation``), the reduction
is ``-change``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps


@dataclass(frozen=True)
class PairedChange:
    """Per-seed changes and their summary across seeds.

    Attributes:
        per_seed: the per-seed changes (same unit as the input; fractions from
            ``paired_change``), shape (n,).
        mean: their mean.
        ci_low, ci_high: two-sided Student-t interval at ``confidence``; NaN when n = 1.
        n: number of seeds.
        crosses_zero: True if ``ci_low <= 0 <= ci_high`` (the change is not
            distinguishable from zero); also True when n = 1 (no interval).
        confidence: the interval's confidence level (0.95 by default).
        note: why the interval is missing (n = 1), else "".
    """

    per_seed: tuple[float, ...]
    mean: float
    ci_low: float
    ci_high: float
    n: int
    crosses_zero: bool
    confidence: float = 0.95
    note: str = ""

    def as_percent(self) -> "PairedChange":
        """The same result with every value multiplied by 100 (fractions -> percent)."""
        return PairedChange(
            per_seed=tuple(100.0 * v for v in self.per_seed),
            mean=100.0 * self.mean,
            ci_low=100.0 * self.ci_low,
            ci_high=100.0 * self.ci_high,
            n=self.n,
            crosses_zero=self.crosses_zero,
            confidence=self.confidence,
            note=self.note,
        )


def _finite_array(name: str, values: Sequence[float]) -> np.ndarray:
    a = np.asarray(values, dtype=float).reshape(-1)
    if a.size == 0:
        raise ValueError(f"{name} is empty: need at least one seed")
    bad = ~np.isfinite(a)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name}[{i}] = {a[i]!r} is not finite")
    return a


def relative_change(baseline: float, candidate: float) -> float:
    """``(candidate - baseline) / baseline`` as a fraction; negative = candidate lower.

    Raises:
        ValueError: zero or non-finite baseline, or non-finite candidate.
    """
    return float(paired_change([baseline], [candidate]).per_seed[0])


def summarize_changes(changes: Sequence[float], confidence: float = 0.95) -> PairedChange:
    """Mean and two-sided Student-t interval of already computed per-seed changes.

    The interval is ``mean +- t.ppf((1 + confidence)/2, n - 1) * sd / sqrt(n)``
    with the sample standard deviation (``ddof = 1``; scipy.stats.t). With
    n = 1 the interval is NaN (stated in ``note``) and ``crosses_zero`` is True.
    Output units equal input units (fractions or percent).

    Raises:
        ValueError: empty input, a non-finite change, or ``confidence`` outside (0, 1).
    """
    if not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    a = _finite_array("changes", changes)
    n = int(a.size)
    mean = float(a.mean())
    if n == 1:
        return PairedChange((float(a[0]),), mean, float("nan"), float("nan"), 1, True, float(confidence),
                            "n=1: no confidence interval from a single seed")
    sd = float(a.std(ddof=1))
    half = float(sps.t.ppf(0.5 + confidence / 2.0, df=n - 1)) * sd / math.sqrt(n)
    lo, hi = mean - half, mean + half
    return PairedChange(tuple(float(v) for v in a), mean, lo, hi, n, bool(lo <= 0.0 <= hi), float(confidence))


def paired_change(baseline: Sequence[float], candidate: Sequence[float], confidence: float = 0.95) -> PairedChange:
    """Per-seed relative change ``(candidate - baseline) / baseline`` and its summary across seeds.

    ``baseline[i]`` and ``candidate[i]`` are the same metric (any unit, e.g. P99
    ITL in seconds) of the same seed; shape (n,) each. Changes are fractions
    (negative = candidate lower).

    Raises:
        ValueError: different lengths, empty input, a non-finite value, or a
            zero baseline (named by its position).
    """
    b = _finite_array("baseline", baseline)
    c = _finite_array("candidate", candidate)
    if b.shape != c.shape:
        raise ValueError(f"baseline has {b.size} seeds but candidate has {c.size}: they must be paired")
    zero = b == 0.0
    if zero.any():
        i = int(np.argmax(zero))
        raise ValueError(f"baseline[{i}] is zero: the relative change (candidate - baseline)/baseline is undefined")
    return summarize_changes((c - b) / b, confidence)


def paired_from_frame(
    df: pd.DataFrame,
    metric: str,
    candidate_arm: str,
    baseline_arm: str = "baseline",
    *,
    arm_col: str = "arm",
    seed_col: str = "seed",
    confidence: float = 0.95,
) -> PairedChange:
    """``paired_change`` of ``metric`` between two arms of a summary frame, paired by seed.

    ``df`` has one row per (arm, seed), e.g. ``dlfp.analysis.metrics.summarize_trials``
    output. Only seeds present in both arms are used, in ascending seed order.

    Raises:
        ValueError: ``metric``/``arm_col``/``seed_col`` not a column, an arm
            with no rows, a duplicated (arm, seed) row, no common seed, or the
            errors of ``paired_change``.
    """
    for col in (metric, arm_col, seed_col):
        if col not in df.columns:
            raise ValueError(f"column {col!r} is not in the frame (columns: {list(df.columns)})")
    series = {}
    for arm in (baseline_arm, candidate_arm):
        sub = df[df[arm_col] == arm]
        if sub.empty:
            raise ValueError(f"arm {arm!r} has no rows in the frame")
        if sub[seed_col].duplicated().any():
            raise ValueError(f"arm {arm!r} has more than one row for a seed")
        series[arm] = sub.set_index(seed_col)[metric]
    seeds = sorted(set(series[baseline_arm].index) & set(series[candidate_arm].index))
    if not seeds:
        raise ValueError(f"arms {baseline_arm!r} and {candidate_arm!r} share no seed")
    return paired_change(series[baseline_arm].loc[seeds].to_numpy(dtype=float),
                         series[candidate_arm].loc[seeds].to_numpy(dtype=float), confidence)


__all__ = ["PairedChange", "paired_change", "paired_from_frame", "relative_change", "summarize_changes"]
