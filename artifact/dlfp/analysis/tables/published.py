"""The paper's published numbers (``data/paper/published.csv``) beside the numbers reproduced from the traces.

Changes are in percent, ``(candidate - baseline) / baseline * 100`` of the
same seed, NEGATIVE = lower (``dlfp.analysis.stats``; published.csv uses the
same sign). Latencies are milliseconds; SLO passes are counted per trial.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dlfp.analysis.markdown import write_table, yes_no
from dlfp.analysis.tables.checks import IDENTICAL_WORKLOADS
from dlfp.analysis.tables.loading import TraceSet, mark_incomplete
from dlfp.backends import get_backend
from dlfp.analysis.tables.summaries import change_column, headline_per_seed, paired

PUBLISHED_COLUMNS = ("experiment", "metric", "arm_or_change", "value", "unit", "source_sentence", "direction")
#: published.csv ``metric`` -> ``trial_summaries`` column.
PUBLISHED_METRICS = {
    "p99_itl": "p99_itl_ms",
    "p99_ttft": "p99_ttft_ms",
    "p99_e2el": "p99_e2el_ms",
    "energy_per_output_token": "energy_per_token_j",
    "slo_passes": "slo_passes",
}
#: ``agrees`` of a claim that holds on a backend whatever the engine does (``Backend.modelled_outputs``).
BY_CONSTRUCTION = "by construction"
PVR_COLUMNS = ["backend", "experiment", "metric", "arm_or_change", "unit", "published", "published_direction",
               "published_qualitative", "reproduced", "reproduced_direction", "agrees", "within_interval",
               "paper_interval", "note", "source_sentence"]


def load_published(path: str | Path) -> pd.DataFrame:
    """Read ``data/paper/published.csv`` (``value`` numeric, NaN where empty; ``qualitative`` added if absent).

    Raises:
        FileNotFoundError: the file does not exist (message names it).
        ValueError: a required column is missing (named).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"published numbers {p} do not exist")
    df = pd.read_csv(p, dtype={"experiment": str, "metric": str, "arm_or_change": str, "unit": str,
                               "direction": str, "source_sentence": str}, keep_default_na=False)
    missing = [c for c in PUBLISHED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{p}: missing column(s) {missing}")
    if "qualitative" not in df.columns:
        df["qualitative"] = ""
    df["value"] = pd.to_numeric(df["value"].replace("", np.nan), errors="coerce")
    return df


def _direction(x: float, tol: float = 0.0) -> str:
    if x is None or not np.isfinite(x):
        return ""
    return "increase" if x > tol else "decrease" if x < -tol else "none"


def _published_value(pubs: pd.DataFrame, pub: pd.Series, metric: str | None,
                     which: str | None = None) -> float | None:
    """The value of a sibling row of ``pub`` (same experiment; ``metric``/``arm_or_change`` replaced)."""
    m = pubs[(pubs["experiment"] == pub["experiment"]) & (pubs["metric"] == (metric or pub["metric"]))
             & (pubs["arm_or_change"] == (which or pub["arm_or_change"]))]
    if m.empty or not np.isfinite(m["value"].iloc[0]):
        return None
    return float(m["value"].iloc[0])


def _published_ci(pubs: pd.DataFrame, pub: pd.Series) -> tuple[float, float] | None:
    """The published 95 % CI of the mean change (``change_ci95_low``/``_high`` siblings), ordered; else ``None``."""
    lo = _published_value(pubs, pub, None, "change_ci95_low")
    hi = _published_value(pubs, pub, None, "change_ci95_high")
    if lo is None or hi is None:
        return None
    return min(lo, hi), max(lo, hi)


def _paper_interval(pubs: pd.DataFrame, pub: pd.Series) -> tuple[float, float, str] | None:
    """The paper's interval a per-seed change is judged against: the published 95 % CI of the mean change
    (``change_ci95_low``/``_high`` rows of the same experiment and metric) if there is one, else the range
    of the published per-seed changes (``change_seed_*`` rows; needs >= 2). ``None`` when neither exists."""
    ci = _published_ci(pubs, pub)
    if ci is not None:
        return ci[0], ci[1], "95 % CI of the mean"
    m = pubs[(pubs["experiment"] == pub["experiment"]) & (pubs["metric"] == pub["metric"])
             & pubs["arm_or_change"].str.startswith("change_seed_")]["value"].to_numpy(float)
    m = m[np.isfinite(m)]
    if len(m) < 2:
        return None
    return float(m.min()), float(m.max()), "range of the published seeds"


def _common_seeds(g: pd.DataFrame, base: str, arm: str) -> list:
    """Seeds that both ``base`` and ``arm`` have in the group's summary rows ``g`` (sorted)."""
    return sorted(set(g.loc[g["arm"] == base, "seed"]) & set(g.loc[g["arm"] == arm, "seed"]))


def _is_win(ts: TraceSet, backend: str, experiment: str, arm: str) -> bool | None:
    """A paired win: P99 ITL interval entirely below zero and no fewer SLO passes than the baseline."""
    pc = paired(ts, backend, experiment, arm, "p99_itl_ms")
    if pc is None:
        return None
    s = ts.summary()
    g = s[(s["backend"] == backend) & (s["experiment"] == experiment)]
    base = ts.baseline_arm(backend, experiment)
    seeds = _common_seeds(g, base, arm)
    slo_b = g[(g["arm"] == base) & g["seed"].isin(seeds)]["slo_passes"].sum()
    slo_c = g[(g["arm"] == arm) & g["seed"].isin(seeds)]["slo_passes"].sum()
    below = np.isfinite(pc.ci_high) and pc.ci_high < 0
    return bool(below and slo_c >= slo_b)


# ----------------------------------------------------------------- one published row, by kind of metric


def _verdict(ts: TraceSet, backend: str, pub: pd.Series, candidate: str) -> dict[str, Any]:
    """``verdict`` rows: win / not a win, and whether the paper says the same."""
    pc = paired(ts, backend, pub["experiment"], candidate, "p99_itl_ms")
    if pc is not None and pc.note == IDENTICAL_WORKLOADS:
        return dict(reproduced="", note=f"{IDENTICAL_WORKLOADS}, so no verdict")
    win = _is_win(ts, backend, pub["experiment"], candidate)
    out: dict[str, Any] = dict(reproduced="" if win is None else ("win" if win else "not a win"))
    if win is not None:
        published_win = not any(w in (pub["qualitative"] or "").lower() for w in ("not a win", "fail"))
        out["agrees"] = win == published_win
    out["note"] = "win = P99 ITL 95 % interval entirely below 0 and no fewer SLO passes"
    return out


def _request_count(g: pd.DataFrame, pub: pd.Series, pubs: pd.DataFrame, base: str, candidate: str) -> dict:
    """``requests_completed`` / ``requests_offered`` rows: sums over both arms and all seeds."""
    metric = pub["metric"]
    arms = g[g["arm"].isin([base, candidate])]
    out: dict[str, Any] = dict(reproduced=float(arms["completed" if metric == "requests_completed" else "measured"]
                                                .sum()))
    if metric == "requests_completed":
        offered = float(arms["measured"].sum())
        pub_off = _published_value(pubs, pub, "requests_offered")
        if pub_off is not None and np.isfinite(pub["value"]):
            out["agrees"] = (out["reproduced"] == offered) == (pub["value"] == pub_off)
        out["note"] = f"of {offered:.0f} offered (both arms, all seeds)"
    return out


def _token_count(g: pd.DataFrame, pub: pd.Series, pubs: pd.DataFrame, base: str, candidate: str,
                 backend: str) -> dict:
    """``token_ids_agree`` / ``token_ids_total`` rows: an agreeing pair counts once in each arm.

    On a backend with ``modelled_outputs`` (token ids a function of request and index) full agreement
    holds by construction: ``agrees`` is then ``BY_CONSTRUCTION``, never a yes (a disagreement there is
    still a no: it can only be a fault).
    """
    c = g[g["arm"] == candidate]
    both = g[g["arm"].isin([base, candidate]) & g["seed"].isin(c["seed"])]
    total = float(both["output_tokens"].sum())
    agree = 2.0 * float(c["tokens_agree"].sum())
    out: dict[str, Any] = dict(reproduced=agree if pub["metric"] == "token_ids_agree" else total)
    if pub["metric"] == "token_ids_agree":
        pub_tot = _published_value(pubs, pub, "token_ids_total")
        if pub_tot is not None and np.isfinite(pub["value"]):
            out["agrees"] = (agree == total) == (pub["value"] == pub_tot)
        out["note"] = f"of {total:.0f} token ids in both arms (measured requests)"
        if get_backend(backend).modelled_outputs and agree == total and out.get("agrees") is True:
            out["agrees"] = BY_CONSTRUCTION
            out["note"] += ("; by construction: this backend's token ids are a function of (request, index), "
                            "so agreement across arms is no evidence")
    return out


#: Relative tolerance a row naming an arm (that arm's own value, e.g. its P99 ITL in ms) is judged with: the paper
#: states no interval for these, so its value is taken as reproduced within +-20 %.
ARM_TOLERANCE = 0.20
#: The least half-width of that tolerance for a count (SLO passes: one request), so a published 0 is not exact.
ARM_COUNT_FLOOR = 1.0


def arm_tolerance(published: float, unit: str) -> tuple[float, float, str]:
    """The interval ``(low, high, how)`` a published arm value is reproduced within: +-``ARM_TOLERANCE`` of it, at
    least +-``ARM_COUNT_FLOOR`` for a count of requests (``unit`` starting with "requests")."""
    half = ARM_TOLERANCE * abs(published)
    how = f"published +-{100 * ARM_TOLERANCE:.0f} %"
    if unit.startswith("requests") and half < ARM_COUNT_FLOOR:
        half, how = ARM_COUNT_FLOOR, f"published +-{ARM_COUNT_FLOOR:g} request (+-{100 * ARM_TOLERANCE:.0f} % is less)"
    return published - half, published + half, how


def _arm_mean(g: pd.DataFrame, pub: pd.Series, col: str, base: str, candidate: str) -> dict:
    """A row naming an arm: that arm's mean over seeds, with the direction of candidate minus baseline, and its
    magnitude judged against the published value +- ``arm_tolerance``."""
    def mean_of(arm: str) -> float:
        return float(g.loc[g["arm"] == arm, col].mean())

    value = mean_of(pub["arm_or_change"])
    out: dict[str, Any] = dict(reproduced=value,
                               reproduced_direction=_direction(mean_of(candidate) - mean_of(base)),
                               note="mean over seeds" + (" (per trial)" if col == "slo_passes" else ""))
    if np.isfinite(pub["value"]) and np.isfinite(value):
        lo, hi, how = arm_tolerance(float(pub["value"]), str(pub["unit"]))
        out["within_interval"] = bool(lo <= value <= hi)
        out["paper_interval"] = f"[{lo:.1f}, {hi:.1f}] ({how})"
    return out


def _slo_passes_change(g: pd.DataFrame, pub: pd.Series, base: str, candidate: str) -> dict:
    """The ``slo_passes`` ``change`` row: candidate minus baseline SLO passes over the common seeds."""
    seeds = _common_seeds(g, base, candidate)
    d = float(g[(g["arm"] == candidate) & g["seed"].isin(seeds)]["slo_passes"].sum()
              - g[(g["arm"] == base) & g["seed"].isin(seeds)]["slo_passes"].sum())
    out: dict[str, Any] = dict(reproduced=d, reproduced_direction=_direction(d),
                               note=f"candidate minus baseline SLO passes, summed over {len(seeds)} seed(s)")
    if (pub["direction"] or "").strip() == "none" and np.isfinite(pub["value"]):
        out["agrees"] = d == pub["value"]
    return out


def _seed_change(ts: TraceSet, backend: str, pub: pd.Series, pubs: pd.DataFrame, col: str,
                 candidate: str) -> dict:
    """A ``change_seed_<s>`` row: that seed's change (percent), judged against the paper's interval."""
    seed = int(pub["arm_or_change"].rsplit("_", 1)[1])
    per_seed = headline_per_seed(ts)
    r = per_seed[(per_seed["backend"] == backend) & (per_seed["experiment"] == pub["experiment"])
                 & (per_seed["arm"] == candidate) & (per_seed["seed"] == seed)]
    value = float(r[change_column(col)].iloc[0]) if len(r) else np.nan
    out: dict[str, Any] = dict(reproduced=value, reproduced_direction=_direction(value))
    if not len(r):
        out["note"] = f"no trial of seed {seed}"
    iv = _paper_interval(pubs, pub)
    if iv is not None and np.isfinite(value):
        lo, hi, what = iv
        out["within_interval"] = bool(lo <= value <= hi)
        out["paper_interval"] = f"[{lo:+.1f}, {hi:+.1f}] ({what})"
    return out


def _paired_change(ts: TraceSet, backend: str, pub: pd.Series, pubs: pd.DataFrame, col: str,
                   candidate: str) -> tuple[dict, bool]:
    """A paired-change row (``change_seed_<s>``, ``change_mean``/``change``, ``change_ci95_*``).

    Returns ``(fields, judged)``: ``judged`` is False when the row cannot be
    reproduced (no paired seed, or an unknown ``arm_or_change``), so its
    direction is not compared.
    """
    which = pub["arm_or_change"]
    pc = paired(ts, backend, pub["experiment"], candidate, col)
    if pc is None:
        return dict(note=f"no seed with finite {col} in both arms"), False
    if which.startswith("change_seed_"):
        return _seed_change(ts, backend, pub, pubs, col, candidate), True
    if which in ("change_mean", "change"):
        out: dict[str, Any] = dict(reproduced=pc.mean, reproduced_direction=_direction(pc.mean),
                                   note=f"paired mean over {pc.n} seed(s)")
        ci = _published_ci(pubs, pub)
        if ci is not None:
            out["within_interval"] = bool(ci[0] <= pc.mean <= ci[1])
            out["paper_interval"] = f"[{ci[0]:+.1f}, {ci[1]:+.1f}] (95 % CI of the mean)"
        return out, True
    if pc.note == IDENTICAL_WORKLOADS and which in ("change_ci95_low", "change_ci95_high", "change_ci95_crosses_zero"):
        return dict(note=IDENTICAL_WORKLOADS), False
    if which in ("change_ci95_low", "change_ci95_high"):
        end = pc.ci_low if which == "change_ci95_low" else pc.ci_high
        return dict(reproduced=end, reproduced_direction=_direction(pc.mean)), True
    if which == "change_ci95_crosses_zero":
        out = dict(reproduced=float(pc.crosses_zero))
        if np.isfinite(pub["value"]):
            out["agrees"] = bool(pc.crosses_zero) == bool(pub["value"])
        return out, True
    return dict(note=f"arm_or_change {which!r} is not known to the reproduction"), False


def _no_reproduction(note: str = "") -> dict[str, Any]:
    """The reproduced fields of a row with nothing reproduced (yet)."""
    return dict(reproduced=np.nan, reproduced_direction="", agrees=None, within_interval=None, paper_interval="",
                note=note)


def _reproduce_row(ts: TraceSet, backend: str, pub: pd.Series, pubs: pd.DataFrame,
                   candidate: str) -> dict[str, Any]:
    """Reproduced value, direction and verdicts for one published row (see ``published_vs_reproduced``)."""
    exp, metric, which = pub["experiment"], pub["metric"], pub["arm_or_change"]
    s = ts.summary()
    g = s[(s["backend"] == backend) & (s["experiment"] == exp)]
    base = ts.baseline_arm(backend, exp)
    out = _no_reproduction()
    if candidate not in set(g["arm"]) or base not in set(g["arm"]):
        return _no_reproduction(f"no {candidate!r} and {base!r} trials for {exp} on {backend}")
    if metric == "verdict":
        return {**out, **_verdict(ts, backend, pub, candidate)}
    if metric in ("requests_completed", "requests_offered"):
        return {**out, **_request_count(g, pub, pubs, base, candidate)}
    if metric in ("token_ids_agree", "token_ids_total"):
        return {**out, **_token_count(g, pub, pubs, base, candidate, backend)}
    col = PUBLISHED_METRICS.get(metric)
    if col is None:
        return _no_reproduction(f"metric {metric!r} is not known to the reproduction")
    if which in (base, candidate) or which in set(g["arm"]):
        out.update(_arm_mean(g, pub, col, base, candidate))
    elif metric == "slo_passes" and which == "change":
        out.update(_slo_passes_change(g, pub, base, candidate))
    else:
        fields, judged = _paired_change(ts, backend, pub, pubs, col, candidate)
        out.update(fields)
        if not judged:
            return out
    pdir = (pub["direction"] or "").strip()
    if pdir in ("increase", "decrease") and out["reproduced_direction"]:
        out["agrees"] = out["reproduced_direction"] == pdir
    return out


# ----------------------------------------------------------------- the table


def _coverage_messages(pubs: pd.DataFrame, traced: dict[str, list[str]]) -> list[str]:
    """Published experiments without traces, then traced experiments without a published row."""
    messages = [f"published experiment {exp!r} has no traces in the traces directory"
                for exp in sorted(set(pubs["experiment"])) if exp not in traced]
    messages += [f"experiment {exp!r} has no row in published.csv (nothing to compare; reproduced only)"
                 for exp in sorted(traced) if exp not in set(pubs["experiment"])]
    return messages


#: A traced experiment ``<published experiment>-<n>seeds`` (``variant_of`` it in ``experiments/``) is the paper's
#: configuration on more seeds: it gets the published rows of its base, but not the per-seed ones.
SEED_VARIANT = re.compile(r"^(?P<base>.+)-(?P<n>\d+)seeds$")


def with_seed_variants(pubs: pd.DataFrame, traced) -> pd.DataFrame:
    """``pubs`` plus, for each traced seed variant (``SEED_VARIANT``) of a published experiment, a copy of that
    experiment's rows under the variant's name, without the ``change_seed_*`` rows (the variant's first seeds are
    the paper's, already compared)."""
    extra = []
    for exp in sorted(traced):
        m = SEED_VARIANT.match(exp)
        if m is None or exp in set(pubs["experiment"]) or m["base"] not in set(pubs["experiment"]):
            continue
        rows = pubs[(pubs["experiment"] == m["base"]) & ~pubs["arm_or_change"].str.startswith("change_seed_")]
        extra.append(rows.assign(experiment=exp))
    return pd.concat([pubs, *extra], ignore_index=True) if extra else pubs


def published_vs_reproduced(ts: TraceSet, published: pd.DataFrame | str | Path,
                            candidate_arm: str = "dlfp") -> tuple[pd.DataFrame, list[str]]:
    """Every published number beside the reproduced one, per backend that has the experiment's traces.

    For each row of ``published.csv`` (experiment, metric, arm_or_change,
    value, unit, direction, qualitative, source_sentence) the reproduced
    value is computed from the traces in the same unit: ``change_seed_<s>``,
    ``change_mean``/``change``, ``change_ci95_low``/``_high`` are paired
    changes of ``candidate_arm`` vs the baseline in percent (negative =
    lower); an arm name is that arm's mean over seeds (ms, or SLO passes per
    trial), its magnitude judged against the published value +- ``ARM_TOLERANCE``
    (``arm_tolerance``); ``all_arms_seeds`` sums both arms over seeds; token ids count each
    agreeing pair once per arm; ``verdict`` is win / not a win (P99 ITL
    interval below zero and no fewer SLO passes).

    Columns (``PVR_COLUMNS``): ``agrees`` is the direction check (or, for
    rows without a direction, equality of the stated fact); ``within_interval``
    (with the interval used in ``paper_interval``) is set for a mean change
    whose experiment publishes a 95 % interval, and for a per-seed change
    against that interval or, without one, against the range of the
    published per-seed changes, and for a row naming an arm against the
    published value +- ``ARM_TOLERANCE``; ``None`` (Markdown: "direction
    only" or "n/a") where there is neither.

    Returns:
        (table, messages): messages name every published experiment without
        traces and every traced experiment without a published row.

    Raises:
        FileNotFoundError / ValueError: see ``load_published``.
    """
    pubs = published if isinstance(published, pd.DataFrame) else load_published(published)
    traced: dict[str, list[str]] = {}
    for backend, exp in ts.groups():
        traced.setdefault(exp, []).append(backend)
    pubs = with_seed_variants(pubs, traced)
    rows = []
    for _, pub in pubs.iterrows():
        exp = pub["experiment"]
        for backend in traced.get(exp, [""]):
            row = dict(backend=backend, experiment=exp, metric=pub["metric"], arm_or_change=pub["arm_or_change"],
                       unit=pub["unit"], published=pub["value"], published_direction=pub["direction"],
                       published_qualitative=pub.get("qualitative", ""), source_sentence=pub["source_sentence"])
            row.update(_reproduce_row(ts, backend, pub, pubs, candidate_arm) if backend
                       else _no_reproduction(f"no traces for {exp}"))
            rows.append(row)
    df = pd.DataFrame(rows, columns=PVR_COLUMNS)
    if ts.partial:
        df = _unjudged(df, ts)
    if not df.empty:
        df = (df.assign(_untraced=df["backend"] == "")
              .sort_values(["_untraced", "backend", "experiment", "metric", "arm_or_change"], kind="stable")
              .drop(columns="_untraced").reset_index(drop=True))
    return df, _coverage_messages(pubs, traced)


def _unjudged(df: pd.DataFrame, ts: TraceSet) -> pd.DataFrame:
    """The table of a partial set: no row agrees or lies within an interval; the note says why."""
    df = df.copy()
    why = [f"incomplete ({ts.incomplete[(b, e)]})" if (b, e) in ts.incomplete else "partial render: not judged"
           for b, e in zip(df["backend"], df["experiment"])]
    df["note"] = [w + ("; " + n if isinstance(n, str) and n else "") for w, n in zip(why, df["note"])]
    df["agrees"] = None
    df["within_interval"] = None
    return df


def empty_pvr() -> pd.DataFrame:
    """An empty ``published_vs_reproduced`` table (``PVR_COLUMNS``), for when published.csv is unavailable."""
    return pd.DataFrame(columns=PVR_COLUMNS)


def _number(v: Any, unit: str) -> str:
    """A published or reproduced value in its unit: percent signed with one decimal, ms with one decimal."""
    if isinstance(v, str):
        return v
    if v is None or not np.isfinite(v):
        return ""
    if unit == "percent":
        return f"{v:+.1f} %"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "bool":
        return "yes" if v else "no"
    return f"{v:.6g}"


def _unjudged_magnitude(r: pd.Series) -> str:
    """The "magnitude agrees" cell of a row without a magnitude verdict: "direction only" when its direction was
    judged, "n/a" for another reproduced number, else empty."""
    if not (isinstance(r["reproduced"], (float, int)) and np.isfinite(r["reproduced"])):
        return ""
    return "direction only" if r["agrees"] is True or r["agrees"] is False else "n/a"


def pvr_markdown_frame(pvr: pd.DataFrame) -> pd.DataFrame:
    """A compact view of ``published_vs_reproduced`` for Markdown (no source sentences).

    "magnitude agrees" is the reproduced value against the paper's interval (a 95 % CI, the range of its seeds)
    or, for a row naming an arm, the published value +- ``ARM_TOLERANCE`` (``arm_tolerance``), the bounds in
    "magnitude judged against"; a row judged on its direction alone says "direction only".
    """
    out = []
    for _, r in pvr.iterrows():
        pub = _number(r["published"], r["unit"])
        if r["published_qualitative"]:
            pub = f"{pub} ({r['published_qualitative']})" if pub else r["published_qualitative"]
        out.append({"backend": r["backend"], "experiment": r["experiment"], "metric": r["metric"],
                    "arm or change": r["arm_or_change"], "published": pub,
                    "reproduced": _number(r["reproduced"], r["unit"]),
                    "direction agrees": (BY_CONSTRUCTION if isinstance(r["agrees"], str)
                                         else yes_no(r["agrees"], "yes", "NO")),
                    "magnitude agrees": yes_no(r["within_interval"], "yes", "no") or _unjudged_magnitude(r),
                    "magnitude judged against": r.get("paper_interval", ""),
                    "note": r["note"]})
    return pd.DataFrame(out)


def write_published_vs_reproduced(ts: TraceSet, results_dir: str | Path,
                                  published_csv: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """Write ``published_vs_reproduced`` (CSV + Markdown); a missing/invalid published.csv is said in its place."""
    try:
        pvr, messages = published_vs_reproduced(ts, published_csv)
    except (FileNotFoundError, ValueError) as e:
        pvr, messages = empty_pvr(), [f"published numbers unavailable: {e}"]
    write_table(mark_incomplete(pvr, ts), results_dir, "published_vs_reproduced",
                markdown=mark_incomplete(pvr_markdown_frame(pvr), ts),
                title="Published vs reproduced", notes=messages)
    return pvr, messages


__all__ = ["ARM_COUNT_FLOOR", "ARM_TOLERANCE", "BY_CONSTRUCTION", "PUBLISHED_COLUMNS", "PUBLISHED_METRICS",
           "PVR_COLUMNS", "arm_tolerance", "empty_pvr", "load_published", "published_vs_reproduced",
           "pvr_markdown_frame", "with_seed_variants", "write_published_vs_reproduced"]
