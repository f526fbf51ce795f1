"""Planning the sensitivity sweep: the variants of each experiment and the distinct simulator runs they need.

A variant is one alternative value of one unstated choice (a dotted config
field listed in ``backend_options.sensitivity``, or the host-cost dimension
``host_costs``). Cells (variant, arm, seed) whose run config is identical
share one run (``TrialTask``); an SLO variant changes only how a run is
summarised, except for arms whose TTFT guard is the SLO (DLFP-S), which
follow it and are re-run.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from dlfp.config import ConfigError, ExperimentConfig, list_experiments, load_experiment

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


class SensitivityError(ValueError):
    """A sweep that cannot be planned or tabulated; the message names the experiment or field."""


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

    ``slos`` lists the SLOs (canonical JSON of each) its summary is computed under, in first-use order.
    """

    key: str
    config: ExperimentConfig
    arm: str
    seed: int
    slos: tuple[str, ...]


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


def canon(obj: Any) -> str:
    """Canonical JSON of ``obj`` (sorted keys, no spaces): equal configs give equal text."""
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
    return str(value) if not isinstance(value, (dict, list)) else canon(value)


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


#: HostCosts fields the ``measured`` host-cost variant takes from the CPU profile (the engine loop's own code)
MEASURED_HOST_FIELDS = ("schedule_base_s", "schedule_per_req_s", "update_base_s", "update_per_req_s",
                        "engine_loop_s", "frontend_output_s", "ingest_s")


def measured_host_costs(profile: str = MEASURED_PROFILE) -> dict[str, float] | None:
    """The host costs measured by ``dlfp calibrate`` (the ``host`` block of hardware profile ``profile``).

    Only the engine-loop fields are returned (``MEASURED_HOST_FIELDS``: schedule, update, the engine loop,
    frontend, ingest): they are the same Python code on a GPU server. The model runner's fields (input
    preparation, bookkeeping) measured on the CPU include CPU tensor work a GPU does not do there, and launch
    and sampler launch do not exist on the CPU (``dlfp.studies.calibration.HOST_ZERO``), so the GPU model's
    values are kept for those. Returns None when the profile does not exist or has no host block.
    """
    from dlfp.devices import roofline as cm

    try:
        gpu = cm.load_gpu(profile)
    except cm.CostModelError:
        return None
    host = dict(gpu.host or {})
    out = {k: float(host[k]) for k in MEASURED_HOST_FIELDS if k in host}
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
    return hashlib.sha256(canon([cfg.name, d, arm, int(seed)]).encode()).hexdigest()[:16]


def _listed_variants(cfg: ExperimentConfig) -> list[Variant]:
    """The variants of ``cfg``'s ``backend_options.sensitivity`` values, in listed order (validated now)."""
    sens = cfg.backend_options.get("sensitivity") or {}
    where = f"experiment {cfg.name!r}"
    if not isinstance(sens, dict):
        raise SensitivityError(f"{where}: backend_options.sensitivity must map field -> list of values")
    data = cfg.model_dump()
    followers = _slo_follower_arms(cfg)
    out: list[Variant] = []
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
            is_def = canon(validated) == canon(current)
            cfg.with_overrides(ov)  # validate now: a bad value is named before anything runs
            out.append(Variant(cfg.name, fld, v, _label(fld, validated), bool(is_def), {} if is_def else ov))
    return out


def _host_variants(cfg: ExperimentConfig, host_scales: Sequence[float],
                   measured_host: dict[str, float] | None) -> tuple[list[Variant], list[str]]:
    """The host-cost dimension of ``cfg``: each scale of its effective host costs, then ``measured``."""
    base = effective_host_costs(cfg)
    sim_opts = dict(cfg.backend_options.get("sim") or {})
    out: list[Variant] = []
    for s in host_scales:
        s = float(s)
        lab = f"x{s:g}"
        if s == 1.0:
            out.append(Variant(cfg.name, HOST_FIELD, lab, lab, True, {}))
        else:
            ov = {"backend_options.sim": {**sim_opts, "host": scaled_host_costs(base, s)}}
            out.append(Variant(cfg.name, HOST_FIELD, lab, lab, False, ov))
    if not measured_host:
        return out, [f"{cfg.name}: no measured host costs (hardware profile {MEASURED_PROFILE!r} has no host "
                     f"block): host_costs=measured skipped"]
    ov = {"backend_options.sim": {**sim_opts, "host": {**base, **measured_host}}}
    out.append(Variant(cfg.name, HOST_FIELD, "measured", f"measured ({MEASURED_PROFILE} profile)", False, ov))
    return out, []


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
    out = _listed_variants(cfg)
    if not host:
        return out, []
    host_variants, notes = _host_variants(cfg, host_scales, measured_host)
    return out + host_variants, notes


def _add_cells(plan: SweepPlan, cfg: ExperimentConfig, variant: Variant) -> None:
    """Add ``variant``'s cells to ``plan``, sharing a run with every earlier cell of the same run config."""
    i = len(plan.variants)
    plan.variants.append(variant)
    vcfg = cfg.with_overrides(variant.overrides)
    slo = canon(vcfg.slo.model_dump())
    for arm in plan.arms[cfg.name]:
        for seed in plan.seeds:
            key = _run_key(vcfg, arm, seed)
            t = plan.tasks.get(key)
            if t is None:
                plan.tasks[key] = TrialTask(key, vcfg, arm, seed, (slo,))
            elif slo not in t.slos:
                plan.tasks[key] = TrialTask(key, t.config, arm, seed, (*t.slos, slo))
            plan.cells[(i, arm, seed)] = (key, slo)


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
    plan = SweepPlan(variants=[], arms={}, seeds=seeds, cells={}, tasks={}, notes=[])
    for cfg in configs:
        cfg = cfg.with_overrides(overrides or {})
        cands = [a for a in candidate_arms if a in cfg.arms and a != cfg.baseline_arm]
        if not cands:
            raise SensitivityError(f"experiment {cfg.name!r}: none of the candidate arms {list(candidate_arms)} "
                                   f"is in its arms {list(cfg.arms)}")
        plan.arms[cfg.name] = [cfg.baseline_arm, *cands]
        variants, notes = variants_for(cfg, host_scales=host_scales, measured_host=measured_host, host=host)
        plan.notes += notes
        for v in variants:
            _add_cells(plan, cfg, v)
    return plan


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


__all__ = ["CANDIDATE_ARMS", "DEFAULT_SEEDS", "HOST_FIELD", "HOST_SCALES", "MEASURED_PROFILE", "SensitivityError",
           "SweepPlan", "TrialTask", "Variant", "build_plan", "canon", "default_experiments", "effective_host_costs",
           "measured_host_costs", "scaled_host_costs", "variants_for"]
