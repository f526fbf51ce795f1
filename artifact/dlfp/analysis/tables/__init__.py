"""Tables from saved traces: what ``figures.ipynb`` shows, as tested functions.

Everything here reads trials written by ``dlfp.traces.format`` and nothing else: no
engine runs, no typed-in numbers (the paper's numbers come only from
``data/paper/published.csv``). Metrics come from ``dlfp.analysis.metrics`` (seconds)
and paired statistics from ``dlfp.analysis.stats``; tables report milliseconds.

Sign convention of every ``*_change_pct`` column here: the candidate arm
relative to the baseline arm of the same seed, ``(candidate - baseline) /
baseline * 100``; NEGATIVE = the candidate is lower (e.g. P99 ITL -27.7 %).
This is ``-100 x dlfp.analysis.stats.paired_change`` (which counts reductions as
positive); intervals are the paired two-sided 95 % Student-t intervals of
``dlfp.analysis.stats`` with their ends swapped accordingly.

Outputs are deterministic: rows sorted (backend, experiment, arm with the
baseline first, seed), floats written with fixed decimals per unit (``_ms``
3, ``_pct`` 2, fractions and correlations 4, joules 6 significant digits), so
the same traces give byte-identical CSV and Markdown.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from dlfp.analysis import metrics, stats
from dlfp.config import ConfigError, ExperimentConfig, load_experiment
from dlfp.traces.format import TraceError, Trial, find_trials, load_trial

#: Metrics whose paired change the headline table reports: column -> label.
CHANGE_METRICS: dict[str, str] = {
    "p99_itl_ms": "P99 ITL",
    "p99_ttft_ms": "P99 TTFT",
    "p99_e2el_ms": "P99 E2EL",
    "energy_per_token_j": "energy per output token",
}
DEFAULT_TARGET_S = 0.080  # paper's DLFP target (arXiv v1, 2026-09-29)


# --------------------------------------------------------------------------- loading

FIXED_CAP_PREFIX = "fixed-"


def arm_order(arm: str, baseline: str = "baseline") -> tuple:
    """Sort key of arms in every table: the baseline, then other arms by name, then ``fixed-<cap>`` arms by cap."""
    cap = arm[len(FIXED_CAP_PREFIX):] if arm.startswith(FIXED_CAP_PREFIX) else ""
    return (arm != baseline, cap.isdigit(), int(cap) if cap.isdigit() else 0, arm)



@dataclass
class LoadedTrial:
    """One trial loaded from disk, with the config it ran with (``None`` if neither recorded nor shipped)."""

    backend: str
    experiment: str
    arm: str
    seed: int
    path: Path
    trial: Trial
    config: ExperimentConfig | None


@dataclass
class TraceSet:
    """Every trial under a traces root, plus the directories that failed to load (``problems``)."""

    root: Path
    trials: list[LoadedTrial] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (path, message)
    _summary: pd.DataFrame | None = field(default=None, repr=False)
    _published: pd.DataFrame | None = field(default=None, repr=False)
    _per_seed: pd.DataFrame | None = field(default=None, repr=False)
    _digests: dict[str, dict] = field(default_factory=dict, repr=False)
    _index: dict | None = field(default=None, repr=False)
    _configs: dict = field(default_factory=dict, repr=False)
    _root_cause: pd.DataFrame | None = field(default=None, repr=False)

    def groups(self) -> list[tuple[str, str]]:
        """Sorted (backend, experiment) pairs that have at least one loaded trial."""
        return sorted({(t.backend, t.experiment) for t in self.trials})

    def select(self, backend: str, experiment: str, arm: str | None = None) -> list[LoadedTrial]:
        """Trials of one backend/experiment (and arm), sorted by arm then seed."""
        if self._index is None:
            idx: dict[tuple, list[LoadedTrial]] = {}
            for t in sorted(self.trials, key=lambda t: (t.arm, t.seed)):
                idx.setdefault((t.backend, t.experiment, None), []).append(t)
                idx.setdefault((t.backend, t.experiment, t.arm), []).append(t)
            self._index = idx
        return list(self._index.get((backend, experiment, arm), []))

    def config(self, backend: str, experiment: str) -> ExperimentConfig | None:
        """The config of a group (from its first trial that has one)."""
        key = (backend, experiment)
        if key not in self._configs:
            self._configs[key] = next((t.config for t in self.select(backend, experiment) if t.config is not None),
                                      None)
        return self._configs[key]

    def baseline_arm(self, backend: str, experiment: str) -> str:
        """The group's reference arm (``cfg.baseline_arm``; ``"baseline"`` when no config is known)."""
        cfg = self.config(backend, experiment)
        return cfg.baseline_arm if cfg is not None else "baseline"

    def arms(self, backend: str, experiment: str) -> list[str]:
        """Arms present in a group in ``arm_order``: baseline, other arms by name, fixed caps by cap."""
        base = self.baseline_arm(backend, experiment)
        return sorted({t.arm for t in self.select(backend, experiment)}, key=lambda a: arm_order(a, base))

    def problems_for(self, backend: str, experiment: str) -> list[tuple[str, str]]:
        """Load problems whose path lies in this group's directory."""
        prefix = str(self.root / backend / experiment) + os.sep
        return [p for p in self.problems if p[0].startswith(prefix)]

    def problem_report(self) -> str:
        """One line per trial directory that could not be loaded ("" when none)."""
        return "\n".join(f"corrupt or partial trial {p}: {m}" for p, m in self.problems)

    def summary(self) -> pd.DataFrame:
        """``trial_summaries`` of this set (computed once)."""
        if self._summary is None:
            self._summary = trial_summaries(self)
        return self._summary


def _config_of(trial: Trial) -> ExperimentConfig | None:
    md = trial.metadata.get("config")
    if isinstance(md, dict):
        try:
            return ExperimentConfig.model_validate(md)
        except Exception:  # recorded config of an older schema: fall back to the shipped one
            pass
    try:
        return load_experiment(str(trial.metadata.get("experiment")))
    except ConfigError:
        return None


def load_traces(root: str | Path, backends: Sequence[str] | None = None,
                experiments: Sequence[str] | None = None, workers: int | None = None) -> TraceSet:
    """Load every trial under ``root`` (``<root>/<backend>/<experiment>/<arm>/seed-<seed>``).

    A directory that fails to load (``dlfp.traces.format.TraceError``: partial,
    corrupt, invalid) is not used; it is listed in ``TraceSet.problems`` with
    its path and the reason, so callers can report it rather than plot around
    it silently. A trial whose metadata disagrees with its place in the tree
    is a problem too. Each trial's ``metrics.summarize`` and ITL samples are
    computed here once; ``workers`` > 1 does that in parallel processes
    (default: up to 4 from ``PARALLEL_MIN_TRIALS`` trials on).

    Raises:
        FileNotFoundError: ``root`` is not a directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"traces directory {root} does not exist")
    ts = TraceSet(root=root)
    paths = []
    for path in find_trials(root):
        backend, experiment, arm, seed_dir = path.parts[-4:]
        if backends and backend not in backends or experiments and experiment not in experiments:
            continue
        paths.append(path)
    if workers is None:
        workers = min(4, os.cpu_count() or 1) if len(paths) >= PARALLEL_MIN_TRIALS else 1
    if workers > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        # "spawn": a forked child could inherit locked pyarrow/zmq threads from a notebook kernel.
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
            digests = list(pool.map(_digest, paths, chunksize=max(1, len(paths) // (4 * workers))))
    else:
        digests = [_digest(p) for p in paths]
    for d in digests:
        if "error" in d:
            ts.problems.append((str(d["path"]), d["error"]))
            continue
        ts.trials.append(d["loaded"])
        ts._digests[str(d["path"])] = d
    ts.trials.sort(key=lambda t: (t.backend, t.experiment, t.arm, t.seed))
    return ts


#: Load trials in parallel worker processes from this many trials on (spawn start-up costs ~2 s).
PARALLEL_MIN_TRIALS = 40


def _digest(path: Path) -> dict[str, Any]:
    """Load one trial and compute what every table needs once: summary (``metrics.summarize``) and ITL samples."""
    backend, experiment, arm, seed_dir = path.parts[-4:]
    try:
        trial = load_trial(path)
    except TraceError as e:
        return dict(path=path, error=str(e))
    md = trial.metadata
    where = (md.get("backend"), md.get("experiment"), md.get("arm"), f"seed-{md.get('seed')}")
    if where != (backend, experiment, arm, seed_dir):
        return dict(path=path, error=f"metadata names {'/'.join(map(str, where))}, not its directory")
    lt = LoadedTrial(backend, experiment, arm, int(md["seed"]), path, trial, _config_of(trial))
    try:
        summary = metrics.summarize(trial, _slo_of(lt))
    except ValueError as e:
        return dict(path=path, error=f"cannot summarise: {e}")
    return dict(path=path, loaded=lt, summary=summary, itl=metrics.itl_samples(trial),
                tokens=measured_token_ids(trial), guarded=guarded_iterations(trial))


def itl_samples(ts: TraceSet, lt: LoadedTrial) -> np.ndarray:
    """``dlfp.analysis.metrics.itl_samples`` of a loaded trial (seconds), computed once at load time."""
    d = ts._digests.get(str(lt.path))
    return d["itl"] if d is not None else metrics.itl_samples(lt.trial)


# --------------------------------------------------------------------------- per-trial numbers


def measured_token_ids(trial: Trial) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Measured requests' tokens sorted by (request id, index): ``(request_ids, indices, token_ids)``."""
    ids = trial.measured_requests["request_id"]
    tk = trial.tokens[trial.tokens["request_id"].isin(ids)].sort_values(["request_id", "index"], kind="stable")
    return (tk["request_id"].to_numpy(dtype=object), tk["index"].to_numpy(dtype=np.int64),
            tk["token_id"].to_numpy(dtype=np.int64))


def _agreement(ts: TraceSet, base: LoadedTrial, cand: LoadedTrial) -> tuple[int, int]:
    db, dc = ts._digests.get(str(base.path)), ts._digests.get(str(cand.path))
    if db is not None and dc is not None:
        (rb, ib, tb), (rc, ic, tc) = db["tokens"], dc["tokens"]
        if len(rb) == len(rc) and np.array_equal(ib, ic) and np.array_equal(rb, rc):
            return int((tb == tc).sum()), int(len(tb))  # same positions in both arms: compare directly
    return token_agreement(base.trial, cand.trial)


def token_agreement(baseline: Trial, candidate: Trial) -> tuple[int, int]:
    """Exact token-id agreement of two arms on the same seed: ``(agree, compared)``.

    Compared are the measured requests' token positions (request id, index)
    present in either arm (an outer join: a token one arm produced and the
    other did not counts as a disagreement). ``agree`` counts positions with
    identical ids in both.
    """
    def measured(t: Trial) -> pd.DataFrame:
        ids = t.measured_requests["request_id"]
        tk = t.tokens[t.tokens["request_id"].isin(ids)]
        return tk[["request_id", "index", "token_id"]]

    m = measured(baseline).merge(measured(candidate), on=["request_id", "index"], how="outer",
                                 suffixes=("_b", "_c"))
    agree = int((m["token_id_b"] == m["token_id_c"]).fillna(False).sum())
    return agree, int(len(m))


def _slo_of(lt: LoadedTrial):
    return lt.config.slo if lt.config is not None else None


def trial_summaries(ts: TraceSet) -> pd.DataFrame:
    """One row per loaded trial: ``dlfp.analysis.metrics.summarize`` converted to ms, plus token agreement.

    Columns: backend, experiment, arm, seed, is_baseline, measured, completed,
    failed, p50_itl_ms, p90_itl_ms, p99_itl_ms, p50_ttft_ms, p99_ttft_ms,
    p50_tpot_ms, p99_tpot_ms, p99_e2el_ms, slo_passes, slo_fraction,
    goodput_rps, output_tokens, energy_per_token_j, energy_reason,
    tokens_agree, tokens_compared (versus the baseline arm's trial of the same
    seed; NaN for the baseline itself or without one), path.
    """
    rows = []
    base_trials: dict[tuple[str, str, int], LoadedTrial] = {}
    for lt in ts.trials:
        if lt.arm == ts.baseline_arm(lt.backend, lt.experiment):
            base_trials[(lt.backend, lt.experiment, lt.seed)] = lt
    for lt in ts.trials:
        d = ts._digests.get(str(lt.path))
        s = d["summary"] if d is not None else metrics.summarize(lt.trial, _slo_of(lt))
        base = base_trials.get((lt.backend, lt.experiment, lt.seed))
        is_base = base is lt
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
                   energy_reason=s["energy_reason"], tokens_agree=agree, tokens_compared=compared,
                   path=str(lt.path))
        rows.append(row)
    cols = ["backend", "experiment", "arm", "seed", "is_baseline", "measured", "completed", "failed"] + [
        f"p{p}_{m}_ms" for m in ("itl", "ttft", "tpot", "e2el") for p in (50, 90, 99)] + [
        "slo_passes", "slo_fraction", "goodput_rps", "output_tokens", "energy_per_token_j", "energy_reason",
        "tokens_agree", "tokens_compared", "path"]
    df = pd.DataFrame(rows, columns=cols)
    return _sort(df, ts)


def _sort(df: pd.DataFrame, ts: TraceSet) -> pd.DataFrame:
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


# --------------------------------------------------------------------------- headline


def _change_pct(base: float, cand: float) -> float:
    """(cand - base) / base * 100; NaN when either is missing or base is 0."""
    if not (np.isfinite(base) and np.isfinite(cand)) or base == 0:
        return float("nan")
    return -100.0 * stats.relative_change(base, cand)


def headline_per_seed(ts: TraceSet) -> pd.DataFrame:
    """The headline table, one row per backend x experiment x arm x seed.

    Columns: backend, experiment, arm, seed, measured, completed, failed,
    p50_itl_ms, p99_itl_ms, p99_ttft_ms, p99_e2el_ms, slo_passes,
    slo_fraction, energy_per_token_j, tokens_agree, tokens_compared, and for
    each of ``CHANGE_METRICS`` the per-seed ``<metric>_change_pct`` versus the
    baseline arm's trial of the same seed (NaN for the baseline, or without
    a baseline trial for that seed).
    """
    if ts._per_seed is not None:
        return ts._per_seed
    s = ts.summary()
    keep = ["backend", "experiment", "arm", "seed", "measured", "completed", "failed", "p50_itl_ms", "p99_itl_ms",
            "p99_ttft_ms", "p99_e2el_ms", "slo_passes", "slo_fraction", "energy_per_token_j", "tokens_agree",
            "tokens_compared"]
    out = s[keep].copy()
    base = s[s["is_baseline"]].set_index(["backend", "experiment", "seed"])
    for col in CHANGE_METRICS:
        name = col.rsplit("_", 1)[0] + "_change_pct"
        b = base[col].reindex(pd.MultiIndex.from_frame(s[["backend", "experiment", "seed"]])).to_numpy(float)
        c = s[col].to_numpy(float)
        out[name] = [float("nan") if is_b else _change_pct(bv, cv)
                     for is_b, bv, cv in zip(s["is_baseline"], b, c)]
    ts._per_seed = out.reset_index(drop=True)
    return ts._per_seed


def paired(ts: TraceSet, backend: str, experiment: str, arm: str, column: str) -> stats.PairedChange | None:
    """Paired change of ``column`` (a ``trial_summaries`` column) of ``arm`` vs the baseline, in percent.

    Returned in this module's sign convention (negative = candidate lower):
    per_seed, mean, ci_low and ci_high are ``(candidate - baseline)/baseline * 100``.
    ``None`` when no seed has finite values in both arms.
    """
    s = ts.summary()
    g = s[(s["backend"] == backend) & (s["experiment"] == experiment)]
    base_arm = ts.baseline_arm(backend, experiment)
    b = g[g["arm"] == base_arm].set_index("seed")[column]
    c = g[g["arm"] == arm].set_index("seed")[column]
    seeds = sorted(set(b.index) & set(c.index))
    seeds = [sd for sd in seeds if np.isfinite(b[sd]) and np.isfinite(c[sd]) and b[sd] != 0]
    if not seeds:
        return None
    r = stats.paired_change(b.loc[seeds].to_numpy(float), c.loc[seeds].to_numpy(float)).as_percent()
    return stats.PairedChange(per_seed=tuple(-v for v in r.per_seed), mean=-r.mean, ci_low=-r.ci_high,
                              ci_high=-r.ci_low, n=r.n, crosses_zero=r.crosses_zero, confidence=r.confidence,
                              note=r.note)


def headline(ts: TraceSet) -> pd.DataFrame:
    """The headline table aggregated over seeds: one row per backend x experiment x arm.

    Columns: backend, experiment, arm, seeds (count), missing_seeds (seeds the
    baseline has and this arm lacks, or the reverse, space-separated),
    p99_itl_ms_mean, p99_ttft_ms_mean, p99_e2el_ms_mean,
    energy_per_token_j_mean; for each of ``CHANGE_METRICS`` (baseline rows
    NaN): ``<m>_change_pct_per_seed`` (text, seed order), ``_mean``,
    ``_ci_low``, ``_ci_high``, ``_crosses_zero``; then slo_passes, measured,
    completed, failed (sums over seeds), tokens_agree, tokens_compared (sums),
    problems (count of unloadable trial directories in the group).
    """
    s = ts.summary()
    rows = []
    for backend, experiment in ts.groups():
        g = s[(s["backend"] == backend) & (s["experiment"] == experiment)]
        base_arm = ts.baseline_arm(backend, experiment)
        base_seeds = set(g.loc[g["arm"] == base_arm, "seed"])
        for arm in ts.arms(backend, experiment):
            a = g[g["arm"] == arm]
            seeds = set(a["seed"])
            row: dict[str, Any] = dict(backend=backend, experiment=experiment, arm=arm, seeds=len(seeds),
                                       missing_seeds=" ".join(str(x) for x in sorted(seeds ^ base_seeds)))
            for col in CHANGE_METRICS:
                v = a[col].to_numpy(float)
                row[f"{col}_mean"] = float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")
            for col in CHANGE_METRICS:
                name = col.rsplit("_", 1)[0] + "_change_pct"
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
            rows.append(row)
    return pd.DataFrame(rows)


def headline_markdown_frame(head: pd.DataFrame) -> pd.DataFrame:
    """A compact, human-readable view of ``headline`` (strings): one row per experiment x arm."""
    def ci(r, name):
        m = r[f"{name}_mean"]
        if not np.isfinite(m):
            return ""
        lo, hi = r[f"{name}_ci_low"], r[f"{name}_ci_high"]
        rng = f" [{lo:+.1f}, {hi:+.1f}]" if np.isfinite(lo) else " (n=1)"
        return f"{m:+.1f}{rng}"

    out = []
    for _, r in head.iterrows():
        agree = "" if not np.isfinite(r["tokens_compared"]) else f"{int(r['tokens_agree'])}/{int(r['tokens_compared'])}"
        out.append({
            "backend": r["backend"], "experiment": r["experiment"], "arm": r["arm"], "seeds": r["seeds"],
            "P99 ITL ms (mean)": f"{r['p99_itl_ms_mean']:.1f}",
            "ΔP99 ITL % [95% CI]": ci(r, "p99_itl_change_pct"),
            "ΔP99 TTFT % [95% CI]": ci(r, "p99_ttft_change_pct"),
            "ΔP99 E2EL % [95% CI]": ci(r, "p99_e2el_change_pct"),
            "SLO passes": f"{r['slo_passes']}/{r['measured']}",
            "ΔJ/token % [95% CI]": ci(r, "energy_per_token_change_pct"),
            "completed": f"{r['completed']}/{r['measured']}",
            "tokens agree": agree,
            "notes": "; ".join(x for x in (f"missing seeds {r['missing_seeds']}" if r["missing_seeds"] else "",
                                           f"{r['problems']} corrupt trial(s)" if r["problems"] else "") if x),
        })
    return pd.DataFrame(out)


# --------------------------------------------------------------------------- published vs reproduced

PUBLISHED_COLUMNS = ("experiment", "metric", "arm_or_change", "value", "unit", "source_sentence", "direction")


def load_published(path: str | Path) -> pd.DataFrame:
    """Read ``data/paper/published.csv``.

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


#: published.csv ``metric`` -> ``trial_summaries`` column.
PUBLISHED_METRICS = {
    "p99_itl": "p99_itl_ms",
    "p99_ttft": "p99_ttft_ms",
    "p99_e2el": "p99_e2el_ms",
    "energy_per_output_token": "energy_per_token_j",
    "slo_passes": "slo_passes",
}
PVR_COLUMNS = ["backend", "experiment", "metric", "arm_or_change", "unit", "published", "published_direction",
               "published_qualitative", "reproduced", "reproduced_direction", "agrees", "within_interval",
               "paper_interval", "note", "source_sentence"]


def _direction(x: float, tol: float = 0.0) -> str:
    if x is None or not np.isfinite(x):
        return ""
    return "increase" if x > tol else "decrease" if x < -tol else "none"


def _is_win(ts: TraceSet, backend: str, experiment: str, arm: str) -> bool | None:
    """A paired win: P99 ITL interval entirely below zero and no fewer SLO passes than the baseline."""
    pc = paired(ts, backend, experiment, arm, "p99_itl_ms")
    if pc is None:
        return None
    s = ts.summary()
    g = s[(s["backend"] == backend) & (s["experiment"] == experiment)]
    base = ts.baseline_arm(backend, experiment)
    seeds = sorted(set(g.loc[g["arm"] == base, "seed"]) & set(g.loc[g["arm"] == arm, "seed"]))
    slo_b = g[(g["arm"] == base) & g["seed"].isin(seeds)]["slo_passes"].sum()
    slo_c = g[(g["arm"] == arm) & g["seed"].isin(seeds)]["slo_passes"].sum()
    below = np.isfinite(pc.ci_high) and pc.ci_high < 0
    return bool(below and slo_c >= slo_b)


def _reproduce_row(ts: TraceSet, backend: str, pub: pd.Series, candidate: str) -> dict[str, Any]:
    """Reproduced value, direction and verdicts for one published row (see ``published_vs_reproduced``)."""
    exp, metric, which = pub["experiment"], pub["metric"], pub["arm_or_change"]
    pdir = (pub["direction"] or "").strip()
    s = ts.summary()
    g = s[(s["backend"] == backend) & (s["experiment"] == exp)]
    base = ts.baseline_arm(backend, exp)
    out: dict[str, Any] = dict(reproduced=np.nan, reproduced_direction="", agrees=None, within_interval=None,
                               paper_interval="", note="")
    if candidate not in set(g["arm"]) or base not in set(g["arm"]):
        out["note"] = f"no {candidate!r} and {base!r} trials for {exp} on {backend}"
        return out
    col = PUBLISHED_METRICS.get(metric)
    mean_of = lambda arm, c: float(g.loc[g["arm"] == arm, c].mean())  # noqa: E731

    if metric == "verdict":
        win = _is_win(ts, backend, exp, candidate)
        out["reproduced"] = "" if win is None else ("win" if win else "not a win")
        if win is not None:
            published_win = not any(w in (pub["qualitative"] or "").lower() for w in ("not a win", "fail"))
            out["agrees"] = win == published_win
        out["note"] = "win = P99 ITL 95 % interval entirely below 0 and no fewer SLO passes"
        return out
    if metric in ("requests_completed", "requests_offered"):
        arms = g[g["arm"].isin([base, candidate])]
        out["reproduced"] = float(arms["completed" if metric == "requests_completed" else "measured"].sum())
        if metric == "requests_completed":
            offered = float(arms["measured"].sum())
            pub_off = _published_value(ts, pub, "requests_offered")
            if pub_off is not None and np.isfinite(pub["value"]):
                out["agrees"] = (out["reproduced"] == offered) == (pub["value"] == pub_off)
            out["note"] = f"of {offered:.0f} offered (both arms, all seeds)"
        return out
    if metric in ("token_ids_agree", "token_ids_total"):
        c = g[g["arm"] == candidate]
        both = g[g["arm"].isin([base, candidate]) & g["seed"].isin(c["seed"])]
        total = float(both["output_tokens"].sum())
        agree = 2.0 * float(c["tokens_agree"].sum())  # an agreeing pair counts once in each arm
        out["reproduced"] = agree if metric == "token_ids_agree" else total
        if metric == "token_ids_agree":
            pub_tot = _published_value(ts, pub, "token_ids_total")
            if pub_tot is not None and np.isfinite(pub["value"]):
                out["agrees"] = (agree == total) == (pub["value"] == pub_tot)
            out["note"] = f"of {total:.0f} token ids in both arms (measured requests)"
        return out
    if col is None:
        out["note"] = f"metric {metric!r} is not known to the reproduction"
        return out
    if which in (base, candidate) or which in set(g["arm"]):
        out["reproduced"] = mean_of(which, col)
        out["reproduced_direction"] = _direction(mean_of(candidate, col) - mean_of(base, col))
        out["note"] = "mean over seeds" + (" (per trial)" if col == "slo_passes" else "")
    elif metric == "slo_passes" and which == "change":
        seeds = sorted(set(g.loc[g["arm"] == base, "seed"]) & set(g.loc[g["arm"] == candidate, "seed"]))
        d = float(g[(g["arm"] == candidate) & g["seed"].isin(seeds)]["slo_passes"].sum()
                  - g[(g["arm"] == base) & g["seed"].isin(seeds)]["slo_passes"].sum())
        out["reproduced"] = d
        out["reproduced_direction"] = _direction(d)
        out["note"] = f"candidate minus baseline SLO passes, summed over {len(seeds)} seed(s)"
        if pdir == "none" and np.isfinite(pub["value"]):
            out["agrees"] = d == pub["value"]
    else:
        pc = paired(ts, backend, exp, candidate, col)
        if pc is None:
            out["note"] = f"no seed with finite {col} in both arms"
            return out
        if which.startswith("change_seed_"):
            seed = int(which.rsplit("_", 1)[1])
            row = headline_per_seed(ts)
            r = row[(row["backend"] == backend) & (row["experiment"] == exp) & (row["arm"] == candidate)
                    & (row["seed"] == seed)]
            name = col.rsplit("_", 1)[0] + "_change_pct"
            out["reproduced"] = float(r[name].iloc[0]) if len(r) else np.nan
            out["reproduced_direction"] = _direction(out["reproduced"])
            if not len(r):
                out["note"] = f"no trial of seed {seed}"
            iv = _paper_interval(ts, pub)
            if iv is not None and np.isfinite(out["reproduced"]):
                lo, hi, what = iv
                out["within_interval"] = bool(lo <= out["reproduced"] <= hi)
                out["paper_interval"] = f"[{lo:+.1f}, {hi:+.1f}] ({what})"
        elif which in ("change_mean", "change"):
            out["reproduced"] = pc.mean
            out["reproduced_direction"] = _direction(pc.mean)
            lo, hi = _published_value(ts, pub, None, "change_ci95_low"), _published_value(ts, pub, None,
                                                                                           "change_ci95_high")
            if lo is not None and hi is not None:
                out["within_interval"] = bool(min(lo, hi) <= pc.mean <= max(lo, hi))
                out["paper_interval"] = f"[{min(lo, hi):+.1f}, {max(lo, hi):+.1f}] (95 % CI of the mean)"
            out["note"] = f"paired mean over {pc.n} seed(s)"
        elif which == "change_ci95_low":
            out["reproduced"] = pc.ci_low
            out["reproduced_direction"] = _direction(pc.mean)
        elif which == "change_ci95_high":
            out["reproduced"] = pc.ci_high
            out["reproduced_direction"] = _direction(pc.mean)
        elif which == "change_ci95_crosses_zero":
            out["reproduced"] = float(pc.crosses_zero)
            if np.isfinite(pub["value"]):
                out["agrees"] = bool(pc.crosses_zero) == bool(pub["value"])
        else:
            out["note"] = f"arm_or_change {which!r} is not known to the reproduction"
            return out
    if pdir in ("increase", "decrease") and out["reproduced_direction"]:
        out["agrees"] = out["reproduced_direction"] == pdir
    return out


def _paper_interval(ts: TraceSet, pub: pd.Series) -> tuple[float, float, str] | None:
    """The paper's interval a per-seed change is judged against: the published 95 % CI of the mean change
    (``change_ci95_low``/``_high`` rows of the same experiment and metric) if there is one, else the range
    of the published per-seed changes (``change_seed_*`` rows; needs >= 2). ``None`` when neither exists."""
    lo, hi = _published_value(ts, pub, None, "change_ci95_low"), _published_value(ts, pub, None, "change_ci95_high")
    if lo is not None and hi is not None:
        return min(lo, hi), max(lo, hi), "95 % CI of the mean"
    pubs = getattr(ts, "_published", None)
    if pubs is None:
        return None
    m = pubs[(pubs["experiment"] == pub["experiment"]) & (pubs["metric"] == pub["metric"])
             & pubs["arm_or_change"].str.startswith("change_seed_")]["value"].to_numpy(float)
    m = m[np.isfinite(m)]
    if len(m) < 2:
        return None
    return float(m.min()), float(m.max()), "range of the published seeds"


def _published_value(ts: TraceSet, pub: pd.Series, metric: str | None, which: str | None = None) -> float | None:
    """The value of a sibling row of ``pub`` (same experiment; ``metric``/``arm_or_change`` replaced)."""
    pubs = getattr(ts, "_published", None)
    if pubs is None:
        return None
    m = pubs[(pubs["experiment"] == pub["experiment"]) & (pubs["metric"] == (metric or pub["metric"]))
             & (pubs["arm_or_change"] == (which or pub["arm_or_change"]))]
    if m.empty or not np.isfinite(m["value"].iloc[0]):
        return None
    return float(m["value"].iloc[0])


def published_vs_reproduced(ts: TraceSet, published: pd.DataFrame | str | Path,
                            candidate_arm: str = "dlfp") -> tuple[pd.DataFrame, list[str]]:
    """Every published number beside the reproduced one, per backend that has the experiment's traces.

    For each row of ``published.csv`` (experiment, metric, arm_or_change,
    value, unit, direction, qualitative, source_sentence) the reproduced
    value is computed from the traces in the same unit: ``change_seed_<s>``,
    ``change_mean``/``change``, ``change_ci95_low``/``_high`` are paired
    changes of ``candidate_arm`` vs the baseline in percent (negative =
    lower); an arm name is that arm's mean over seeds (ms, or SLO passes per
    trial); ``all_arms_seeds`` sums both arms over seeds; token ids count each
    agreeing pair once per arm; ``verdict`` is win / not a win (P99 ITL
    interval below zero and no fewer SLO passes).

    Columns (``PVR_COLUMNS``): ``agrees`` is the direction check (or, for
    rows without a direction, equality of the stated fact); ``within_interval``
    (with the interval used in ``paper_interval``) is set for a mean change
    whose experiment publishes a 95 % interval, and for a per-seed change
    against that interval or, without one, against the range of the
    published per-seed changes; ``None`` (Markdown: "n/a") where the paper
    gives no interval.

    Returns:
        (table, messages): messages name every published experiment without
        traces and every traced experiment without a published row.

    Raises:
        FileNotFoundError / ValueError: see ``load_published``.
    """
    pubs = published if isinstance(published, pd.DataFrame) else load_published(published)
    ts._published = pubs  # sibling lookups (intervals, totals)
    messages: list[str] = []
    rows = []
    traced = {}
    for backend, exp in ts.groups():
        traced.setdefault(exp, []).append(backend)
    for exp in sorted(set(pubs["experiment"])):
        if exp not in traced:
            messages.append(f"published experiment {exp!r} has no traces in the traces directory")
    for exp in sorted(traced):
        if exp not in set(pubs["experiment"]):
            messages.append(f"experiment {exp!r} has no row in published.csv (nothing to compare; reproduced only)")
    for _, pub in pubs.iterrows():
        exp = pub["experiment"]
        for backend in traced.get(exp, [""]):
            base = dict(backend=backend, experiment=exp, metric=pub["metric"], arm_or_change=pub["arm_or_change"],
                        unit=pub["unit"], published=pub["value"], published_direction=pub["direction"],
                        published_qualitative=pub.get("qualitative", ""), source_sentence=pub["source_sentence"])
            if not backend:
                base.update(reproduced=np.nan, reproduced_direction="", agrees=None, within_interval=None,
                            paper_interval="",
                            note=f"no traces for {exp}")
            else:
                base.update(_reproduce_row(ts, backend, pub, candidate_arm))
            rows.append(base)
    df = pd.DataFrame(rows, columns=PVR_COLUMNS)
    if not df.empty:
        df = (df.assign(_untraced=df["backend"] == "")
              .sort_values(["_untraced", "backend", "experiment", "metric", "arm_or_change"], kind="stable")
              .drop(columns="_untraced").reset_index(drop=True))
    return df, messages


def empty_pvr() -> pd.DataFrame:
    """An empty ``published_vs_reproduced`` table (``PVR_COLUMNS``), for when published.csv is unavailable."""
    return pd.DataFrame(columns=PVR_COLUMNS)


def _yes_no(v: Any, yes: str, no: str) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return ""
    return yes if bool(v) else no


def pvr_markdown_frame(pvr: pd.DataFrame) -> pd.DataFrame:
    """A compact view of ``published_vs_reproduced`` for Markdown (no source sentences)."""
    def num(v, unit):
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

    out = []
    for _, r in pvr.iterrows():
        pub = num(r["published"], r["unit"])
        if r["published_qualitative"]:
            pub = f"{pub} ({r['published_qualitative']})" if pub else r["published_qualitative"]
        out.append({"backend": r["backend"], "experiment": r["experiment"], "metric": r["metric"],
                    "arm or change": r["arm_or_change"], "published": pub,
                    "reproduced": num(r["reproduced"], r["unit"]),
                    "direction agrees": _yes_no(r["agrees"], "yes", "NO"),
                    "within paper's interval": _yes_no(r["within_interval"], "yes", "no")
                    or ("n/a" if isinstance(r["reproduced"], (float, int)) and np.isfinite(r["reproduced"])
                        else ""),
                    "paper's interval": r.get("paper_interval", ""),
                    "note": r["note"]})
    return pd.DataFrame(out)


# ----------------------------------------------------------------- root cause


def guarded_iterations(trial: Trial) -> pd.DataFrame:
    """Guarded iterations of a trial with the previous iteration's device time.

    Columns: iteration, schedule_s, prefill_tokens, num_decodes, cap,
    host_interval_s, device_time_s, prev_device_time_s (the device time of
    the iteration scheduled just before, in log order; NaN for the first).
    """
    it = trial.iterations.sort_values("iteration", kind="stable").reset_index(drop=True)
    it = it.assign(prev_device_time_s=it["device_time_s"].shift(1))
    g = it[it["guarded"]]
    return g[["iteration", "schedule_s", "prefill_tokens", "num_decodes", "cap", "host_interval_s",
              "device_time_s", "prev_device_time_s"]].reset_index(drop=True)


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def root_cause(ts: TraceSet) -> pd.DataFrame:
    """Host interval against completed device time, per guarded iteration, per arm (seeds pooled).

    Columns: backend, experiment, arm, model, tp, scheduling, n_guarded,
    r_own (Pearson r of host_interval_s with the same iteration's
    device_time_s), r_prev (with the previous iteration's device time),
    host_interval_p50_ms, device_time_p50_ms, host_minus_device_p50_ms. Arms
    without guarded iterations (e.g. an uncapped baseline) are left out; r is
    NaN with fewer than 3 finite pairs.
    """
    if ts._root_cause is not None:
        return ts._root_cause
    rows = []
    for backend, experiment in ts.groups():
        cfg = ts.config(backend, experiment)
        for arm in ts.arms(backend, experiment):
            frames = [guarded_of(ts, lt) for lt in ts.select(backend, experiment, arm)]
            g = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
            if g.empty:
                continue
            h = g["host_interval_s"].to_numpy(float)
            d = g["device_time_s"].to_numpy(float)
            p = g["prev_device_time_s"].to_numpy(float)
            rows.append(dict(
                backend=backend, experiment=experiment, arm=arm,
                model=cfg.model if cfg else "", tp=cfg.tp if cfg else np.nan,
                scheduling=cfg.scheduling if cfg else "", n_guarded=len(g),
                r_own=_pearson(h, d), r_prev=_pearson(h, p),
                host_interval_p50_ms=metrics.to_ms(metrics.percentile(h, 50)),
                device_time_p50_ms=metrics.to_ms(metrics.percentile(d, 50)),
                host_minus_device_p50_ms=metrics.to_ms(metrics.percentile(h - d, 50)),
            ))
    cols = ["backend", "experiment", "arm", "model", "tp", "scheduling", "n_guarded", "r_own", "r_prev",
            "host_interval_p50_ms", "device_time_p50_ms", "host_minus_device_p50_ms"]
    ts._root_cause = pd.DataFrame(rows, columns=cols)
    return ts._root_cause


def guarded_of(ts: TraceSet, lt: LoadedTrial) -> pd.DataFrame:
    """``guarded_iterations`` of a loaded trial, computed once at load time."""
    d = ts._digests.get(str(lt.path))
    return d["guarded"] if d is not None else guarded_iterations(lt.trial)


# --------------------------------------------------------------------------- cap trajectory


def cap_trajectory(trial: Trial) -> pd.DataFrame:
    """The controller's view of one trial, one row per iteration.

    Columns: iteration, time_s (scheduler call), cap (in force; NaN = none),
    cap_after, guarded, observed_interval_s (the interval the policy was
    fed; NaN where none), prefill_tokens, num_decodes.
    """
    it = trial.iterations.sort_values("iteration", kind="stable")
    return pd.DataFrame({
        "iteration": it["iteration"].to_numpy(),
        "time_s": it["schedule_s"].to_numpy(float),
        "cap": it["cap"].astype("Float64").to_numpy(dtype=float, na_value=np.nan),
        "cap_after": it["cap_after"].astype("Float64").to_numpy(dtype=float, na_value=np.nan),
        "guarded": it["guarded"].to_numpy(bool),
        "observed_interval_s": it["observed_interval_s"].to_numpy(float),
        "prefill_tokens": it["prefill_tokens"].to_numpy(),
        "num_decodes": it["num_decodes"].to_numpy(),
    })


def policy_target_s(lt: LoadedTrial) -> float | None:
    """The arm's controller target (seconds) from its config, else from metadata; ``None`` for a non-adaptive arm."""
    if lt.config is not None and lt.arm in lt.config.arms:
        pc = lt.config.arms[lt.arm]
        return float(pc.target_s) if pc.policy in ("dlfp", "dlfps") else None
    pol = lt.trial.metadata.get("policy")
    if isinstance(pol, dict) and pol.get("target_s") is not None:
        return float(pol["target_s"])
    return None


def controller_summary(trial: Trial) -> dict[str, Any]:
    """Counts of one trial's controller log: iterations, guarded, cap changes, min/max cap, median observed interval (ms)."""
    ct = cap_trajectory(trial)
    g = ct[ct["guarded"]]
    caps = ct["cap"].dropna()
    changes = int((ct["cap_after"].dropna().diff().fillna(0) != 0).sum())
    return dict(iterations=len(ct), guarded=len(g), cap_changes=changes,
                cap_min=float(caps.min()) if len(caps) else float("nan"),
                cap_max=float(caps.max()) if len(caps) else float("nan"),
                observed_interval_p50_ms=metrics.to_ms(metrics.percentile(g["observed_interval_s"], 50)))


# --------------------------------------------------------------------------- trade-off / frontier


def arm_points(ts: TraceSet) -> pd.DataFrame:
    """Absolute P99 TTFT and P99 ITL per arm (mean over seeds with a 95 % t-interval across seeds).

    Columns: backend, experiment, arm, seeds, p99_itl_ms_mean, p99_itl_ms_ci_low,
    p99_itl_ms_ci_high, p99_ttft_ms_mean, p99_ttft_ms_ci_low, p99_ttft_ms_ci_high.
    """
    s = ts.summary()
    rows = []
    for backend, experiment in ts.groups():
        for arm in ts.arms(backend, experiment):
            a = s[(s["backend"] == backend) & (s["experiment"] == experiment) & (s["arm"] == arm)]
            row: dict[str, Any] = dict(backend=backend, experiment=experiment, arm=arm, seeds=len(a))
            for col in ("p99_itl_ms", "p99_ttft_ms"):
                v = a[col].to_numpy(float)
                v = v[np.isfinite(v)]
                if v.size:
                    r = stats.summarize_changes(v)
                    row.update({f"{col}_mean": r.mean, f"{col}_ci_low": r.ci_low, f"{col}_ci_high": r.ci_high})
                else:
                    row.update({f"{col}_mean": np.nan, f"{col}_ci_low": np.nan, f"{col}_ci_high": np.nan})
            rows.append(row)
    cols = ["backend", "experiment", "arm", "seeds"] + [f"{c}_{k}" for c in ("p99_itl_ms", "p99_ttft_ms")
                                                         for k in ("mean", "ci_low", "ci_high")]
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------- writing


def _fmt_float(col: str, v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    v = float(v)
    if "_pct" in col:
        return f"{v:.2f}"
    if "_ms" in col:
        return f"{v:.3f}"
    if col.endswith("_j") or "_j_" in col:
        return f"{v:.6g}"
    if "fraction" in col or col.startswith("r_") or col.endswith("_rps") or col == "value":
        return f"{v:.4f}"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return f"{v:.6g}"


def format_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Every cell as text with the module's fixed float formatting (NaN/None -> ""; booleans -> yes/no)."""
    out = pd.DataFrame(index=df.index)
    for col in df.columns:
        vals = []
        for v in df[col].tolist():
            if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
                vals.append("")
            elif isinstance(v, (bool, np.bool_)):
                vals.append("yes" if v else "no")
            elif isinstance(v, (float, np.floating)):
                vals.append(_fmt_float(col, float(v)))
            elif isinstance(v, (int, np.integer)):
                vals.append(str(int(v)))
            else:
                vals.append(str(v))
        out[col] = vals
    return out


def to_markdown(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of ``df`` (cells formatted by ``format_frame``); ``"(no rows)"`` if empty."""
    if df.empty:
        return "(no rows)\n"
    f = format_frame(df)

    def esc(s: str) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(esc(c) for c in f.columns) + " |",
             "| " + " | ".join("---" for _ in f.columns) + " |"]
    lines += ["| " + " | ".join(esc(x) for x in row) + " |" for row in f.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", newline="\n") as f:
        f.write(text)
    os.replace(tmp, path)


def write_table(df: pd.DataFrame, results_dir: str | Path, name: str, *, markdown: pd.DataFrame | None = None,
                title: str | None = None, notes: Sequence[str] = ()) -> tuple[Path, Path]:
    """Write ``<results_dir>/<name>.csv`` (``df``) and ``<name>.md`` (``markdown`` or ``df``), atomically.

    ``notes`` are appended to the Markdown as a bullet list. Returns the two
    paths. Formatting is fixed (see ``format_frame``), so the same frame gives
    the same bytes.
    """
    results_dir = Path(results_dir)
    csv_path, md_path = results_dir / f"{name}.csv", results_dir / f"{name}.md"
    _atomic_write(csv_path, format_frame(df).to_csv(index=False, lineterminator="\n"))
    md = (f"# {title}\n\n" if title else "") + to_markdown(markdown if markdown is not None else df)
    if notes:
        md += "\n" + "".join(f"- {n}\n" for n in notes)
    _atomic_write(md_path, md)
    return csv_path, md_path


def problems_frame(ts: TraceSet) -> pd.DataFrame:
    """Trial directories that failed to load: ``trial`` (relative to the traces root) and ``problem``."""
    rows = []
    for path, msg in ts.problems:
        rel = os.path.relpath(path, ts.root)
        rows.append(dict(trial=rel, problem=msg.replace(str(ts.root) + os.sep, "")))
    return pd.DataFrame(rows, columns=["trial", "problem"]).sort_values("trial", kind="stable").reset_index(drop=True)


def write_problems(ts: TraceSet, results_dir: str | Path) -> tuple[Path, Path]:
    """Write ``problems.csv``/``.md``: every corrupt or partial trial that the tables and figures leave out."""
    df = problems_frame(ts)
    notes = [] if len(df) else ["No corrupt or partial trials."]
    return write_table(df, results_dir, "problems", title="Trials not used (corrupt or partial)", notes=notes)


# --------------------------------------------------------------------------- sim vs emu (issue 6)

#: Issue 6's target: P99 ITL of the simulator within 10 % of the emulated-device backend.
SIM_EMU_ITL_TOL = 0.10
SIM_VS_EMU_COLUMNS = [
    "experiment", "arm", "seeds",
    "p50_itl_ms_sim", "p50_itl_ms_emu", "p50_itl_rel_diff_pct",
    "p99_itl_ms_sim", "p99_itl_ms_emu", "p99_itl_rel_diff_pct", "p99_itl_within_10pct",
    "p99_ttft_ms_sim", "p99_ttft_ms_emu", "p99_ttft_rel_diff_pct",
    "p99_itl_change_pct_sim", "p99_itl_change_pct_emu", "p99_itl_effect_same_sign",
    "p99_ttft_change_pct_sim", "p99_ttft_change_pct_emu", "p99_ttft_effect_same_sign",
    "r_own_sim", "r_prev_sim", "r_own_emu", "r_prev_emu",
]


def _rel_pct(ref: float, other: float) -> float:
    """``(other / ref - 1) * 100``; NaN when either is missing or ``ref`` is 0."""
    if not (np.isfinite(ref) and np.isfinite(other)) or ref == 0:
        return float("nan")
    return 100.0 * (other / ref - 1.0)


def _same_sign(a: float, b: float) -> bool | None:
    if not (np.isfinite(a) and np.isfinite(b)):
        return None
    return bool(np.sign(a) == np.sign(b))


def sim_vs_emu(ts: TraceSet, sim: str = "sim", emu: str = "emu", tol: float = SIM_EMU_ITL_TOL) -> pd.DataFrame:
    """Simulator against the emulated-device backend (real vLLM loop), per experiment on both, per shared arm.

    Only seeds present in the arm on BOTH backends are used; every value is a
    mean over those seeds (``seeds`` counts them). ``*_rel_diff_pct`` is the
    simulator relative to the emulator, ``(sim / emu - 1) * 100`` (the emu
    runs vLLM's real engine loop, so it is the reference); issue 6's target
    ``p99_itl_within_10pct`` is ``|p99_itl_rel_diff_pct| <= 100 * tol``.
    For non-baseline arms, ``p99_{itl,ttft}_change_pct_<backend>`` is the
    paired change vs the baseline (``paired``: percent, negative = lower)
    over the same seeds, and ``*_effect_same_sign`` whether both backends
    give the effect the same sign (``None`` on baseline rows). ``r_own`` /
    ``r_prev`` are ``root_cause``'s correlations of the host interval with
    the guarded iteration's own / the previous iteration's device time (NaN
    for an arm without guarded iterations). Columns ``SIM_VS_EMU_COLUMNS``.
    """
    s = ts.summary()
    rc = root_cause(ts)
    rows = []
    exps = sorted({e for b, e in ts.groups() if b == sim} & {e for b, e in ts.groups() if b == emu})
    for exp in exps:
        base = ts.baseline_arm(sim, exp)
        arms = [a for a in ts.arms(sim, exp) if a in set(ts.arms(emu, exp))]
        for arm in arms:
            gs = s[(s["backend"] == sim) & (s["experiment"] == exp) & (s["arm"] == arm)].set_index("seed")
            ge = s[(s["backend"] == emu) & (s["experiment"] == exp) & (s["arm"] == arm)].set_index("seed")
            seeds = sorted(set(gs.index) & set(ge.index))
            row: dict[str, Any] = dict(experiment=exp, arm=arm, seeds=len(seeds))
            for col in ("p50_itl_ms", "p99_itl_ms", "p99_ttft_ms"):
                vs = float(gs.loc[seeds, col].mean()) if seeds else float("nan")
                ve = float(ge.loc[seeds, col].mean()) if seeds else float("nan")
                name = col[: -len("_ms")]
                row.update({f"{col}_sim": vs, f"{col}_emu": ve, f"{name}_rel_diff_pct": _rel_pct(ve, vs)})
            d = row["p99_itl_rel_diff_pct"]
            row["p99_itl_within_10pct"] = None if not np.isfinite(d) else bool(abs(d) <= 100 * tol + 1e-9)
            for col in ("p99_itl_ms", "p99_ttft_ms"):
                name = col[: -len("_ms")]
                ch = {}
                for backend, g in ((sim, gs), (emu, ge)):
                    v = float("nan")
                    if arm != base:
                        b = s[(s["backend"] == backend) & (s["experiment"] == exp) & (s["arm"] == base)]
                        b = b.set_index("seed")[col]
                        ok = [sd for sd in seeds if sd in b.index and np.isfinite(b[sd]) and b[sd] != 0
                              and np.isfinite(g.loc[sd, col])]
                        if ok:
                            v = -100.0 * stats.paired_change(b.loc[ok].to_numpy(float),
                                                             g.loc[ok, col].to_numpy(float)).mean
                    ch[backend] = v
                row[f"{name}_change_pct_sim"], row[f"{name}_change_pct_emu"] = ch[sim], ch[emu]
                row[f"{name}_effect_same_sign"] = None if arm == base else _same_sign(ch[sim], ch[emu])
            for backend, suffix in ((sim, "sim"), (emu, "emu")):
                r = rc[(rc["backend"] == backend) & (rc["experiment"] == exp) & (rc["arm"] == arm)]
                row[f"r_own_{suffix}"] = float(r["r_own"].iloc[0]) if len(r) else float("nan")
                row[f"r_prev_{suffix}"] = float(r["r_prev"].iloc[0]) if len(r) else float("nan")
            rows.append(row)
    return pd.DataFrame(rows, columns=SIM_VS_EMU_COLUMNS)


def sim_vs_emu_markdown_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A compact view of ``sim_vs_emu`` (strings): sim / emu pairs in one cell each."""
    def pair(a, b, fmt):
        return "" if not (np.isfinite(a) or np.isfinite(b)) else f"{fmt(a)} / {fmt(b)}"

    ms = lambda v: "–" if not np.isfinite(v) else f"{v:.1f}"  # noqa: E731
    pct = lambda v: "–" if not np.isfinite(v) else f"{v:+.1f} %"  # noqa: E731
    r2 = lambda v: "–" if not np.isfinite(v) else f"{v:.2f}"  # noqa: E731
    out = []
    for _, r in df.iterrows():
        out.append({
            "experiment": r["experiment"], "arm": r["arm"], "seeds": r["seeds"],
            "P50 ITL ms sim / emu": pair(r["p50_itl_ms_sim"], r["p50_itl_ms_emu"], ms),
            "P99 ITL ms sim / emu": pair(r["p99_itl_ms_sim"], r["p99_itl_ms_emu"], ms),
            "P99 ITL diff": pct(r["p99_itl_rel_diff_pct"]),
            "within 10 %": _yes_no(r["p99_itl_within_10pct"], "met", "MISSED"),
            "P99 TTFT ms sim / emu": pair(r["p99_ttft_ms_sim"], r["p99_ttft_ms_emu"], ms),
            "P99 TTFT diff": pct(r["p99_ttft_rel_diff_pct"]),
            "ΔP99 ITL sim / emu": pair(r["p99_itl_change_pct_sim"], r["p99_itl_change_pct_emu"], pct),
            "ITL effect sign agrees": _yes_no(r["p99_itl_effect_same_sign"], "yes", "NO"),
            "ΔP99 TTFT sim / emu": pair(r["p99_ttft_change_pct_sim"], r["p99_ttft_change_pct_emu"], pct),
            "TTFT effect sign agrees": _yes_no(r["p99_ttft_effect_same_sign"], "yes", "NO"),
            "r own / prev, sim": pair(r["r_own_sim"], r["r_prev_sim"], r2),
            "r own / prev, emu": pair(r["r_own_emu"], r["r_prev_emu"], r2),
        })
    return pd.DataFrame(out)


def write_sim_vs_emu(ts: TraceSet, results_dir: str | Path) -> pd.DataFrame:
    """Compute ``sim_vs_emu`` and write ``sim_vs_emu.csv``/``.md`` (a note says so when no experiment is on both)."""
    df = sim_vs_emu(ts)
    notes = ["diff = simulator relative to the emulated-device backend, (sim / emu - 1); target |P99 ITL diff| "
             "<= 10 % (issue 6).",
             "ΔP99 = paired change of the arm vs the baseline (negative = lower), mean over the seeds both "
             "backends have.",
             "r own / prev: Pearson r of the host interval with the guarded iteration's own / the previous "
             "iteration's device time."]
    if df.empty:
        notes.insert(0, "NO DATA: no experiment has traces on both the sim and the emu backend.")
    write_table(df, results_dir, "sim_vs_emu", markdown=sim_vs_emu_markdown_frame(df),
                title="Simulator vs emulated device (real vLLM engine loop)", notes=notes)
    return df


# --------------------------------------------------------------------------- DLFP-S (issue 8)

DLFPS_ARM = "dlfps"


def evaluation_frame(ts: TraceSet, backend: str) -> pd.DataFrame:
    """The per-trial frame ``dlfp.analysis.evaluation`` expects, for one backend (seconds).

    Columns: experiment, arm, seed, itl_p99_s, ttft_p99_s, slo_passes (from
    ``trial_summaries``; ms converted back to seconds).
    """
    s = ts.summary()
    g = s[s["backend"] == backend]
    return pd.DataFrame({"experiment": g["experiment"].to_numpy(), "arm": g["arm"].to_numpy(),
                         "seed": g["seed"].to_numpy(), "itl_p99_s": g["p99_itl_ms"].to_numpy(float) / 1e3,
                         "ttft_p99_s": g["p99_ttft_ms"].to_numpy(float) / 1e3,
                         "slo_passes": g["slo_passes"].to_numpy(float)})


def _backends_with_arm(ts: TraceSet, arm: str) -> list[str]:
    return sorted({b for b, e in ts.groups() if arm in set(ts.arms(b, e))})


def dlfps_targets(ts: TraceSet, candidate: str = DLFPS_ARM) -> pd.DataFrame:
    """``dlfp.analysis.evaluation.target_table`` per backend whose traces have the ``candidate`` arm.

    Columns: backend, then ``dlfp.analysis.evaluation.TARGET_COLUMNS`` (target,
    experiment, reached, value, threshold, detail): ``value``/``threshold``
    are fractions for change targets (positive = lower than the baseline;
    TTFT rows: increases), mean SLO passes for ``slo_passes``, and P99 ITL in
    seconds for ``frontier``; ``detail`` says it in words.
    """
    from dlfp.analysis import evaluation

    frames = []
    for backend in _backends_with_arm(ts, candidate):
        df = evaluation_frame(ts, backend)
        df = df[df["experiment"].isin([e for b, e in ts.groups() if b == backend
                                       and ts.baseline_arm(b, e) == "baseline"])]
        tt = evaluation.target_table(df, candidate=candidate)
        frames.append(tt.assign(backend=backend))
    cols = ["backend"] + list(evaluation.TARGET_COLUMNS)
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def dlfps_ablation(ts: TraceSet, candidate: str = DLFPS_ARM, reference: Sequence[str] = ("dlfp",)) -> pd.DataFrame:
    """``dlfp.analysis.evaluation.ablation_table`` per backend, over ``reference`` arms, ``candidate`` and its ablations.

    Ablation arms are those named ``<candidate>-<part switched off>`` (e.g.
    ``dlfps-no-estimator``). Columns: backend, experiment, arm,
    p99_itl_change_pct_mean, p99_itl_change_pct_ci_low,
    p99_itl_change_pct_ci_high, p99_ttft_change_pct_mean (percent, this
    module's sign: negative = lower than the baseline), slo_passes,
    slo_passes_baseline (means over seeds).
    """
    from dlfp.analysis import evaluation

    cols = ["backend", "experiment", "arm", "p99_itl_change_pct_mean", "p99_itl_change_pct_ci_low",
            "p99_itl_change_pct_ci_high", "p99_ttft_change_pct_mean", "slo_passes", "slo_passes_baseline"]
    frames = []
    for backend in _backends_with_arm(ts, candidate):
        present = set().union(*(set(ts.arms(b, e)) for b, e in ts.groups() if b == backend))
        arms = [a for a in reference if a in present] + [candidate] + sorted(
            a for a in present if a.startswith(candidate + "-"))
        df = evaluation_frame(ts, backend)
        ab = evaluation.ablation_table(df, arms)
        frames.append(pd.DataFrame({
            "backend": backend, "experiment": ab["experiment"], "arm": ab["arm"],
            # "+ 0.0" turns -0.0 (an arm identical to the baseline) into 0.0, so tables never print "-0.00".
            "p99_itl_change_pct_mean": -100 * ab["itl_reduction"] + 0.0,
            "p99_itl_change_pct_ci_low": -100 * ab["itl_ci_high"] + 0.0,
            "p99_itl_change_pct_ci_high": -100 * ab["itl_ci_low"] + 0.0,
            "p99_ttft_change_pct_mean": 100 * ab["ttft_increase"] + 0.0,
            "slo_passes": ab["slo_passes"], "slo_passes_baseline": ab["slo_passes_baseline"]}))
    if not frames:
        return pd.DataFrame(columns=cols)
    out = pd.concat(frames, ignore_index=True)[cols]
    return out.sort_values(["backend", "experiment"], kind="stable").reset_index(drop=True)


def write_dlfps(ts: TraceSet, results_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write ``dlfps_targets.csv``/``.md`` and ``dlfps_ablation.csv``/``.md``; a note says so when no trial has the arm."""
    tt, ab = dlfps_targets(ts), dlfps_ablation(ts)
    none = [] if len(tt) else [f"NO DATA: no traces have the {DLFPS_ARM!r} arm."]
    tmd = tt[["backend", "target", "experiment", "reached", "detail"]] if len(tt) else tt
    write_table(tt, results_dir, "dlfps_targets", markdown=tmd,
                title="DLFP-S against the issue-8 targets (what is reached, not what was hoped)",
                notes=none + ["value/threshold: change fractions with positive = lower than the baseline (TTFT "
                              "rows: increase); mean SLO passes; frontier rows: P99 ITL in seconds."])
    write_table(ab, results_dir, "dlfps_ablation", title="DLFP-S ablation: paired change vs the baseline",
                notes=none + ["ΔP99 in percent, negative = lower than the baseline; 95 % paired t-interval over "
                              "seeds; SLO passes are means per trial."])
    return tt, ab


# --------------------------------------------------------------------------- simulator fidelity (issue 9)

FIDELITY_COLUMNS = ["arm", "metric", "real_ms", "sim_ms", "error_pct", "target_pct", "met"]


def fidelity_errors(fidelity_dir: str | Path) -> pd.DataFrame | None:
    """The seed-mean error table that ``dlfp validate-sim`` wrote (``<fidelity_dir>/errors.csv``), in long form.

    Columns ``FIDELITY_COLUMNS``: one row per (arm, metric of
    ``dlfp.studies.validation.METRICS``) with real and simulated values (ms), the
    relative error ``sim / real - 1`` (percent), the target (percent) and
    whether it is met. ``None`` when the file does not exist (validate-sim
    has not run). Never runs an engine.

    Raises:
        ValueError: the file lacks a column validate-sim writes (named).
    """
    from dlfp.studies.validation import METRICS

    p = Path(fidelity_dir) / "errors.csv"
    if not p.exists():
        return None
    err = pd.read_csv(p, dtype={"seed": str, "arm": str})
    rows = []
    for _, r in err[err["seed"] == "mean"].iterrows():
        for m, (_, target) in METRICS.items():
            need = [f"{m}_real_s", f"{m}_sim_s", f"{m}_err"]
            missing = [c for c in need if c not in err.columns]
            if missing:
                raise ValueError(f"{p}: missing column(s) {missing}")
            e = float(r[f"{m}_err"])
            rows.append(dict(arm=r["arm"], metric=m, real_ms=1e3 * float(r[f"{m}_real_s"]),
                             sim_ms=1e3 * float(r[f"{m}_sim_s"]), error_pct=100 * e, target_pct=100 * target,
                             met=bool(abs(e) <= target) if np.isfinite(e) else False))
    return pd.DataFrame(rows, columns=FIDELITY_COLUMNS)


def fidelity_effect(fidelity_dir: str | Path) -> pd.DataFrame | None:
    """``<fidelity_dir>/dlfp_effect.csv`` (validate-sim) with changes in percent; ``None`` when absent.

    Columns: seed, real_change_pct, sim_change_pct (``dlfp / baseline - 1`` of
    P99 ITL, percent), same_sign.
    """
    p = Path(fidelity_dir) / "dlfp_effect.csv"
    if not p.exists():
        return None
    e = pd.read_csv(p, dtype={"seed": str})
    return pd.DataFrame({"seed": e["seed"], "real_change_pct": 100 * e["real_change"].astype(float),
                         "sim_change_pct": 100 * e["sim_change"].astype(float),
                         "same_sign": e["same_sign"].astype(str).str.lower() == "true"})


def write_fidelity(fidelity_dir: str | Path, results_dir: str | Path) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """Write ``fidelity_errors.csv``/``.md`` and ``fidelity_effect.csv``/``.md`` from validate-sim's output.

    When ``fidelity_dir`` holds no ``errors.csv`` nothing is written and
    ``(None, None)`` is returned (the caller shows a placeholder).
    """
    err, eff = fidelity_errors(fidelity_dir), fidelity_effect(fidelity_dir)
    if err is not None:
        write_table(err, results_dir, "fidelity_errors", title="Simulator vs real vLLM engine (CPU): relative error",
                    notes=["error = sim / real - 1 of the seed mean; targets from issue 9 (10 % P50, 20 % P99)."])
    if eff is not None:
        write_table(eff, results_dir, "fidelity_effect", title="DLFP effect on P99 ITL: real engine vs simulator")
    return err, eff


# --------------------------------------------------------------------------- every table, as figures.ipynb writes it


def write_headline(ts: TraceSet, results_dir: str | Path) -> pd.DataFrame:
    """Write ``headline_per_seed`` and ``headline`` (CSV + Markdown); returns the aggregated table."""
    tables_per_seed = headline_per_seed(ts)
    head = headline(ts)
    write_table(tables_per_seed, results_dir, "headline_per_seed", title="Headline numbers per seed")
    write_table(head, results_dir, "headline", markdown=headline_markdown_frame(head),
                title="Headline: paired change vs the baseline arm (negative = lower)")
    return head


def write_published_vs_reproduced(ts: TraceSet, results_dir: str | Path,
                                  published_csv: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """Write ``published_vs_reproduced`` (CSV + Markdown); a missing/invalid published.csv is said in its place."""
    try:
        pvr, messages = published_vs_reproduced(ts, published_csv)
    except (FileNotFoundError, ValueError) as e:
        pvr, messages = empty_pvr(), [f"published numbers unavailable: {e}"]
    write_table(pvr, results_dir, "published_vs_reproduced", markdown=pvr_markdown_frame(pvr),
                title="Published vs reproduced", notes=messages)
    return pvr, messages


def write_root_cause(ts: TraceSet, results_dir: str | Path) -> pd.DataFrame:
    """Write ``root_cause`` (CSV + Markdown)."""
    rc = root_cause(ts)
    write_table(rc, results_dir, "root_cause", title="Host interval vs device time (guarded iterations)")
    return rc


def write_arm_points(ts: TraceSet, results_dir: str | Path) -> pd.DataFrame:
    """Write ``arm_points`` (CSV + Markdown)."""
    pts = arm_points(ts)
    write_table(pts, results_dir, "arm_points", title="P99 ITL and TTFT per arm (mean, 95 % interval)")
    return pts


def write_tables(ts: TraceSet, results_dir: str | Path, published_csv: str | Path,
                 fidelity_dir: str | Path | None = None) -> list[str]:
    """Every table ``figures.ipynb`` writes, by the same functions, without figures (for the regression test).

    ``fidelity_dir`` defaults to ``<results_dir>/fidelity``. Returns the
    names of the tables written (``<name>.csv`` and ``<name>.md`` each).
    """
    results_dir = Path(results_dir)
    write_problems(ts, results_dir)
    write_headline(ts, results_dir)
    write_published_vs_reproduced(ts, results_dir, published_csv)
    write_root_cause(ts, results_dir)
    write_arm_points(ts, results_dir)
    write_sim_vs_emu(ts, results_dir)
    write_dlfps(ts, results_dir)
    names = ["problems", "headline_per_seed", "headline", "published_vs_reproduced", "root_cause", "arm_points",
             "sim_vs_emu", "dlfps_targets", "dlfps_ablation"]
    err, eff = write_fidelity(fidelity_dir if fidelity_dir is not None else results_dir / "fidelity", results_dir)
    names += (["fidelity_errors"] if err is not None else []) + (["fidelity_effect"] if eff is not None else [])
    return names
