"""DLFP-S's feasibility test: a counterfactual check of the decode-gap tail.

Chunking must never make ITL worse, and whether it does depends on how often
stalls happen, not only on how long one is: a cap turns one long stall into
several shorter ones, which lowers the decode-gap P99 when stalls already hold
more than 1 % of the gaps and raises it when they hold less (then the P99 sits
on plain decode steps and the extra medium-length gaps push it up).

Every decode-carrying iteration gives each of its ``d`` decoding streams one
inter-token gap equal to its interval, so the per-token gap distribution is
the distribution of iteration times weighted by ``num_decodes``. From one
window of iterations, :func:`counterfactual_gaps` rebuilds the gap
distribution the engine would have produced under a prefill limit ``L``:
decode-only iterations are kept; each maximal run of consecutive mixed
iterations (``P`` prefill tokens, excess device time ``E`` over the median
decode-only step ``t0``, ``D`` decode-slots over ``k`` iterations) becomes
``n = ceil(P / L)`` iterations of ``t0 + E / n`` seconds with ``D / k``
decodes each: prefill cost is spread linearly over the chunks. ``L`` is the
candidate cap, or for "no cap" the largest prefill chunk seen in any iteration
(the engine's own token budget). Both sides are rebuilt by the same model, so
its bias cancels, and both come from the same arrivals, so load drift between
periods does not enter (the flaw of comparing a capped period with an
uncapped one).

:func:`compare_tails` uses the cap only if it lowers the ``tail_quantile`` gap
by more than ``margin`` *and* is not worse (by more than ``margin``) at any
quantile whose tail mass lies between ``tail_band`` times larger and smaller
(P98 to P99.5 for P99 with band 2; ``TAIL_GRID`` quantiles evenly spaced in log
tail mass, :func:`tail_quantiles`): the controller sees warm-ups and a finite
window, so the tail mass it measures is uncertain by about that factor, and a
decision that flips inside that band is a coin toss (the P99 knife-edge).

History: the first version compared the P99 of the last capped window with
that of an uncapped window from another period and re-probed blindly with
back-off; on the simulator that test was dominated by load differences
between the two periods (a start-up burst in the reference made any cap look
better) and left Qwen3-0.6B at +60..330 % P99 ITL. This counterfactual band
check replaced it.
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Number of quantiles the tail check compares across its band (odd: the middle one is tail_quantile).
TAIL_GRID = 17


def weighted_quantile(values: list[float], weights: list[float], q: float) -> float:
    """Lower weighted quantile: smallest ``v`` with cumulative weight >= ``q`` * total.

    Raises:
        ValueError: empty input or non-positive total weight.
    """
    total = float(sum(weights))
    if not values or total <= 0:
        raise ValueError("weighted_quantile needs at least one sample with positive weight")
    pairs = sorted(zip(values, weights))
    need = q * total
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= need - 1e-12 * total:
            return v
    return pairs[-1][0]


def weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs) -> list[float]:
    """:func:`weighted_quantile` at several ``qs`` at once (lower weighted quantile).

    Raises:
        ValueError: empty input or non-positive total weight.
    """
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    total = float(w.sum())
    if v.size == 0 or total <= 0:
        raise ValueError("weighted_quantiles needs at least one sample with positive weight")
    order = np.argsort(v, kind="stable")
    cw = np.cumsum(w[order])
    out = []
    for q in qs:
        i = int(np.searchsorted(cw, q * total - 1e-12 * total, side="left"))
        out.append(float(v[order][min(i, v.size - 1)]))
    return out


class IterationWindow:
    """The last ``size`` iterations as three columns: prefill tokens, decodes, interval (s).

    Appending is O(1) amortised and makes no numpy call (``array.array`` columns, trimmed to ``size`` rows once
    they hold ``2 * size``); :meth:`columns` hands the tail check float64 copies, shape ``(len(self),)`` each,
    in iteration order. Holds the same rows as ``collections.deque(maxlen=size)`` of the tuples would.

    Raises:
        ValueError: ``size < 1``.
    """

    __slots__ = ("size", "_p", "_d", "_t")

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"IterationWindow: size must be >= 1, got {size!r}")
        self.size = int(size)
        self._p, self._d, self._t = array("d"), array("d"), array("d")

    def append(self, prefill_tokens: int, num_decodes: int, interval_s: float) -> None:
        self._p.append(prefill_tokens)
        self._d.append(num_decodes)
        self._t.append(interval_s)
        if len(self._p) >= 2 * self.size:
            keep = -self.size
            del self._p[:keep], self._d[:keep], self._t[:keep]

    def __len__(self) -> int:
        return min(len(self._p), self.size)

    def __iter__(self):
        """``(prefill_tokens, num_decodes, interval_s)`` rows, oldest first (counts as ints)."""
        n = len(self)
        for p, d, t in zip(self._p[-n:], self._d[-n:], self._t[-n:]):
            yield int(p), int(d), t

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the kept rows' columns ``(prefill_tokens, num_decodes, interval_s)`` as float64 arrays."""
        n = len(self)
        return tuple(np.frombuffer(a, dtype=float)[len(a) - n:].copy() for a in (self._p, self._d, self._t))


def _columns(entries) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if isinstance(entries, IterationWindow):
        return entries.columns()
    a = np.asarray(entries, dtype=float).reshape(-1, 3)
    return a[:, 0], a[:, 1], a[:, 2]


class _Runs:
    """The part of :func:`counterfactual_gaps` that does not depend on the limit (computed once per window)."""

    __slots__ = ("empty", "t0", "dec_vals", "dec_wts", "P", "E", "D", "k")

    def __init__(self, p: np.ndarray, d: np.ndarray, t: np.ndarray):
        dec = (p == 0) & (d > 0)
        mixed = (p > 0) & (d > 0)
        self.empty = not (dec.any() or mixed.any())
        if self.empty:
            return
        self.t0 = float(np.median(t[dec])) if dec.any() else float(t[mixed].min())
        self.dec_vals, self.dec_wts = t[dec], d[dec]
        self.P = None
        if mixed.any():
            run = np.cumsum(~mixed)[mixed]  # run id: constant over consecutive mixed iterations
            _, inv = np.unique(run, return_inverse=True)
            self.P = np.bincount(inv, weights=p[mixed])
            self.E = np.bincount(inv, weights=np.maximum(t[mixed] - self.t0, 0.0))
            self.D = np.bincount(inv, weights=d[mixed])
            self.k = np.bincount(inv).astype(float)

    def under(self, limit: float) -> tuple[np.ndarray, np.ndarray]:
        if self.empty:
            return np.zeros(0), np.zeros(0)
        vals, wts = [self.dec_vals], [self.dec_wts]
        if self.P is not None:
            n = np.maximum(1.0, np.ceil(self.P / float(limit) - 1e-9))
            vals.append(self.t0 + self.E / n)
            wts.append(n * self.D / self.k)
        return np.concatenate(vals), np.concatenate(wts)


def counterfactual_gaps(entries, limit: float) -> tuple[np.ndarray, np.ndarray]:
    """Decode-gap distribution a window of iterations would have had under prefill limit ``limit``.

    Args:
        entries: sequence of ``(prefill_tokens, num_decodes, interval_s)`` in
            iteration order, or an :class:`IterationWindow` (any iterations;
            ``num_decodes == 0`` ones give no gap and end a mixed run).
        limit: prefill tokens allowed per mixed iteration (> 0).

    Returns:
        ``(values_s, weights)``, float arrays of equal shape (m,): each
        decode-only iteration as it was (weight = its decodes) and, for each
        maximal run of consecutive mixed iterations with ``P`` prefill tokens,
        ``k`` iterations, ``D`` decode-slots and excess time ``E = sum(max(t -
        t0, 0))``, one entry ``t0 + E / n`` with weight ``n * D / k`` where
        ``n = max(1, ceil(P / limit))``. ``t0`` is the median decode-only
        interval, or the smallest mixed interval when the window has no
        decode-only iteration. Empty arrays when no iteration has decodes.

    Raises:
        ValueError: ``limit`` not positive.
    """
    if not limit > 0:
        raise ValueError(f"counterfactual_gaps: limit must be positive, got {limit!r}")
    return _Runs(*_columns(entries)).under(limit)


def tail_quantiles(tail_quantile: float, tail_band: float) -> tuple[float, ...]:
    """The quantiles the tail check compares, ascending, shape (TAIL_GRID,).

    Tail masses ``m * band ** x`` for ``x`` evenly spaced from 1 down to -1
    (``m = 1 - tail_quantile``), i.e. from ``1 - m * band`` to ``1 - m /
    band``; the middle one is ``tail_quantile``. With ``tail_band = 1``
    just ``(tail_quantile,)``.
    """
    m = 1.0 - tail_quantile
    if tail_band == 1.0:
        return (tail_quantile,)
    xs = np.linspace(1.0, -1.0, TAIL_GRID)
    qs = [1.0 - m * tail_band**x for x in xs]
    qs[TAIL_GRID // 2] = tail_quantile
    return tuple(float(q) for q in qs)


def compare_tails(
    window: "Sequence[tuple[int, int, float]] | IterationWindow", limit: int, no_cap_limit: int,
    quantiles: tuple[float, ...], tail_quantile: float, margin: float,
) -> tuple[bool, dict[str, Any] | None]:
    """Whether capping at ``limit`` tokens beats no cap on the rebuilt tail of ``window``.

    Rebuilds the window under ``limit`` and under ``no_cap_limit`` (the largest
    prefill chunk seen) with :func:`counterfactual_gaps` and compares them at
    ``quantiles`` (which contain ``tail_quantile``): the cap must be lower than
    no cap by more than ``margin`` (relative) at ``tail_quantile`` and not
    higher by more than ``margin`` at every quantile.

    Returns:
        ``(cap_wins, numbers)``: ``numbers`` is ``{"quantiles", "capped",
        "uncapped", "limit", "no_cap_limit"}`` (seconds, tokens), or ``None``
        (and ``cap_wins`` False) when the window is empty, has no gap, or no
        prefill chunk larger than ``limit`` was seen (a cap that never binds
        cannot help).
    """
    if not len(window) or no_cap_limit <= limit:
        return False, None
    if not limit > 0:
        raise ValueError(f"compare_tails: limit must be positive, got {limit!r}")
    runs = _Runs(*_columns(window))  # one pass over the window serves both limits
    cv, cw = runs.under(limit)
    uv, uw = runs.under(no_cap_limit)
    if cv.size == 0 or cw.sum() <= 0:
        return False, None
    qc = weighted_quantiles(cv, cw, quantiles)
    qu = weighted_quantiles(uv, uw, quantiles)
    numbers = {"quantiles": quantiles, "capped": qc, "uncapped": qu, "limit": limit, "no_cap_limit": no_cap_limit}
    mid = quantiles.index(tail_quantile)
    better = qc[mid] < qu[mid] * (1.0 - margin)
    no_worse = all(c <= u * (1.0 + margin) for c, u in zip(qc, qu))
    return bool(better and no_worse), numbers


__all__ = [
    "IterationWindow",
    "TAIL_GRID",
    "compare_tails",
    "counterfactual_gaps",
    "tail_quantiles",
    "weighted_quantile",
    "weighted_quantiles",
]
