"""A candidate arm against the fixed-cap frontier on (P99 TTFT, P99 ITL).

The arms ``fixed-<cap>`` run the engine with a fixed prefill cap; small caps give low P99 ITL and high P99 TTFT.
Their lower envelope, with straight segments between consecutive caps, is the frontier: the P99 ITL a fixed cap
reaches at a given P99 TTFT. Linear interpolation between two caps is an ASSUMPTION (a cap in between, or a mix
of the two, is taken to land on the segment); nothing here measures it.

Input: a frame with one row per (experiment, arm, seed) and columns ``experiment``, ``arm``, ``seed``,
``itl_p99_s``, ``ttft_p99_s``, as ``dlfp.analysis.tables.dlfps.evaluation_frame`` builds it. Values are seconds
in code; only the ``detail`` text is in milliseconds. Gaps follow the sign of ``dlfp.analysis.stats``:
NEGATIVE = the candidate's P99 ITL is below the frontier.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlfp.analysis.stats import summarize_changes

REQUIRED = ("experiment", "arm", "seed", "itl_p99_s", "ttft_p99_s")
METRICS = ["itl_p99_s", "ttft_p99_s"]
FRONTIER_COLUMNS = ["experiment", "n_seeds", "candidate_itl_p99_s", "candidate_ttft_p99_s", "frontier_itl_p99_s",
                    "gap_s_mean", "gap_s_ci_low", "gap_s_ci_high", "best_fixed_arm", "on_or_below", "detail"]


def _envelope_index(ttft_s, itl_s) -> np.ndarray:
    t = np.asarray(ttft_s, dtype=float).reshape(-1)
    i = np.asarray(itl_s, dtype=float).reshape(-1)
    if t.shape != i.shape:
        raise ValueError(f"ttft_s has {t.size} points but itl_s has {i.size}")
    if not (np.isfinite(t).all() and np.isfinite(i).all()):
        raise ValueError("ttft_s and itl_s must be finite")
    keep, best = [], np.inf
    for k in np.lexsort((i, t)):  # TTFT ascending, ties by ITL ascending
        if i[k] < best:
            keep.append(int(k))
            best = i[k]
    return np.asarray(keep, dtype=int)


def lower_envelope(ttft_s, itl_s) -> tuple[np.ndarray, np.ndarray]:
    """The Pareto-lower points of (P99 TTFT, P99 ITL), both in seconds.

    ``ttft_s``, ``itl_s``: shape (n,) each. A point is dropped when another has TTFT <= and ITL <= with at least
    one strict (of identical points one is kept). Returns ``(t, i)``, shape (m,) each, m <= n, TTFT strictly
    ascending and ITL strictly decreasing; empty input gives empty arrays.

    Raises:
        ValueError: different lengths, or a non-finite value.
    """
    k = _envelope_index(ttft_s, itl_s)
    return np.asarray(ttft_s, dtype=float).reshape(-1)[k], np.asarray(itl_s, dtype=float).reshape(-1)[k]


def frontier_itl_at(ttft_s: float, env_t, env_i) -> float:
    """The frontier's P99 ITL (s) at P99 TTFT ``ttft_s`` (s), from a ``lower_envelope`` ``(env_t, env_i)``.

    The best P99 ITL reachable by a fixed cap with TTFT <= ``ttft_s``, linearly interpolated between consecutive
    envelope points (an assumption: the straight segment between two caps). Below the smallest envelope TTFT
    (or with an empty envelope) it is ``+inf``: no fixed cap reaches that TTFT, so any ITL is below the frontier.
    At or beyond the largest envelope TTFT it is the last (smallest) ITL.

    Raises:
        ValueError: ``ttft_s`` is NaN, or ``env_t``/``env_i`` differ in length.
    """
    x = float(ttft_s)
    t, i = np.asarray(env_t, dtype=float).reshape(-1), np.asarray(env_i, dtype=float).reshape(-1)
    if np.isnan(x):
        raise ValueError("ttft_s is NaN")
    if t.shape != i.shape:
        raise ValueError(f"env_t has {t.size} points but env_i has {i.size}")
    if t.size == 0 or x < t[0]:
        return float("inf")
    return float(i[-1]) if x >= t[-1] else float(np.interp(x, t, i))


def _where(x: float, t: np.ndarray, names: list[str]) -> str:
    if x < t[0]:
        return "below every fixed cap's TTFT"
    if x >= t[-1]:
        return f"at {names[-1]}" if x == t[-1] else f"beyond {names[-1]}"
    k = int(np.searchsorted(t, x, side="right")) - 1
    return f"at {names[k]}" if x == t[k] else f"between {names[k]} and {names[k + 1]}"


def _ms(v: float) -> str:
    return f"{1e3 * v:+.1f}" if np.isfinite(v) else ("-inf" if v < 0 else "+inf")


def _experiment_row(exp: str, sub: pd.DataFrame, candidate: str, fixed: list[str]) -> dict | None:
    by_arm = {a: g.set_index("seed")[METRICS] for a, g in sub.groupby("arm")}
    cand = by_arm[candidate]
    seeds = sorted(s for s in cand.index if all(s in by_arm[a].index for a in fixed))
    skipped = sorted(set(cand.index) - set(seeds))
    if not seeds:
        return None
    gaps, fronts = [], []
    for s in seeds:
        env_t, env_i = lower_envelope([by_arm[a].at[s, "ttft_p99_s"] for a in fixed],
                                      [by_arm[a].at[s, "itl_p99_s"] for a in fixed])
        front = frontier_itl_at(cand.at[s, "ttft_p99_s"], env_t, env_i)
        fronts.append(front)
        gaps.append(cand.at[s, "itl_p99_s"] - front)
    gaps_a = np.asarray(gaps, dtype=float)
    finite = gaps_a[np.isfinite(gaps_a)]
    c_itl, c_ttft = (float(cand.loc[seeds, m].mean()) for m in METRICS)
    mean = float(gaps_a.mean())  # -inf when any seed's gap is -inf
    lo = hi = float("nan")
    if finite.size >= 2:
        ch = summarize_changes(finite)  # a t interval in the input's unit (seconds), over the finite gaps only
        lo, hi = ch.ci_low, ch.ci_high
    on_or_below = bool(lo <= 0.0) if finite.size >= 2 else bool(mean <= 0.0)
    pts = pd.DataFrame({a: by_arm[a].loc[seeds].mean() for a in fixed}).T  # index = fixed arm, seed means
    reach = pts[pts["ttft_p99_s"] <= c_ttft]
    best = str(reach["itl_p99_s"].idxmin()) if len(reach) else ""
    k = _envelope_index(pts["ttft_p99_s"], pts["itl_p99_s"])
    where = _where(c_ttft, pts["ttft_p99_s"].to_numpy()[k], [str(pts.index[j]) for j in k])
    n_inf = int(gaps_a.size - finite.size)
    front_mean = float(np.mean(fronts))
    detail = (f"P99 ITL {1e3 * c_itl:.1f} ms at P99 TTFT {1e3 * c_ttft:,.0f} ms; frontier "
              + (f"{1e3 * front_mean:.1f} ms" if np.isfinite(front_mean) else "+inf") + f" there ({where}); ")
    if n_inf:
        detail += f"gap -inf in {n_inf} of {len(seeds)} seeds (TTFT below every fixed cap's); "
    if finite.size >= 2:
        detail += (f"gap {_ms(float(finite.mean()))} ms [95 % CI {_ms(lo)}, {_ms(hi)}]"
                   + (f" over the {finite.size} finite seeds" if n_inf else ""))
    elif finite.size == 1:
        detail += f"gap {_ms(float(finite[0]))} ms (one " + ("finite " if n_inf else "") + "seed, no CI)"
    if skipped:
        detail += (f"; seed{'s' if len(skipped) > 1 else ''} {', '.join(map(str, skipped))} skipped "
                   "(missing a fixed arm)")
    return dict(experiment=exp, n_seeds=len(seeds), candidate_itl_p99_s=c_itl, candidate_ttft_p99_s=c_ttft,
                frontier_itl_p99_s=front_mean, gap_s_mean=mean, gap_s_ci_low=lo, gap_s_ci_high=hi,
                best_fixed_arm=best, on_or_below=on_or_below, detail=detail.rstrip("; "))


def frontier_comparison(df: pd.DataFrame, candidate: str, fixed_prefix: str = "fixed-") -> pd.DataFrame:
    """Per experiment: is ``candidate``'s (P99 ITL, P99 TTFT) on or below the fixed-cap frontier?

    One row per experiment (sorted) that has the ``candidate`` arm and at least two ``<fixed_prefix>*`` arms;
    columns ``FRONTIER_COLUMNS``, seconds. Per seed, the gap is the candidate's P99 ITL minus the frontier
    (``frontier_itl_at`` on ``lower_envelope`` of that seed's own fixed-cap points) at the candidate's P99 TTFT of
    that seed. Seeds present for the candidate but missing any fixed arm of the experiment are skipped (``n_seeds``
    counts the used ones, ``detail`` names the skipped ones); an experiment left with no seed is skipped.

    * ``candidate_itl_p99_s``, ``candidate_ttft_p99_s``: seed means; ``frontier_itl_p99_s``: mean of the per-seed
      frontier values (``+inf`` when any seed's is).
    * Infinite gaps: a seed whose candidate TTFT is below every fixed cap's has frontier ``+inf`` and gap ``-inf``.
      ``gap_s_mean`` is the mean over all used seeds (so ``-inf`` if any gap is); ``gap_s_ci_low``/``_high`` are
      the two-sided 95 % Student-t interval (``dlfp.analysis.stats.summarize_changes``) over the FINITE gaps only,
      NaN when fewer than two gaps are finite (e.g. one seed).
    * ``on_or_below``: with >= 2 finite gaps, ``gap_s_ci_low <= 0`` (not significantly above the frontier; the
      ``-inf`` seeds can only strengthen this); otherwise ``gap_s_mean <= 0`` (one seed: its gap <= 0; a ``-inf``
      gap counts as below).
    * ``best_fixed_arm``: the fixed arm with the lowest mean P99 ITL among those whose mean P99 TTFT <= the
      candidate's mean (over the used seeds); "" if none.
    * ``detail``: a sentence in milliseconds; the bracketing caps are read off the envelope of the seed means.

    Raises:
        ValueError: a required column is missing (named), a duplicated (experiment, arm, seed) row, or a
            non-finite P99 value in a used arm.
    """
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"frame lacks column(s) {missing} (columns: {list(df.columns)})")
    rows = []
    for exp, sub in df.groupby("experiment", sort=True):
        fixed = sorted({str(a) for a in sub["arm"] if str(a).startswith(fixed_prefix)})
        if candidate not in set(sub["arm"]) or len(fixed) < 2:
            continue
        used = sub[sub["arm"].isin(fixed + [candidate])]
        if used.duplicated(["arm", "seed"]).any():
            raise ValueError(f"experiment {exp!r} has more than one row for an (arm, seed)")
        if not np.isfinite(used[METRICS].to_numpy(dtype=float)).all():
            raise ValueError(f"experiment {exp!r} has a non-finite P99 value in {candidate!r} or a fixed arm")
        row = _experiment_row(str(exp), used, candidate, fixed)
        if row is not None:
            rows.append(row)
    return pd.DataFrame(rows, columns=FRONTIER_COLUMNS)


__all__ = ["FRONTIER_COLUMNS", "frontier_comparison", "frontier_itl_at", "lower_envelope"]
