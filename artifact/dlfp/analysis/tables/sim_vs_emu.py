"""The simulator against the emulated-device backend (vLLM's real engine loop), per experiment on both.

The emulated device runs vLLM's real engine loop, so it is the reference:
differences are ``(sim / emu - 1) * 100``. The emulator drives the engine
through ``AsyncLLM`` in-process, with no API server in front; the simulator's
side of an experiment is therefore its variant without the API server,
``<experiment>-no-api-server`` (``ENGINE_ONLY_SUFFIX``), where that was run. Changes follow
``dlfp.analysis.stats`` (percent, negative = lower than the baseline).
Latencies are milliseconds.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dlfp.analysis import stats
from dlfp.analysis.markdown import write_table, yes_no
from dlfp.analysis.tables.loading import TraceSet, mark_incomplete
from dlfp.analysis.tables.root_cause import root_cause
from dlfp.analysis.tables.summaries import change_pct

#: The simulator's fidelity target: its P99 ITL within 10 % of the emulated-device backend's.
SIM_EMU_ITL_TOL = 0.10
#: Name suffix of the simulator-only variant of an experiment without the API server (``backend_options.sim.frontend:
#: none``; ``experiments/<experiment>-no-api-server.yaml``): the simulator's side of the comparison, like for like.
ENGINE_ONLY_SUFFIX = "-no-api-server"
SIM_VS_EMU_COLUMNS = [
    "experiment", "sim_experiment", "sim_api_server", "arm", "seeds",
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


def _arm_seeds(s: pd.DataFrame, backend: str, experiment: str, arm: str) -> pd.DataFrame:
    """The ``trial_summaries`` rows of one arm, indexed by seed."""
    return s[(s["backend"] == backend) & (s["experiment"] == experiment) & (s["arm"] == arm)].set_index("seed")


def _mean_change_pct(base: pd.Series, cand: pd.Series, seeds: list) -> float:
    """Mean paired change in percent (``change_pct``) over ``seeds`` usable in both; NaN when none is."""
    ok = [sd for sd in seeds if sd in base.index and np.isfinite(base[sd]) and base[sd] != 0
          and np.isfinite(cand[sd])]
    if not ok:
        return float("nan")
    return change_pct(stats.paired_change(base.loc[ok].to_numpy(float), cand.loc[ok].to_numpy(float)).mean)


def sim_partner(ts: TraceSet, experiment: str, sim: str = "sim") -> str:
    """The simulator experiment to set beside the emulator's ``experiment``: its variant without the API server
    (``<experiment>-no-api-server``) when the simulator has traces of it, else ``experiment`` itself."""
    engine_only = experiment + ENGINE_ONLY_SUFFIX
    return engine_only if ts.select(sim, engine_only) else experiment


def api_server_of(ts: TraceSet, backend: str, experiment: str) -> str:
    """Whether a simulator group modelled the API server: "modelled" when its first trial recorded a non-zero
    API-server cost (``metadata.sim.frontend``, seconds), else "none" (all zero, as ``frontend: none`` records)."""
    trials = ts.select(backend, experiment)
    fe = (trials[0].trial.metadata.get("sim") or {}).get("frontend") if trials else None
    return "modelled" if isinstance(fe, dict) and any(float(v) > 0 for v in fe.values()) else "none"


def _sim_vs_emu_row(ts: TraceSet, s: pd.DataFrame, rc: pd.DataFrame, groups: tuple[tuple[str, str], tuple[str, str]],
                    arm: str, tol: float) -> dict[str, Any]:
    """One ``sim_vs_emu`` row: levels, relative differences, effects and correlations of one shared arm.

    ``groups``: ``((sim backend, sim experiment), (emu backend, emu experiment))``.
    """
    sim_g, emu_g = groups
    (sim, sim_exp), (emu, exp) = groups
    base = ts.baseline_arm(emu, exp)
    arm_rows = {g: _arm_seeds(s, *g, arm) for g in groups}
    seeds = sorted(set(arm_rows[sim_g].index) & set(arm_rows[emu_g].index))
    row: dict[str, Any] = dict(experiment=exp, sim_experiment=sim_exp, sim_api_server=api_server_of(ts, sim, sim_exp),
                               arm=arm, seeds=len(seeds))
    for col in ("p50_itl_ms", "p99_itl_ms", "p99_ttft_ms"):
        vs = float(arm_rows[sim_g].loc[seeds, col].mean()) if seeds else float("nan")
        ve = float(arm_rows[emu_g].loc[seeds, col].mean()) if seeds else float("nan")
        row.update({f"{col}_sim": vs, f"{col}_emu": ve, f"{col[:-len('_ms')]}_rel_diff_pct": _rel_pct(ve, vs)})
    d = row["p99_itl_rel_diff_pct"]
    row["p99_itl_within_10pct"] = None if not np.isfinite(d) else bool(abs(d) <= 100 * tol + 1e-9)
    for col in ("p99_itl_ms", "p99_ttft_ms"):
        name = col[: -len("_ms")]
        ch = {g: float("nan") if arm == base else
              _mean_change_pct(_arm_seeds(s, *g, base)[col], arm_rows[g][col], seeds) for g in groups}
        row[f"{name}_change_pct_sim"], row[f"{name}_change_pct_emu"] = ch[sim_g], ch[emu_g]
        row[f"{name}_effect_same_sign"] = None if arm == base else _same_sign(ch[sim_g], ch[emu_g])
    for (backend, e), suffix in zip(groups, ("sim", "emu")):
        r = rc[(rc["backend"] == backend) & (rc["experiment"] == e) & (rc["arm"] == arm)]
        row[f"r_own_{suffix}"] = float(r["r_own"].iloc[0]) if len(r) else float("nan")
        row[f"r_prev_{suffix}"] = float(r["r_prev"].iloc[0]) if len(r) else float("nan")
    return row


def sim_vs_emu(ts: TraceSet, sim: str = "sim", emu: str = "emu", tol: float = SIM_EMU_ITL_TOL) -> pd.DataFrame:
    """Simulator against the emulated-device backend (real vLLM loop), per experiment on both, per shared arm.

    The emulator's ``experiment`` is set beside the simulator's ``sim_partner``
    (its variant without the API server where traced; ``sim_experiment`` names
    it and ``sim_api_server`` says whether the simulator modelled one). Only
    seeds present in the arm on BOTH sides are used; every value is a
    mean over those seeds (``seeds`` counts them). ``*_rel_diff_pct`` is the
    simulator relative to the emulator, ``(sim / emu - 1) * 100`` (the emu
    runs vLLM's real engine loop, so it is the reference); the fidelity
    target ``p99_itl_within_10pct`` is ``|p99_itl_rel_diff_pct| <= 100 * tol``.
    For non-baseline arms, ``p99_{itl,ttft}_change_pct_<backend>`` is the
    paired change vs the baseline (percent, negative = lower) over the same
    seeds, and ``*_effect_same_sign`` whether both backends give the effect
    the same sign (``None`` on baseline rows). ``r_own`` / ``r_prev`` are
    ``root_cause``'s correlations of the host interval with the guarded
    iteration's own / the previous iteration's device time (NaN for an arm
    without guarded iterations). Columns ``SIM_VS_EMU_COLUMNS``.
    """
    s = ts.summary()
    rc = root_cause(ts)
    rows = []
    sims = {e for b, e in ts.groups() if b == sim}
    for exp in sorted(e for b, e in ts.groups() if b == emu):
        sim_exp = sim_partner(ts, exp, sim)
        if sim_exp not in sims:
            continue
        shared = [a for a in ts.arms(emu, exp) if a in set(ts.arms(sim, sim_exp))]
        rows += [_sim_vs_emu_row(ts, s, rc, ((sim, sim_exp), (emu, exp)), arm, tol) for arm in shared]
    return pd.DataFrame(rows, columns=SIM_VS_EMU_COLUMNS)


def sim_vs_emu_markdown_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A compact view of ``sim_vs_emu`` (strings): sim / emu pairs in one cell each."""
    def pair(a, b, fmt):
        return "" if not (np.isfinite(a) or np.isfinite(b)) else f"{fmt(a)} / {fmt(b)}"

    def ms(v):
        return "–" if not np.isfinite(v) else f"{v:.1f}"

    def pct(v):
        return "–" if not np.isfinite(v) else f"{v:+.1f} %"

    def r2(v):
        return "–" if not np.isfinite(v) else f"{v:.2f}"

    out = []
    for _, r in df.iterrows():
        out.append({
            "experiment": r["experiment"], "sim API server": r["sim_api_server"], "arm": r["arm"],
            "seeds": r["seeds"],
            "P50 ITL ms sim / emu": pair(r["p50_itl_ms_sim"], r["p50_itl_ms_emu"], ms),
            "P99 ITL ms sim / emu": pair(r["p99_itl_ms_sim"], r["p99_itl_ms_emu"], ms),
            "P99 ITL diff": pct(r["p99_itl_rel_diff_pct"]),
            "within 10 %": yes_no(r["p99_itl_within_10pct"], "met", "MISSED"),
            "P99 TTFT ms sim / emu": pair(r["p99_ttft_ms_sim"], r["p99_ttft_ms_emu"], ms),
            "P99 TTFT diff": pct(r["p99_ttft_rel_diff_pct"]),
            "ΔP99 ITL sim / emu": pair(r["p99_itl_change_pct_sim"], r["p99_itl_change_pct_emu"], pct),
            "ITL effect sign agrees": yes_no(r["p99_itl_effect_same_sign"], "yes", "NO"),
            "ΔP99 TTFT sim / emu": pair(r["p99_ttft_change_pct_sim"], r["p99_ttft_change_pct_emu"], pct),
            "TTFT effect sign agrees": yes_no(r["p99_ttft_effect_same_sign"], "yes", "NO"),
            "r own / prev, sim": pair(r["r_own_sim"], r["r_prev_sim"], r2),
            "r own / prev, emu": pair(r["r_own_emu"], r["r_prev_emu"], r2),
        })
    return pd.DataFrame(out)


def device_model_of(lt) -> str:
    """Which device model timed a modelled trial: ``metadata.sim.device_assumptions.device_model`` (simulator)
    or ``metadata.engine.emu_settings.device.assumptions.device_model`` (emulator, when the experiment sets it).

    An emulator trace records only the assumptions its experiment overrides, so without the field it ran the
    default of its code: the kernel-level model once its host costs carry ``engine_loop_s`` (a field added after
    the kernel-level model became the default), the roofline before.
    """
    md = lt.trial.metadata
    emu = (md.get("engine") or {}).get("emu_settings") or {}
    a = (md.get("sim") or {}).get("device_assumptions") or (emu.get("device") or {}).get("assumptions") or {}
    if "device_model" in a:
        return str(a["device_model"])
    return "kernel" if "engine_loop_s" in (emu.get("host") or {}) else "roofline"


def device_model_note(ts: TraceSet, experiments) -> str | None:
    """A note naming the experiments whose sim and emu traces were timed by different device models."""
    differ = []
    for exp in experiments:
        models = {b: {device_model_of(lt) for lt in ts.select(b, e)}
                  for b, e in (("sim", sim_partner(ts, exp)), ("emu", exp))}
        if models["sim"] != models["emu"]:
            differ.append(f"{exp} (sim: {', '.join(sorted(models['sim']))}; emu: {', '.join(sorted(models['emu']))})")
    if not differ:
        return None
    return ("DEVICE MODELS DIFFER for " + "; ".join(differ) + ": the emulator traces were recorded before the "
            "kernel-level device model became the default, so these differences include the device model, not "
            "only the engine loop. Rerun the emulator (`dlfp run <experiment> --backend emu`, real time) to compare "
            "like with like.")


def write_sim_vs_emu(ts: TraceSet, results_dir: str | Path) -> pd.DataFrame:
    """Compute ``sim_vs_emu`` and write ``sim_vs_emu.csv``/``.md`` (a note says so when no experiment is on both)."""
    df = sim_vs_emu(ts)
    notes = ["diff = simulator relative to the emulated-device backend, (sim / emu - 1); target |P99 ITL diff| "
             "<= 10 % (the simulator's fidelity target).",
             "ΔP99 = paired change of the arm vs the baseline (negative = lower), mean over the seeds both "
             "backends have.",
             "r own / prev: Pearson r of the host interval with the guarded iteration's own / the previous "
             "iteration's device time.",
             "The emulator drives vLLM's engine through AsyncLLM in-process, with no API server in front. The "
             "simulator's GPU experiments put the API server of vllm serve in front (backend_options.sim.frontend, "
             "dlfp.devices.frontend), so each is compared here through its variant <experiment>-no-api-server "
             "(frontend: none), like for like; sim API server says which the row used."]
    if df.empty:
        notes.insert(0, "NO DATA: no experiment has traces on both the sim and the emu backend.")
    else:
        note = device_model_note(ts, sorted(set(df["experiment"])))
        if note:
            notes.insert(0, note)
    write_table(mark_incomplete(df, ts), results_dir, "sim_vs_emu",
                markdown=mark_incomplete(sim_vs_emu_markdown_frame(df), ts),
                title="Simulator vs emulated device (real vLLM engine loop)", notes=notes)
    return df


__all__ = ["ENGINE_ONLY_SUFFIX", "SIM_EMU_ITL_TOL", "SIM_VS_EMU_COLUMNS", "api_server_of", "sim_partner", "sim_vs_emu",
           "sim_vs_emu_markdown_frame", "write_sim_vs_emu"]
