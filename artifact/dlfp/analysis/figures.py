"""Figures from saved traces (what ``figures.ipynb`` draws), as tested functions.

Every function takes a ``dlfp.analysis.tables.TraceSet`` (trials already on disk) and
returns a matplotlib ``Figure``; ``save`` writes it as PNG and PDF with fixed
metadata (no creation date) so reruns give the same files up to the renderer.
Times are milliseconds on every axis. One palette maps arm names to colours in
every figure (``arm_palette``). A panel whose data is missing says so in its
place (``placeholder``) instead of being left out or drawn from partial data.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.layout_engine import PlaceHolderLayoutEngine  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from dlfp.analysis import metrics, tables  # noqa: E402
from dlfp.analysis.tables import TraceSet  # noqa: E402

#: Fixed colours of the named arms; any other arm gets the next colour of seaborn's
#: colour-blind palette (in sorted order), fixed-cap arms a sequential ramp by cap.
NAMED_ARM_COLORS = {
    "baseline": "#555555",
    "dlfp": sns.color_palette("colorblind")[0],
    "dlfps": sns.color_palette("colorblind")[2],
}
PNG_METADATA = {"Software": None}
PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}
SVG_HASHSALT = "dlfp"
_CAP_RE = re.compile(r"(?:fixed|cap)[-_]?(\d+)", re.IGNORECASE)


def theme() -> None:
    """The seaborn theme every figure uses (white grid, paper context)."""
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.0)
    plt.rcParams["svg.hashsalt"] = SVG_HASHSALT
    plt.rcParams["pdf.fonttype"] = 3


def fixed_cap_of(arm: str) -> int | None:
    """The cap of a fixed-cap arm named like ``fixed-2048`` / ``cap_2048`` (``None`` otherwise)."""
    m = _CAP_RE.fullmatch(arm)
    return int(m.group(1)) if m else None


def arm_palette(arms: Iterable[str]) -> dict[str, tuple]:
    """Colour per arm, the same for an arm in every figure.

    ``baseline`` grey, ``dlfp`` blue, ``dlfps`` green; fixed-cap arms an
    orange ramp ordered by cap; any other arm the remaining colour-blind
    colours in sorted name order.
    """
    arms = sorted(set(arms))
    out: dict[str, tuple] = {}
    fixed = sorted((a for a in arms if fixed_cap_of(a) is not None), key=fixed_cap_of)
    ramp = sns.color_palette("Oranges", n_colors=max(len(fixed), 1) + 2)[2:]
    for a, c in zip(fixed, ramp):
        out[a] = to_rgb(c)
    spare = [c for i, c in enumerate(sns.color_palette("colorblind")) if i not in (0, 2, 7)]
    k = 0
    for a in arms:
        if a in out:
            continue
        if a in NAMED_ARM_COLORS:
            out[a] = to_rgb(NAMED_ARM_COLORS[a])
        else:
            out[a] = to_rgb(spare[k % len(spare)])
            k += 1
    return out


def _all_arms(ts: TraceSet) -> list[str]:
    return sorted({t.arm for t in ts.trials})


def placeholder(ax, message: str) -> None:
    """Replace a panel's content with a centred message saying which data are missing."""
    ax.clear()
    ax.set_xticks([])
    ax.set_yticks([])
    ax.grid(False)
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=9, color="#aa0000",
            transform=ax.transAxes)


def _grid(n: int, col_wrap: int = 4, size: tuple[float, float] = (3.6, 2.9), sharey: bool = False):
    n = max(n, 1)
    cols = min(col_wrap, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False, sharey=sharey,
                             layout="constrained")
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def shared_legend(fig, axes, ncol: int = 6) -> None:
    """One legend for the whole figure below the panels (each label once, in first-seen order)."""
    seen: dict[str, object] = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if not lab.startswith("_") and lab not in seen:
                seen[lab] = h
    if seen:
        fig.legend(list(seen.values()), list(seen.keys()), loc="outside lower center", ncol=min(ncol, len(seen)),
                   fontsize=8, frameon=False)


def _title(backend: str, experiment: str) -> str:
    return f"{experiment} [{backend}]"


def _group_problems(ts: TraceSet, backend: str, experiment: str) -> str:
    n = len(ts.problems_for(backend, experiment))
    return f"\n({n} corrupt trial(s) not plotted)" if n else ""


def empty_figure(message: str):
    """A one-panel figure holding only ``message`` (no data to draw at all)."""
    theme()
    fig, ax = plt.subplots(figsize=(6, 2.5), layout="constrained")
    placeholder(ax, message)
    return fig


def atomic_savefig(fig, path: Path, fmt: str, **kwargs) -> None:
    """``fig.savefig`` into ``.<name>.tmp-<pid>`` beside ``path``, renamed into place (never a partial file)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, format=fmt, **kwargs)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save(fig, results_dir: str | Path, name: str, *, close: bool = True,
         formats: Sequence[str] = ("png", "pdf")) -> tuple[Path | None, Path | None]:
    """Write ``<results_dir>/<name>.png`` and ``.pdf`` (those in ``formats``) with fixed metadata, atomically.

    No dates, no producer string and a fixed ``svg.hashsalt``: the same
    figure gives byte-identical files on every run.

    The layout is computed once and frozen, so both files share it. Returns
    ``(png_path, pdf_path)``, ``None`` for a format not written.

    Raises:
        ValueError: a format other than png/pdf.
    """
    bad = [f for f in formats if f not in ("png", "pdf")]
    if bad:
        raise ValueError(f"figure format(s) {bad} not supported; use png and/or pdf")
    d = Path(results_dir)
    d.mkdir(parents=True, exist_ok=True)
    engine = fig.get_layout_engine()
    if engine is not None and not isinstance(engine, PlaceHolderLayoutEngine):
        engine.execute(fig)  # lay out once, not once per file
        fig.set_layout_engine("none")
    png = pdf = None
    plt.rcParams["svg.hashsalt"] = SVG_HASHSALT  # ids in vector output from a fixed salt, not a random one
    if "png" in formats:
        png = d / f"{name}.png"
        atomic_savefig(fig, png, "png", dpi=130, metadata=PNG_METADATA)
    if "pdf" in formats:
        pdf = d / f"{name}.pdf"
        atomic_savefig(fig, pdf, "pdf", metadata=PDF_METADATA)
    if close:
        plt.close(fig)
    return png, pdf


def _curve_arms(ts: TraceSet, backend: str, experiment: str) -> list[str]:
    """Arms drawn as curves/points in the per-experiment figures: all but the fixed-cap frontier arms."""
    return [a for a in ts.arms(backend, experiment) if fixed_cap_of(a) is None]


# --------------------------------------------------------------------------- ITL CDF


def ecdf_points(x: np.ndarray, max_points: int = 1500, tail: float = 0.98) -> tuple[np.ndarray, np.ndarray]:
    """The empirical CDF of ``x`` as step points ``(sorted values, fraction <= value)``, thinned for drawing.

    Below the ``tail`` quantile at most ``max_points`` evenly spaced ranks are
    kept (invisible at figure resolution); every point above it is kept, so
    the P99 region is exact. The last point is always (max, 1.0).
    """
    v = np.sort(np.asarray(x, dtype=float))
    n = v.size
    if n == 0:
        return v, v
    y = np.arange(1, n + 1) / n
    cut = int(np.floor(tail * n))
    if cut > max_points:
        keep = np.unique(np.r_[np.linspace(0, cut - 1, max_points).astype(int), np.arange(cut, n)])
        return v[keep], y[keep]
    return v, y


def itl_cdf_figure(ts: TraceSet, col_wrap: int = 4):
    """ITL distribution per experiment: empirical CDF of every inter-token gap (ms, log x), one line per arm.

    Gaps of measured, completed requests are pooled over seeds
    (``dlfp.analysis.metrics.itl_samples``). Fixed-cap frontier arms are left to
    ``frontier_figure``. A group whose trials have no gap shows a placeholder.
    """
    theme()
    groups = ts.groups()
    if not groups:
        return empty_figure(f"ITL CDF: no trials under {ts.root}")
    pal = arm_palette(_all_arms(ts))
    fig, axes = _grid(len(groups), col_wrap)
    for ax, (backend, exp) in zip(axes, groups):
        drawn, seeds_per_arm = False, []
        for arm in _curve_arms(ts, backend, exp):
            parts = [tables.itl_samples(ts, lt) for lt in ts.select(backend, exp, arm)]
            x = np.concatenate(parts) if parts else np.array([])
            x = x[np.isfinite(x) & (x > 0)]
            if x.size == 0:
                continue
            n_seeds = len(parts)
            xs, ys = ecdf_points(metrics.to_ms(x))
            ax.step(xs, ys, where="post", color=pal[arm], lw=1.2, label=arm)
            seeds_per_arm.append(n_seeds)
            drawn = True
        if not drawn:
            placeholder(ax, f"{_title(backend, exp)}:\nno inter-token gaps in the traces")
            continue
        ax.set_xscale("log")
        ax.set_yscale("logit", nonpositive="clip")  # stretches both the body and the P99/P99.9 tail
        ax.set_ylim(0.01, 0.9995)
        seeds = f"{min(seeds_per_arm)}" if min(seeds_per_arm) == max(seeds_per_arm) else \
            f"{min(seeds_per_arm)}-{max(seeds_per_arm)}"
        ax.set_title(f"{_title(backend, exp)}, {seeds} seed(s) per arm" + _group_problems(ts, backend, exp),
                     fontsize=9)
        ax.set_xlabel("inter-token latency (ms, log scale)")
        ax.set_ylabel("fraction of gaps")
        ax.axhline(0.99, color="#999999", lw=0.6, ls=":")
    shared_legend(fig, axes)
    fig.suptitle("ITL distribution per experiment (CDF, logit y; dotted line: P99)")
    return fig


# --------------------------------------------------------------------------- cap trajectory


def _adaptive_arms(ts: TraceSet, backend: str, experiment: str) -> list[str]:
    out = []
    for arm in ts.arms(backend, experiment):
        lts = ts.select(backend, experiment, arm)
        if lts and tables.policy_target_s(lts[0]) is not None:
            out.append(arm)
    return out


def cap_trajectory_figure(ts: TraceSet, backend: str, experiment: str, arm: str | None = None,
                          seed: int | None = None):
    """Cap over time (top) and the observed interval of guarded iterations against the target (bottom), ms.

    Defaults: the first adaptive arm (``dlfp`` if present) and its first seed.
    Guarded iterations are marked on the cap line, coloured by the reason of
    their decision where the policy logs one (DLFP-G). Placeholder when the arm
    or seed has no trial or no guarded iteration.
    """
    theme()
    fig, (ax_cap, ax_int) = plt.subplots(2, 1, figsize=(7.5, 4.8), sharex=True,
                                         gridspec_kw={"height_ratios": [1, 1.2]}, layout="constrained")
    adaptive = _adaptive_arms(ts, backend, experiment)
    if arm is None:
        arm = "dlfp" if "dlfp" in adaptive else (adaptive[0] if adaptive else None)
    lts = ts.select(backend, experiment, arm) if arm else []
    if seed is not None:
        lts = [t for t in lts if t.seed == seed]
    if not lts:
        what = f"arm {arm!r}" if arm else "an adaptive (dlfp/dlfps) arm"
        placeholder(ax_cap, f"{_title(backend, experiment)}: no trial of {what}"
                    + (f" seed {seed}" if seed is not None else ""))
        placeholder(ax_int, "cap trajectory unavailable")
        return fig
    lt = lts[0]
    ct = tables.cap_trajectory(lt.trial)
    target = tables.policy_target_s(lt) or tables.DEFAULT_TARGET_S
    pal = arm_palette(_all_arms(ts))
    g = ct[ct["guarded"]]
    if ct.empty or ct["cap"].isna().all():
        placeholder(ax_cap, f"{_title(backend, experiment)} {arm} seed {lt.seed}: no cap recorded")
    else:
        ax_cap.step(ct["time_s"], ct["cap"], where="post", color=pal[arm], lw=1.0, label=f"cap in force ({arm})",
                    rasterized=len(ct) > 5000)
        reasons = tables.decision_reasons(lt.trial, g["iteration"].to_numpy())
        marks = [("guarded iteration", pal[arm], np.ones(len(g), bool))] if reasons is None else [
            (f"guarded: {r}", c, reasons == r) for r, c in zip(sorted(set(reasons)), sns.color_palette("Dark2", 8))]
        for label, c, m in marks:  # DLFP-G logs why each chunk was chosen: one colour per reason
            ax_cap.plot(g["time_s"].to_numpy()[m], g["cap"].to_numpy()[m], "o", ms=2.5, color=c, alpha=0.6,
                        label=label, rasterized=True)
        ax_cap.set_ylabel("prefill cap (tokens)")
        ax_cap.legend(fontsize=7, loc="upper right")
    ax_cap.set_title(f"{_title(backend, experiment)}: {arm}, seed {lt.seed}{_group_problems(ts, backend, experiment)}",
                     fontsize=9)
    obs = g["observed_interval_s"].to_numpy(float)
    if g.empty or not np.isfinite(obs).any():
        placeholder(ax_int, "no guarded iteration with an observed interval")
    else:
        ax_int.plot(g["time_s"], metrics.to_ms(obs), ".", ms=3, color=pal[arm], label="observed interval (guarded)",
                    rasterized=True)
        ax_int.axhline(metrics.to_ms(target), color="#cc0000", ls="--", lw=1,
                       label=f"target {metrics.to_ms(target):.0f} ms")
        ax_int.set_ylabel("interval (ms)")
        ax_int.legend(fontsize=7, loc="upper right")
    ax_int.set_xlabel("time since trial start (s)")
    return fig


# --------------------------------------------------------------------------- root cause


def _root_cause_order(ts: TraceSet) -> list[tuple[str, str]]:
    """Groups ordered small single-GPU models first, then larger or TP configurations."""
    def key(g):
        cfg = ts.config(*g)
        tp = cfg.tp if cfg else 1
        model = cfg.model if cfg else g[1]
        m = re.search(r"(\d+(?:\.\d+)?)b", model.lower())
        size = float(m.group(1)) if m else 0.0
        return (tp > 1 or size > 1.0, size, tp, g)
    return sorted(ts.groups(), key=key)


def root_cause_figure(ts: TraceSet, col_wrap: int = 4):
    """Host interval vs completed device time per guarded iteration (ms), one panel per experiment.

    Small single-GPU configurations come first, then larger or TP ones. Each
    panel shows the guarded iterations of the paper's ``dlfp`` arm (else the
    first adaptive arm; every arm is in ``tables.root_cause``), seeds pooled, the
    y = x line, and Pearson r with the same batch's device time (own) and
    with the previous batch's (prev), from ``tables.root_cause``.
    """
    theme()
    groups = _root_cause_order(ts)
    if not groups:
        return empty_figure(f"root cause: no trials under {ts.root}")
    rc = tables.root_cause(ts)
    pal = arm_palette(_all_arms(ts))
    fig, axes = _grid(len(groups), col_wrap, size=(3.4, 3.2))
    for ax, (backend, exp) in zip(axes, groups):
        adaptive = _adaptive_arms(ts, backend, exp)
        arms = ["dlfp"] if "dlfp" in adaptive else adaptive[:1]  # the paper's controller; all arms in the table
        drawn, notes = False, []
        lim = 0.0
        for arm in arms:
            frames = [tables.guarded_of(ts, lt) for lt in ts.select(backend, exp, arm)]
            g = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
            if g.empty:
                continue
            h, d = g["host_interval_s"].to_numpy(float), g["device_time_s"].to_numpy(float)
            ok = np.isfinite(h) & np.isfinite(d)
            if not ok.any():
                continue
            ax.scatter(metrics.to_ms(d[ok]), metrics.to_ms(h[ok]), s=5, alpha=0.4, color=pal[arm], label=arm,
                       linewidths=0, rasterized=True)
            lim = max(lim, float(np.nanmax(metrics.to_ms(d[ok]))), float(np.nanmax(metrics.to_ms(h[ok]))))
            r = rc[(rc["backend"] == backend) & (rc["experiment"] == exp) & (rc["arm"] == arm)]
            if not r.empty:
                notes.append(f"{arm}: r_own={r['r_own'].iloc[0]:.2f}, r_prev={r['r_prev'].iloc[0]:.2f}")
            drawn = True
        if not drawn:
            placeholder(ax, f"{_title(backend, exp)}:\nno guarded iteration with both\nhost interval and device time")
            continue
        ax.plot([0, lim * 1.05], [0, lim * 1.05], color="#999999", lw=0.7, ls="--")
        ax.set_xlabel("device time of the iteration (ms)")
        ax.set_ylabel("host scheduler interval (ms)")
        ax.set_title(_title(backend, exp) + "\n" + "\n".join(notes) + _group_problems(ts, backend, exp), fontsize=8)
    shared_legend(fig, axes)
    fig.suptitle("Root cause: does the host cadence track completed device work? (dashed: y = x)")
    return fig


# --------------------------------------------------------------------------- trade-off


def tradeoff_figure(ts: TraceSet, col_wrap: int = 4):
    """TTFT/ITL trade-off per experiment: paired change of P99 TTFT (x) and P99 ITL (y), % vs baseline.

    One point per non-baseline arm (fixed-cap frontier arms excluded: see
    ``frontier_figure``) at the mean with its paired 95 % interval
    as error bars; per-seed changes as faint dots. Negative = lower than the
    baseline (lower-left is better on both).
    """
    theme()
    groups = ts.groups()
    if not groups:
        return empty_figure(f"trade-off: no trials under {ts.root}")
    pal = arm_palette(_all_arms(ts))
    fig, axes = _grid(len(groups), col_wrap, size=(3.4, 3.2))
    for ax, (backend, exp) in zip(axes, groups):
        base = ts.baseline_arm(backend, exp)
        drawn, n_pairs = False, []
        for arm in _curve_arms(ts, backend, exp):
            if arm == base:
                continue
            it = tables.paired(ts, backend, exp, arm, "p99_itl_ms")
            tt = tables.paired(ts, backend, exp, arm, "p99_ttft_ms")
            if it is None or tt is None:
                continue
            ax.scatter(tt.per_seed, it.per_seed, s=10, alpha=0.35, color=pal[arm], linewidths=0)
            xerr = None if not np.isfinite(tt.ci_low) else [[tt.mean - tt.ci_low], [tt.ci_high - tt.mean]]
            yerr = None if not np.isfinite(it.ci_low) else [[it.mean - it.ci_low], [it.ci_high - it.mean]]
            ax.errorbar([tt.mean], [it.mean], xerr=xerr, yerr=yerr, fmt="o", ms=5, color=pal[arm], capsize=2,
                        label=arm)
            n_pairs.append(it.n)
            drawn = True
        if not drawn:
            placeholder(ax, f"{_title(backend, exp)}:\nno candidate arm paired with\nbaseline {base!r} on any seed")
            continue
        ax.axhline(0, color="#999999", lw=0.7)
        ax.axvline(0, color="#999999", lw=0.7)
        ax.set_xlabel("P99 TTFT change vs baseline (%)")
        ax.set_ylabel("P99 ITL change vs baseline (%)")
        ax.set_title(f"{_title(backend, exp)}, n = {min(n_pairs)} paired seed(s)" + _group_problems(ts, backend, exp),
                     fontsize=9)
    shared_legend(fig, axes)
    fig.suptitle("TTFT/ITL trade-off: paired change with 95 % interval (negative = lower)")
    return fig


def _marker(arm: str, baseline: str) -> tuple[str, float]:
    if arm == baseline:
        return "X", 8.0
    if fixed_cap_of(arm) is not None:
        return "o", 4.0
    return ("D", 6.0) if arm == "dlfp" else ("s", 5.5)


def frontier_figure(ts: TraceSet, col_wrap: int = 4):
    """P99 ITL against P99 TTFT per arm (ms, mean over seeds), one panel per experiment.

    Fixed-cap arms (``fixed-<cap>``) are joined in cap order: the fixed-cap
    frontier. The baseline (X), DLFP (diamond) and other adaptive arms
    (squares) are separate points. No error bars: seeds are different
    workloads, so the spread of absolute values across seeds says little;
    paired effects and their intervals are in ``tradeoff_figure``.
    """
    theme()
    groups = ts.groups()
    if not groups:
        return empty_figure(f"frontier: no trials under {ts.root}")
    pts = tables.arm_points(ts)
    pal = arm_palette(_all_arms(ts))
    fig, axes = _grid(len(groups), col_wrap, size=(3.4, 3.2))
    for ax, (backend, exp) in zip(axes, groups):
        base = ts.baseline_arm(backend, exp)
        g = pts[(pts["backend"] == backend) & (pts["experiment"] == exp)].dropna(
            subset=["p99_itl_ms_mean", "p99_ttft_ms_mean"])
        if g.empty:
            placeholder(ax, f"{_title(backend, exp)}: no arm with P99 TTFT and ITL")
            continue
        fixed = g[[fixed_cap_of(a) is not None for a in g["arm"]]]
        if len(fixed) > 1:
            fixed = fixed.assign(_cap=[fixed_cap_of(a) for a in fixed["arm"]]).sort_values("_cap")
            ax.plot(fixed["p99_ttft_ms_mean"], fixed["p99_itl_ms_mean"], "-", color="#e6a060", lw=1, zorder=1,
                    label="fixed caps (in cap order)")
        for _, r in g.iterrows():
            m, ms = _marker(r["arm"], base)
            ax.plot([r["p99_ttft_ms_mean"]], [r["p99_itl_ms_mean"]], m, ms=ms, color=pal[r["arm"]],
                    markeredgecolor="white" if fixed_cap_of(r["arm"]) is None else "none", markeredgewidth=0.6,
                    label=r["arm"], zorder=3 if fixed_cap_of(r["arm"]) is None else 2)
        n = int(g["seeds"].min())
        ax.set_xlabel("P99 TTFT (ms)")
        ax.set_ylabel("P99 ITL (ms)")
        ax.set_title(f"{_title(backend, exp)}, mean of {n} seed(s)" + _group_problems(ts, backend, exp), fontsize=9)
    shared_legend(fig, axes, ncol=8)
    fig.suptitle("Fixed-cap frontier: P99 ITL vs P99 TTFT per arm (lower left is better)")
    return fig


def fidelity_images(fidelity_dir: str | Path,
                    calibration_dir: str | Path | None = None) -> list[tuple[str, Path | None]]:
    """The simulator-fidelity figures written by ``dlfp validate-sim`` / ``dlfp calibrate``, for display.

    Returns ``(label, path)`` pairs in display order: the ITL CDF overlay and the
    cap trajectories (``<fidelity_dir>/itl_cdf_overlay.png``, ``cap_trajectories.png``)
    and, when ``calibration_dir`` is given, the fit residuals
    (``<calibration_dir>/residuals.png``). ``path`` is ``None`` for a file that
    does not exist, so the caller can say so in its place. Nothing is re-run.
    """
    wanted = [("ITL CDFs: real engine vs simulator", Path(fidelity_dir) / "itl_cdf_overlay.png"),
              ("DLFP cap trajectories: real engine vs simulator", Path(fidelity_dir) / "cap_trajectories.png")]
    if calibration_dir is not None:
        wanted.append(("calibration residuals", Path(calibration_dir) / "residuals.png"))
    return [(label, p if p.is_file() else None) for label, p in wanted]
