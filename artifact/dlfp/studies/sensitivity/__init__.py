"""Sensitivity sweep over the choices the paper leaves unstated (issue 7), on the simulator.

For each experiment, every alternative value listed in its
``backend_options.sensitivity`` (keyed by a dotted config field, e.g.
``max_num_batched_tokens: [2048, 8192]``, ``workload.num_warmup: [0, 5, 20]``,
``slo: [{...}, ...]``, ``workload.rate: [...]``) plus one host-cost dimension
(field ``host_costs``: the experiment's effective ``HostCosts`` scaled x1 = the
default, x3 and x10, and ``measured``: the host costs that ``dlfp calibrate``
measured for vLLM's real Python engine loop on this CPU, from
``hardware/cpu-calibrated.yaml``) is run as a variant of the config. Each
variant runs the baseline arm and the candidate arms (``dlfp`` and, where the
config has it, ``dlfps``) paired on the same seeds (801-803 by default) with
``dlfp.backends.run_trial(..., backend="sim")`` in parallel processes.

No trace is written: the sweep keeps only per-trial summaries, and its outputs
(``sensitivity.csv``, ``sensitivity.md``, ``sensitivity_trials.csv``) are
reproducible by re-running ``dlfp sensitivity`` (the simulator is
deterministic per (config, arm, seed)), which keeps the repository under its
size budget.

Changes are reported as ``100 * (arm - baseline) / baseline`` per seed (NEGATIVE
= the arm lowers the metric, the sign convention of ``data/paper/published.csv``),
i.e. the negation of ``dlfp.analysis.stats.paired_change``, with its two-sided 95 %
Student-t interval over seeds.

Identical runs are shared: variants whose config equals another's (a listed
value equal to the default, or an SLO variant, which changes only the metric,
not the run) reuse its trials; an arm whose ``options.ttft_slo_s`` equals the
experiment's SLO TTFT limit (DLFP-S, whose guard is the SLO) follows the SLO
variant and is re-run.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from dlfp.config import ConfigError, ExperimentConfig, list_experiments, load_experiment
from dlfp.analysis.stats import paired_change

#: Host-cost scale factors of the host-cost dimension (x1 = the default costs).
HOST_SCALES: tuple[float, ...] = (1.0, 3.0, 10.0)
#: Hardware profile key (``hardware/*.yaml``) whose ``host`` block holds the host costs measured on this CPU.
MEASURED_PROFILE = "cpu"
#: Field name of the host-cost dimension in the output table.
HOST_FIELD = "host_costs"
#: Candidate arms compared with the baseline, where the config has them.
CANDIDATE_ARMS: tuple[str, ...] = ("dlfp", "dlfps")
#: Seeds of the sweep (the paper's paired seeds).
DEFAULT_SEEDS: tuple[int, ...] = (801, 802, 803)
#: Columns of the per-trial summary frame (one row per variant x arm x seed).
TRIAL_COLUMNS = ("experiment", "field", "value", "is_default", "arm", "seed", "measured", "completed",
                 "itl_p50_s", "itl_p99_s", "stall_frac", "ttft_p99_s", "e2el_p99_s", "slo_passes")
#: A "stalled" inter-token gap is longer than this multiple of the trial's median gap (a diagnostic, not a metric
#: of the paper: it shows whether the P99 gap falls among the stalls, i.e. whether stall_frac exceeds 1 %).
STALL_FACTOR = 10.0
#: Columns of the sweep table (one row per variant x candidate arm).
TABLE_COLUMNS = ("experiment", "field", "value", "is_default", "arm", "n_seeds",
                 "baseline_p50_itl_ms", "baseline_stall_pct", "arm_stall_pct", "baseline_p99_itl_ms", "arm_p99_itl_ms",
                 "p99_itl_change_pct", "p99_itl_ci_low_pct", "p99_itl_ci_high_pct", "p99_itl_ci_excludes_zero",
                 "p99_itl_seeds_lower",
                 "p99_ttft_change_pct", "p99_ttft_ci_low_pct", "p99_ttft_ci_high_pct",
                 "baseline_slo_passes", "arm_slo_passes", "slo_passes_change",
                 "paper_p99_itl_direction", "sign_agrees")


class SensitivityError(ValueError):
    """A sweep that cannot be planned or tabulated; the message names the experiment or field."""


# ----------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Variant:
    """One value of one unstated choice for one experiment.

    Attributes:
        experiment: the experiment name.
        field: the dotted config field (``max_num_batched_tokens``, ``slo``, ...) or ``host_costs``.
        value: the value as listed (JSON-able), or for ``host_costs`` the label ``x1``/``x3``/``x10``/``measured``.
        label: the value as shown in the table.
        is_default: True when the value equals the experiment's own setting (x1 for host costs).
        overrides: the ``ExperimentConfig.with_overrides`` mapping that produces the variant.
    """

    experiment: str
    field: str
    value: Any
    label: str
    is_default: bool
    overrides: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class TrialTask:
    """One simulator run shared by every (variant, arm, seed) cell with the same run config.

    ``slos`` lists the SLOs (as dicts) its summary is computed under, in first-use order.
    """

    key: str
    config: ExperimentConfig
    arm: str
    seed: int
    slos: tuple[str, ...]  # canonical JSON of each SLO


@dataclass
class SweepPlan:
    """Variants, arms and seeds of a sweep, and the distinct runs that cover them.

    Attributes:
        variants: every variant, in table order.
        arms: ``{experiment: [baseline_arm, candidate arms...]}``.
        seeds: the seeds.
        cells: ``{(variant_index, arm, seed): (task_key, slo_json)}``.
        tasks: ``{task_key: TrialTask}`` (distinct simulator runs).
        notes: human-readable notes (skipped dimensions and why).
    """

    variants: list[Variant]
    arms: dict[str, list[str]]
    seeds: tuple[int, ...]
    cells: dict[tuple[int, str, int], tuple[str, str]]
    tasks: dict[str, TrialTask]
    notes: list[str]

    @property
    def num_cells(self) -> int:
        """Number of (variant, arm, seed) cells in the table's inputs."""
        return len(self.cells)

    @property
    def num_trials(self) -> int:
        """Number of distinct simulator runs (cells share runs whose config is identical)."""
        return len(self.tasks)


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))


def _get_dotted(data: dict, key: str, where: str) -> Any:
    node: Any = data
    for p in key.split("."):
        if not isinstance(node, dict) or p not in node:
            raise SensitivityError(f"{where}: backend_options.sensitivity names field {key!r}, which the config lacks")
        node = node[p]
    return node


def _label(field_: str, value: Any) -> str:
    if field_ == "slo" and isinstance(value, dict):
        return (f"TTFT<={value['ttft_s']:g}s ITL<={1e3 * float(value['itl_s']):g}ms"
                f" (q{value['itl_quantile']:g})")
    if isinstance(value, float) and value.is_integer() and field_ != "workload.rate":
        return str(int(value))
    return str(value) if not isinstance(value, (dict, list)) else _canon(value)


def effective_host_costs(cfg: ExperimentConfig) -> dict[str, float]:
    """The ``HostCosts`` fields (seconds; ``cudagraph_max_tokens`` in tokens) the sim backend would use for ``cfg``.

    Raises:
        ConfigError: as ``dlfp.backends.sim.runner.build_engine_parts``.
    """
    from dlfp.backends.sim.runner import build_engine_parts

    return build_engine_parts(cfg)[3].as_dict()


def scaled_host_costs(host: dict[str, float], scale: float) -> dict[str, float]:
    """Every time field (name ending in ``_s``) of ``host`` multiplied by ``scale``; token counts unchanged.

    Raises:
        SensitivityError: ``scale`` not a positive finite number.
    """
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise SensitivityError(f"host-cost scale must be a positive number, got {scale!r}")
    return {k: (float(v) * scale if k.endswith("_s") else v) for k, v in host.items()}


def measured_host_costs(profile: str = MEASURED_PROFILE) -> dict[str, float] | None:
    """The host costs measured by ``dlfp calibrate`` (the ``host`` block of hardware profile ``profile``).

    Only the fields the calibration measures are returned (schedule, update,
    frontend, ingest): on the CPU, input preparation, launch and sampling are
    inside the measured device step and recorded as 0 (``dlfp.studies.calibration.HOST_ZERO``),
    so they are not a measurement of those costs and the GPU model's values are kept.
    Returns None when the profile does not exist or has no host block.
    """
    from dlfp.devices import roofline as cm
    from dlfp.studies.calibration import HOST_ZERO

    try:
        gpu = cm.load_gpu(profile)
    except cm.CostModelError:
        return None
    host = dict(gpu.host or {})
    out = {k: float(v) for k, v in host.items() if k not in HOST_ZERO}
    return out or None


def _slo_follower_arms(cfg: ExperimentConfig) -> list[str]:
    """Arms whose ``options.ttft_slo_s`` equals the config's SLO TTFT limit (they follow an SLO variant)."""
    out = []
    for name, pc in cfg.arms.items():
        v = (pc.options or {}).get("ttft_slo_s")
        if v is not None and float(v) == float(cfg.slo.ttft_s):
            out.append(name)
    return out


def _run_key(cfg: ExperimentConfig, arm: str, seed: int) -> str:
    """Hash of everything a sim run depends on: the config less SLO and bookkeeping, the arm's policy, the seed."""
    d = cfg.model_dump()
    for k in ("name", "description", "assumptions", "tags", "seeds", "slo", "baseline_arm"):
        d.pop(k, None)
    d["arms"] = {arm: d["arms"][arm]}
    bo = dict(d.get("backend_options") or {})
    for k in ("sensitivity", "frontier_caps"):
        bo.pop(k, None)
    d["backend_options"] = bo
    return hashlib.sha256(_canon([cfg.name, d, arm, int(seed)]).encode()).hexdigest()[:16]


def variants_for(cfg: ExperimentConfig, *, host_scales: Sequence[float] = HOST_SCALES,
                 measured_host: dict[str, float] | None = None, host: bool = True) -> tuple[list[Variant], list[str]]:
    """The variants of one experiment: its ``backend_options.sensitivity`` values, then the host-cost dimension.

    Args:
        cfg: the experiment config.
        host_scales: scale factors of the effective host costs (1 = default).
        measured_host: measured ``HostCosts`` fields (seconds) to substitute for the ``measured`` variant;
            None skips that variant (noted).
        host: False leaves out the host-cost dimension.

    Returns:
        (variants in table order, notes).

    Raises:
        SensitivityError: ``backend_options.sensitivity`` is not a mapping of field -> non-empty list, or names a
            field the config lacks.
        ConfigError: a value the config rejects (named by the override).
    """
    sens = cfg.backend_options.get("sensitivity") or {}
    where = f"experiment {cfg.name!r}"
    if not isinstance(sens, dict):
        raise SensitivityError(f"{where}: backend_options.sensitivity must map field -> list of values")
    data = cfg.model_dump()
    out: list[Variant] = []
    notes: list[str] = []
    followers = _slo_follower_arms(cfg)
    for fld, values in sens.items():
        if not isinstance(values, list) or not values:
            raise SensitivityError(f"{where}: backend_options.sensitivity.{fld} must be a non-empty list")
        current = _get_dotted(data, fld, where)
        for v in values:
            ov = {fld: v}
            if fld == "slo" and isinstance(v, dict):
                for a in followers:
                    ov[f"arms.{a}.options"] = {**(cfg.arms[a].options or {}), "ttft_slo_s": float(v["ttft_s"])}
            # compare after validation, so 8192.0 == 8192 and an SLO with its defaults filled in compares equal
            validated = _get_dotted(cfg.with_overrides({fld: v}).model_dump(), fld, where)
            is_def = _canon(validated) == _canon(current)
            cfg.with_overrides(ov)  # validate now: a bad value is named before anything runs
            out.append(Variant(cfg.name, fld, v, _label(fld, validated), bool(is_def), {} if is_def else ov))
    if host:
        base = effective_host_costs(cfg)
        sim_opts = dict(cfg.backend_options.get("sim") or {})
        for s in host_scales:
            s = float(s)
            lab = f"x{s:g}"
            if s == 1.0:
                out.append(Variant(cfg.name, HOST_FIELD, lab, lab, True, {}))
            else:
                ov = {"backend_options.sim": {**sim_opts, "host": scaled_host_costs(base, s)}}
                out.append(Variant(cfg.name, HOST_FIELD, lab, lab, False, ov))
        if measured_host:
            ov = {"backend_options.sim": {**sim_opts, "host": {**base, **measured_host}}}
            out.append(Variant(cfg.name, HOST_FIELD, "measured", f"measured ({MEASURED_PROFILE} profile)", False, ov))
        else:
            notes.append(f"{cfg.name}: no measured host costs (hardware profile {MEASURED_PROFILE!r} has no host "
                         f"block): host_costs=measured skipped")
    return out, notes


def build_plan(configs: Sequence[ExperimentConfig], *, seeds: Sequence[int] = DEFAULT_SEEDS,
               candidate_arms: Sequence[str] = CANDIDATE_ARMS, host_scales: Sequence[float] = HOST_SCALES,
               measured_host: dict[str, float] | None = None, host: bool = True,
               overrides: dict[str, Any] | None = None) -> SweepPlan:
    """Plan the sweep: variants of every config, the arms and seeds, and the distinct runs.

    ``overrides`` (e.g. ``{"workload.num_requests": 5}``) are applied to every
    config before its variants are built. Arms: the config's ``baseline_arm``
    then each of ``candidate_arms`` the config has (at least one is needed).

    Raises:
        SensitivityError: no seed, no candidate arm in a config, or a bad sensitivity block.
        ConfigError: a bad override or value.
    """
    seeds = tuple(int(s) for s in seeds)
    if not seeds:
        raise SensitivityError("seeds: need at least one seed")
    variants: list[Variant] = []
    arms: dict[str, list[str]] = {}
    cells: dict[tuple[int, str, int], tuple[str, str]] = {}
    tasks: dict[str, TrialTask] = {}
    notes: list[str] = []
    for cfg in configs:
        cfg = cfg.with_overrides(overrides or {})
        cands = [a for a in candidate_arms if a in cfg.arms and a != cfg.baseline_arm]
        if not cands:
            raise SensitivityError(f"experiment {cfg.name!r}: none of the candidate arms {list(candidate_arms)} "
                                   f"is in its arms {list(cfg.arms)}")
        arms[cfg.name] = [cfg.baseline_arm, *cands]
        vs, ns = variants_for(cfg, host_scales=host_scales, measured_host=measured_host, host=host)
        notes += ns
        for v in vs:
            i = len(variants)
            variants.append(v)
            vcfg = cfg.with_overrides(v.overrides)
            slo = _canon(vcfg.slo.model_dump())
            for arm in arms[cfg.name]:
                for seed in seeds:
                    key = _run_key(vcfg, arm, seed)
                    t = tasks.get(key)
                    if t is None:
                        tasks[key] = TrialTask(key, vcfg, arm, seed, (slo,))
                    elif slo not in t.slos:
                        tasks[key] = TrialTask(key, t.config, arm, seed, (*t.slos, slo))
                    cells[(i, arm, seed)] = (key, slo)
    return SweepPlan(variants, arms, seeds, cells, tasks, notes)


# ----------------------------------------------------------------------------------------------- run


def trial_summaries(cfg: ExperimentConfig, arm: str, seed: int, slos: Sequence[str]) -> list[dict]:
    """Run one sim trial (nothing written) and summarise it under each SLO (canonical JSON); one dict per SLO.

    Keys: ``measured``, ``completed``, ``itl_p50_s``, ``itl_p99_s``, ``ttft_p99_s``, ``e2el_p99_s`` (seconds),
    ``stall_frac`` (fraction of measured inter-token gaps longer than ``STALL_FACTOR`` x their median),
    ``slo_passes``.
    """
    from dlfp.analysis.metrics import itl_samples, summarize
    from dlfp.backends import run_trial

    trial = run_trial(cfg, arm, seed, backend="sim")
    gaps = itl_samples(trial)
    gaps = gaps[np.isfinite(gaps)]
    stall = float((gaps > STALL_FACTOR * np.median(gaps)).mean()) if gaps.size else float("nan")
    out = []
    for slo in slos:
        s = summarize(trial, json.loads(slo))
        out.append({"measured": int(s["measured"]), "completed": int(s["completed"]),
                    "itl_p50_s": float(s["itl_p50_s"]), "itl_p99_s": float(s["itl_p99_s"]), "stall_frac": stall, "ttft_p99_s": float(s["ttft_p99_s"]),
                    "e2el_p99_s": float(s["e2el_p99_s"]), "slo_passes": int(s["slo_passes"])})
    return out


def _jobs(jobs: int | None) -> int:
    if jobs is not None:
        if int(jobs) < 1:
            raise SensitivityError(f"jobs must be >= 1, got {jobs!r}")
        return int(jobs)
    env = os.environ.get("DLFP_JOBS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise SensitivityError(f"DLFP_JOBS={env!r} is not a positive integer")
        return int(env)
    return os.cpu_count() or 1


def run_plan(plan: SweepPlan, *, jobs: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Run every distinct trial of ``plan`` (``jobs`` spawn processes; 1 = in this process) and return the
    per-cell summaries (``TRIAL_COLUMNS``, one row per variant x arm x seed, in plan order).

    ``jobs`` defaults to ``$DLFP_JOBS`` or the CPU count. ``progress(done, total)`` is called after each run.
    """
    jobs = _jobs(jobs)
    todo = list(plan.tasks.values())
    results: dict[str, dict[str, dict]] = {}
    done = 0
    if jobs == 1 or len(todo) <= 1:
        for t in todo:
            results[t.key] = dict(zip(t.slos, trial_summaries(t.config, t.arm, t.seed, t.slos)))
            done += 1
            if progress:
                progress(done, len(todo))
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(trial_summaries, t.config, t.arm, t.seed, t.slos): t for t in todo}
            for fut in as_completed(futs):
                t = futs[fut]
                results[t.key] = dict(zip(t.slos, fut.result()))
                done += 1
                if progress:
                    progress(done, len(todo))
    rows = []
    for (i, arm, seed), (key, slo) in plan.cells.items():
        v = plan.variants[i]
        rows.append({"experiment": v.experiment, "field": v.field, "value": v.label, "is_default": v.is_default,
                     "arm": arm, "seed": seed, **results[key][slo]})
    return pd.DataFrame(rows, columns=list(TRIAL_COLUMNS))


# ----------------------------------------------------------------------------------------------- table


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
    """Mean and 95 % CI of ``100 * (cand - base) / base`` over seeds (negated ``stats.paired_change``)."""
    pc = paired_change(base, cand).as_percent()
    return -pc.mean + 0.0, -pc.ci_high + 0.0, -pc.ci_low + 0.0  # + 0.0: no "-0.0" for an unchanged metric


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
        keys = te[["field", "value"]].drop_duplicates()
        for fld, val in keys.itertuples(index=False):
            tv = te[(te["field"] == fld) & (te["value"] == val)]
            b = tv[tv["arm"] == base_arm].set_index("seed").sort_index()
            for arm in cands:
                c = tv[tv["arm"] == arm].set_index("seed").sort_index()
                if not set(c.index) <= set(b.index):
                    raise SensitivityError(f"{exp} {fld}={val}: arm {arm!r} has seeds the baseline lacks")
                bb = b.loc[c.index]
                itl = _pct_change(bb["itl_p99_s"].to_numpy(float), c["itl_p99_s"].to_numpy(float))
                ttft = _pct_change(bb["ttft_p99_s"].to_numpy(float), c["ttft_p99_s"].to_numpy(float))
                d = directions.get(str(exp), "")
                agrees = ""
                if arm == "dlfp" and d:
                    agrees = "yes" if (itl[0] < 0 if d == "decrease" else itl[0] > 0) else "no"
                excl = bool(np.isfinite(itl[1]) and (itl[1] > 0 or itl[2] < 0))
                rows.append({
                    "experiment": exp, "field": fld, "value": val, "is_default": bool(tv["is_default"].iloc[0]),
                    "arm": arm, "n_seeds": len(c),
                    "baseline_p50_itl_ms": 1e3 * float(bb["itl_p50_s"].mean()),
                    "baseline_stall_pct": 100 * float(bb["stall_frac"].mean()),
                    "arm_stall_pct": 100 * float(c["stall_frac"].mean()),
                    "baseline_p99_itl_ms": 1e3 * float(bb["itl_p99_s"].mean()),
                    "arm_p99_itl_ms": 1e3 * float(c["itl_p99_s"].mean()),
                    "p99_itl_change_pct": itl[0], "p99_itl_ci_low_pct": itl[1], "p99_itl_ci_high_pct": itl[2],
                    "p99_itl_ci_excludes_zero": excl,
                    "p99_itl_seeds_lower": int((c["itl_p99_s"].to_numpy(float) < bb["itl_p99_s"].to_numpy(float)).sum()),
                    "p99_ttft_change_pct": ttft[0], "p99_ttft_ci_low_pct": ttft[1], "p99_ttft_ci_high_pct": ttft[2],
                    "baseline_slo_passes": float(bb["slo_passes"].mean()),
                    "arm_slo_passes": float(c["slo_passes"].mean()),
                    "slo_passes_change": float((c["slo_passes"].to_numpy(float) - bb["slo_passes"].to_numpy(float)).mean()),
                    "paper_p99_itl_direction": d, "sign_agrees": agrees,
                })
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


#: A per-seed change within +- this many percent counts as "unchanged" in ``stall_sign_table``.
UNCHANGED_PCT = 0.5


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


def to_markdown(table: pd.DataFrame, *, command: str, seeds: Sequence[int], notes: Sequence[str] = (),
                stall: pd.DataFrame | None = None, stall_arm: str = "dlfp") -> str:
    """The sweep table as Markdown (deterministic: no time stamps), with a header saying how to reproduce it."""
    lines = [
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
        "| experiment | field | value | arm | base P50 ITL ms | stalls % base / arm | base P99 ITL ms | arm P99 ITL ms "
        "| P99 ITL change % [95 % CI] | seeds lower | P99 TTFT change % | SLO passes base -> arm (change) | paper "
        "| sign agrees |",
        "|---|---|---|---|---:|---|---:|---:|---|---|---:|---|---|---|",
    ]
    for r in table.itertuples(index=False):
        ci = ("" if not math.isfinite(r.p99_itl_ci_low_pct)
              else f" [{r.p99_itl_ci_low_pct:+.1f}, {r.p99_itl_ci_high_pct:+.1f}]")
        lines.append(
            f"| {r.experiment} | {r.field} | {r.value}{' *' if r.is_default else ''} | {r.arm} "
            f"| {r.baseline_p50_itl_ms:.2f} | {r.baseline_stall_pct:.2f} / {r.arm_stall_pct:.2f} "
            f"| {r.baseline_p99_itl_ms:.1f} | {r.arm_p99_itl_ms:.1f} | {r.p99_itl_change_pct:+.1f}{ci} "
            f"| {r.p99_itl_seeds_lower}/{r.n_seeds} "
            f"| {r.p99_ttft_change_pct:+.1f} | {r.baseline_slo_passes:.2f} -> {r.arm_slo_passes:.2f} "
            f"({r.slo_passes_change:+.2f}) | {r.paper_p99_itl_direction} | {r.sign_agrees} |")
    if stall is not None and len(stall):
        lines += ["", f"Per-seed sign of the {stall_arm} arm's P99 ITL change by the baseline's stalled-gap share "
                  f"(distinct runs: SLO variants and repeated defaults counted once; |change| <= "
                  f"{UNCHANGED_PCT:g} % = unchanged):", "",
                  "| baseline stalls | lower | unchanged | higher |", "|---|---:|---:|---:|"]
        for r in stall.itertuples(index=False):
            lines.append(f"| {r.baseline_stalls} | {r.lower} | {r.unchanged} | {r.higher} |")
    if notes:
        lines += ["", "Notes:", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_outputs(table: pd.DataFrame, trials: pd.DataFrame, out_dir: str | Path, *, command: str,
                  seeds: Sequence[int], notes: Sequence[str] = ()) -> dict[str, Path]:
    """Write ``sensitivity.csv``, ``sensitivity.md`` and ``sensitivity_trials.csv`` (atomic, deterministic)."""
    out = Path(out_dir)
    paths = {"csv": out / "sensitivity.csv", "md": out / "sensitivity.md", "trials": out / "sensitivity_trials.csv"}
    _atomic_write(paths["csv"], table.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
    _atomic_write(paths["trials"], trials.to_csv(index=False, float_format="%.9g", lineterminator="\n"))
    stall = stall_sign_table(trials) if "dlfp" in set(trials["arm"]) else None
    _atomic_write(paths["md"], to_markdown(table, command=command, seeds=seeds, notes=notes, stall=stall))
    return paths


def default_experiments() -> list[str]:
    """Shipped experiments that declare ``backend_options.sensitivity`` (sorted)."""
    out = []
    for n in list_experiments():
        try:
            if load_experiment(n).backend_options.get("sensitivity"):
                out.append(n)
        except ConfigError:
            continue
    return out


def run_sweep(experiments: Sequence[str] | None = None, *, out_dir: str | Path | None = None,
              seeds: Sequence[int] = DEFAULT_SEEDS, candidate_arms: Sequence[str] = CANDIDATE_ARMS,
              host_scales: Sequence[float] = HOST_SCALES, measured: bool = True,
              overrides: dict[str, Any] | None = None, jobs: int | None = None,
              published: str | Path | None = None, command: str = "dlfp sensitivity",
              progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Plan, run and tabulate the sweep; write the outputs when ``out_dir`` is given.

    Returns ``{"plan", "trials", "table", "paths", "seconds"}`` (``seconds``: wall time of the runs).

    Raises:
        ConfigError: an unknown experiment or bad override; SensitivityError: a bad sensitivity block.
    """
    from dlfp.pipeline import default_published_csv

    names = list(experiments) if experiments else default_experiments()
    configs = [load_experiment(n) for n in names]
    mh = measured_host_costs() if measured else None
    plan = build_plan(configs, seeds=seeds, candidate_arms=candidate_arms, host_scales=host_scales,
                      measured_host=mh, overrides=overrides)
    t0 = time.perf_counter()
    trials = run_plan(plan, jobs=jobs, progress=progress)
    seconds = time.perf_counter() - t0
    pub = Path(published) if published else default_published_csv()
    table = build_table(trials, paper_directions(pub if pub.exists() else None))
    paths = {}
    if out_dir is not None:
        notes = list(plan.notes)
        if mh:
            notes.append("measured host costs (s): " + ", ".join(f"{k}={v:.3g}" for k, v in sorted(mh.items())))
        paths = write_outputs(table, trials, out_dir, command=command, seeds=plan.seeds, notes=notes)
    return {"plan": plan, "trials": trials, "table": table, "paths": paths, "seconds": seconds}


__all__ = ["CANDIDATE_ARMS", "DEFAULT_SEEDS", "HOST_FIELD", "HOST_SCALES", "STALL_FACTOR", "SensitivityError", "SweepPlan",
           "TABLE_COLUMNS", "TRIAL_COLUMNS", "TrialTask", "Variant", "build_plan", "build_table",
           "default_experiments", "effective_host_costs", "flips", "measured_host_costs", "paper_directions",
           "run_plan", "run_sweep", "scaled_host_costs", "stall_sign_table", "to_markdown", "trial_summaries", "variants_for",
           "write_outputs"]
