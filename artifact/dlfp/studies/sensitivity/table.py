"""The sensitivity sweep's table, its Markdown and its output files, from per-cell summaries.

Changes are ``dlfp.analysis.stats.paired_change`` in percent, ``100 * (arm -
baseline) / baseline`` per seed (NEGATIVE = the arm lowers the metric, the sign
convention of ``data/paper/published.csv``), with the two-sided 95 %
Student-t interval over seeds. Latencies are milliseconds in the table.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from dlfp.analysis.markdown import atomic_write, markdown_rows
from dlfp.analysis.stats import paired_change
from dlfp.studies.sensitivity.plan import SensitivityError
from dlfp.studies.sensitivity.run import STALL_FACTOR, TRIAL_COLUMNS

#: Columns of the sweep table (one row per variant x candidate arm).
TABLE_COLUMNS = ("experiment", "field", "value", "is_default", "arm", "n_seeds",
                 "baseline_p50_itl_ms", "baseline_stall_pct", "arm_stall_pct", "baseline_p99_itl_ms", "arm_p99_itl_ms",
                 "p99_itl_change_pct", "p99_itl_ci_low_pct", "p99_itl_ci_high_pct", "p99_itl_ci_excludes_zero",
                 "p99_itl_seeds_lower",
                 "p99_ttft_change_pct", "p99_ttft_ci_low_pct", "p99_ttft_ci_high_pct",
                 "baseline_slo_passes", "arm_slo_passes", "slo_passes_change",
                 "paper_p99_itl_direction", "sign_agrees")
#: A per-seed change within +- this many percent counts as "unchanged" in ``stall_sign_table``.
UNCHANGED_PCT = 0.5


def paper_directions(published: pd.DataFrame | str | Path | None) -> dict[str, str]:
    """``{experiment: "increase"|"decrease"}``: the published direction of DLFP's P99 ITL change.

    Taken from the ``p99_itl`` rows of ``data/paper/published.csv`` (column ``direction``); an experiment
    whose rows disagree or give no direction is left out.
    """
    if published is None:
        return {}
    df = published if isinstance(published, pd.DataFrame) else pd.read_csv(published)
    out = {}
    sub = df[(df["metric"] == "p99_itl") & df["direction"].isin(["increase", "decrease"])]
    for exp, g in sub.groupby("experiment", sort=True):
        dirs = set(g["direction"])
        if len(dirs) == 1:
            out[str(exp)] = dirs.pop()
    return out


def _pct_change(base: np.ndarray, cand: np.ndarray) -> tuple[float, float, float]:
    """Mean, CI low and CI high of the per-seed change ``100 * (cand - base) / base`` (percent)."""
    pc = paired_change(base, cand).as_percent()
    return pc.mean, pc.ci_low, pc.ci_high


def _sign_agrees(arm: str, direction: str, itl_change: float) -> str:
    """"yes"/"no": the dlfp arm's mean P99 ITL change has the paper's direction; "" for other arms or none."""
    if arm != "dlfp" or not direction:
        return ""
    return "yes" if (itl_change < 0 if direction == "decrease" else itl_change > 0) else "no"


def _table_row(b: pd.DataFrame, c: pd.DataFrame, keys: dict[str, Any], direction: str) -> dict[str, Any]:
    """One ``build_table`` row: baseline rows ``b`` and candidate rows ``c`` of one variant, indexed by seed."""
    itl = _pct_change(b["itl_p99_s"].to_numpy(float), c["itl_p99_s"].to_numpy(float))
    ttft = _pct_change(b["ttft_p99_s"].to_numpy(float), c["ttft_p99_s"].to_numpy(float))
    return {
        **keys, "n_seeds": len(c),
        "baseline_p50_itl_ms": 1e3 * float(b["itl_p50_s"].mean()),
        "baseline_stall_pct": 100 * float(b["stall_frac"].mean()),
        "arm_stall_pct": 100 * float(c["stall_frac"].mean()),
        "baseline_p99_itl_ms": 1e3 * float(b["itl_p99_s"].mean()),
        "arm_p99_itl_ms": 1e3 * float(c["itl_p99_s"].mean()),
        "p99_itl_change_pct": itl[0], "p99_itl_ci_low_pct": itl[1], "p99_itl_ci_high_pct": itl[2],
        "p99_itl_ci_excludes_zero": bool(np.isfinite(itl[1]) and (itl[1] > 0 or itl[2] < 0)),
        "p99_itl_seeds_lower": int((c["itl_p99_s"].to_numpy(float) < b["itl_p99_s"].to_numpy(float)).sum()),
        "p99_ttft_change_pct": ttft[0], "p99_ttft_ci_low_pct": ttft[1], "p99_ttft_ci_high_pct": ttft[2],
        "baseline_slo_passes": float(b["slo_passes"].mean()),
        "arm_slo_passes": float(c["slo_passes"].mean()),
        "slo_passes_change": float((c["slo_passes"].to_numpy(float) - b["slo_passes"].to_numpy(float)).mean()),
        "paper_p99_itl_direction": direction, "sign_agrees": _sign_agrees(keys["arm"], direction, itl[0]),
    }


def build_table(trials: pd.DataFrame, directions: dict[str, str] | None = None) -> pd.DataFrame:
    """The sweep table from per-cell summaries: one row per (experiment, field, value, candidate arm).

    Args:
        trials: ``TRIAL_COLUMNS`` rows (``itl_p99_s``/``ttft_p99_s`` in seconds); the baseline arm of each
            experiment is the first arm listed for it (row order), the others are candidates.
        directions: ``{experiment: "increase"|"decrease"}`` (``paper_directions``) for ``sign_agrees``.

    Returns:
        ``TABLE_COLUMNS``: P50/P99 ITL means over seeds in ms; stalled-gap shares (``stall_frac``) as percent
        means over seeds; changes in percent, ``100 * (arm - baseline) /
        baseline`` paired by seed (NEGATIVE = the arm lowers it), mean and 95 % Student-t CI over seeds (NaN
        with one seed); SLO passes as means over seeds and the mean paired difference (requests);
        ``p99_itl_seeds_lower``: seeds on which the arm's P99 ITL is below the baseline's;
        ``sign_agrees`` ("yes"/"no") for the ``dlfp`` arm where the paper gives a direction, else "".
        Rows in first-appearance order of (experiment, field, value) then arm.

    Raises:
        SensitivityError: a missing column, or a candidate with a seed the baseline lacks.
    """
    missing = [c for c in TRIAL_COLUMNS if c not in trials.columns]
    if missing:
        raise SensitivityError(f"trial summaries lack column(s) {missing}")
    directions = directions or {}
    rows = []
    for exp in pd.unique(trials["experiment"]):
        te = trials[trials["experiment"] == exp]
        arms = list(pd.unique(te["arm"]))
        base_arm, cands = arms[0], arms[1:]
        for fld, val in te[["field", "value"]].drop_duplicates().itertuples(index=False):
            tv = te[(te["field"] == fld) & (te["value"] == val)]
            b = tv[tv["arm"] == base_arm].set_index("seed").sort_index()
            for arm in cands:
                c = tv[tv["arm"] == arm].set_index("seed").sort_index()
                if not set(c.index) <= set(b.index):
                    raise SensitivityError(f"{exp} {fld}={val}: arm {arm!r} has seeds the baseline lacks")
                keys = {"experiment": exp, "field": fld, "value": val, "is_default": bool(tv["is_default"].iloc[0]),
                        "arm": arm}
                rows.append(_table_row(b.loc[c.index], c, keys, directions.get(str(exp), "")))
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


def flips(table: pd.DataFrame, arm: str = "dlfp") -> pd.DataFrame:
    """Rows of ``table`` (for ``arm``) whose P99 ITL change has the opposite sign to the same experiment's
    default-config row (the row of the first field with ``is_default``)."""
    out = []
    t = table[table["arm"] == arm]
    for exp, g in t.groupby("experiment", sort=False):
        d = g[g["is_default"]]
        if d.empty:
            continue
        ref = float(d["p99_itl_change_pct"].iloc[0])
        out.append(g[np.sign(g["p99_itl_change_pct"]) != np.sign(ref)])
    return pd.concat(out) if out else t.iloc[0:0]


def stall_sign_table(trials: pd.DataFrame, arm: str = "dlfp", threshold: float = 0.01) -> pd.DataFrame:
    """Counts of per-seed P99 ITL change signs of ``arm`` vs the baseline, split by the baseline's ``stall_frac``
    below / at-or-above ``threshold`` (1 %: where the P99 gap starts to be a stalled gap).

    Distinct runs only: ``slo`` variants (same runs, other metric) are left out and default-valued variants
    are counted once per experiment. Returns columns ``baseline_stalls``, ``lower``, ``unchanged``, ``higher``.
    """
    t = trials[trials["field"] != "slo"].copy()
    t.loc[t["is_default"].astype(bool), ["field", "value"]] = ["(default)", "(default)"]
    t = t.drop_duplicates(["experiment", "field", "value", "arm", "seed"])
    arms = {e: list(pd.unique(g["arm"])) for e, g in t.groupby("experiment", sort=False)}
    rows = {f"< {100 * threshold:g} %": [0, 0, 0], f">= {100 * threshold:g} %": [0, 0, 0]}
    for (exp, _f, _v), g in t.groupby(["experiment", "field", "value"], sort=False):
        base = g[g["arm"] == arms[exp][0]].set_index("seed")
        cand = g[g["arm"] == arm].set_index("seed")
        for seed in cand.index.intersection(base.index):
            b, c = float(base.at[seed, "itl_p99_s"]), float(cand.at[seed, "itl_p99_s"])
            ch = 100 * (c - b) / b
            k = 0 if ch < -UNCHANGED_PCT else 2 if ch > UNCHANGED_PCT else 1
            key = list(rows)[0 if float(base.at[seed, "stall_frac"]) < threshold else 1]
            rows[key][k] += 1
    return pd.DataFrame([(k, *v) for k, v in rows.items()], columns=["baseline_stalls", "lower", "unchanged", "higher"])


#: Header and alignment of the sweep table in Markdown.
_MD_HEADER = ("experiment", "field", "value", "arm", "base P50 ITL ms", "stalls % base / arm", "base P99 ITL ms",
              "arm P99 ITL ms", "P99 ITL change % [95 % CI]", "seeds lower", "P99 TTFT change %",
              "SLO passes base -> arm (change)", "paper", "sign agrees")
_MD_ALIGN = ("left", "left", "left", "left", "right", "left", "right", "right", "left", "left", "right", "left",
             "left", "left")


def _md_cells(r: Any) -> tuple[str, ...]:
    """The Markdown cells of one sweep-table row (a ``TABLE_COLUMNS`` named tuple)."""
    ci = ("" if not math.isfinite(r.p99_itl_ci_low_pct)
          else f" [{r.p99_itl_ci_low_pct:+.1f}, {r.p99_itl_ci_high_pct:+.1f}]")
    return (r.experiment, r.field, f"{r.value}{' *' if r.is_default else ''}", r.arm,
            f"{r.baseline_p50_itl_ms:.2f}", f"{r.baseline_stall_pct:.2f} / {r.arm_stall_pct:.2f}",
            f"{r.baseline_p99_itl_ms:.1f}", f"{r.arm_p99_itl_ms:.1f}", f"{r.p99_itl_change_pct:+.1f}{ci}",
            f"{r.p99_itl_seeds_lower}/{r.n_seeds}", f"{r.p99_ttft_change_pct:+.1f}",
            f"{r.baseline_slo_passes:.2f} -> {r.arm_slo_passes:.2f} ({r.slo_passes_change:+.2f})",
            r.paper_p99_itl_direction, r.sign_agrees)


def _md_preamble(command: str, seeds: Sequence[int]) -> list[str]:
    """Title and the paragraph that says how to reproduce the table and how to read it."""
    return [
        "# Sensitivity of DLFP's effect to the choices the paper leaves unstated (simulator)",
        "",
        f"Reproduce: `{command}`. These numbers are recomputed by that command on the deterministic simulator; "
        "no traces are cached for them (repository size budget).",
        f"Seeds {', '.join(map(str, seeds))}, paired. Change = 100 x (arm - baseline) / baseline per seed, mean and "
        "95 % Student-t CI over seeds (NEGATIVE = the arm lowers the metric, the sign convention of "
        "data/paper/published.csv). P99 ITL in ms, mean over seeds. SLO passes: mean over seeds; change = mean "
        "paired difference (requests). Stalls: share of inter-token gaps longer than "
        f"{STALL_FACTOR:g} x the trial's median gap (a diagnostic: the P99 gap is a stall only when it exceeds 1 %). "
        "`sign agrees`: the dlfp arm's mean P99 ITL change has the sign the paper "
        "reports (published.csv direction); blank where the paper gives none. `*` = the experiment's own setting. "
        "host_costs: the simulator's HostCosts scaled, or `measured` = schedule/update/frontend/ingest costs of "
        "vLLM's real engine loop measured by `dlfp calibrate` on this CPU (hardware/cpu-calibrated.yaml).",
        "",
    ]


def sweep_markdown(table: pd.DataFrame, *, command: str, seeds: Sequence[int], notes: Sequence[str] = (),
                   stall: pd.DataFrame | None = None, stall_arm: str = "dlfp") -> str:
    """The sweep table as Markdown (deterministic: no time stamps), with a header saying how to reproduce it.

    ``stall`` (``stall_sign_table``) adds the per-seed sign counts of ``stall_arm``; ``notes`` a bullet list.
    """
    lines = _md_preamble(command, seeds)
    lines += markdown_rows(_MD_HEADER, (_md_cells(r) for r in table.itertuples(index=False)), align=_MD_ALIGN)
    if stall is not None and len(stall):
        lines += ["", f"Per-seed sign of the {stall_arm} arm's P99 ITL change by the baseline's stalled-gap share "
                  f"(distinct runs: SLO variants and repeated defaults counted once; |change| <= "
                  f"{UNCHANGED_PCT:g} % = unchanged):", ""]
        lines += markdown_rows(("baseline stalls", "lower", "unchanged", "higher"),
                               ((r.baseline_stalls, r.lower, r.unchanged, r.higher)
                                for r in stall.itertuples(index=False)),
                               align=("left", "right", "right", "right"))
    if notes:
        lines += ["", "Notes:", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def write_outputs(table: pd.DataFrame, trials: pd.DataFrame, out_dir: str | Path, *, command: str,
                  seeds: Sequence[int], notes: Sequence[str] = ()) -> dict[str, Path]:
    """Write ``sensitivity.csv``, ``sensitivity.md`` and ``sensitivity_trials.csv`` (atomic, deterministic).

    Returns ``{"csv", "md", "trials"}`` -> path.
    """
    out = Path(out_dir)
    paths = {"csv": out / "sensitivity.csv", "md": out / "sensitivity.md", "trials": out / "sensitivity_trials.csv"}
    atomic_write(paths["csv"], table.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    atomic_write(paths["trials"], trials.to_csv(index=False, float_format="%.9g", lineterminator="\n"))
    stall = stall_sign_table(trials) if "dlfp" in set(trials["arm"]) else None
    atomic_write(paths["md"], sweep_markdown(table, command=command, seeds=seeds, notes=notes, stall=stall))
    return paths


__all__ = ["TABLE_COLUMNS", "UNCHANGED_PCT", "build_table", "flips", "paper_directions", "stall_sign_table",
           "sweep_markdown", "write_outputs"]
