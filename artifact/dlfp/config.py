"""Experiment configuration: one validated YAML file per experiment.

Configs live in ``artifact/dlfp/experiments/<name>.yaml`` (or ``$DLFP_EXPERIMENTS_DIR/<name>.yaml``). Every
field is checked by pydantic before anything runs; an unknown field, a wrong type or a
bad value is rejected with a one-line error that names the field (see
``ConfigError``). Times are seconds; rates are requests per second.

Shared settings come from the paper (arXiv v1, 2026-09-29): 128 output tokens
per request with ``ignore_eos``, paired seeds 801/802/803, DLFP with 80 ms
target, 3,072 initial cap, clamp [1,024, 6,144], 128-token quantum. Values the
paper leaves unstated are listed under ``assumptions`` with their reason.
"""
from __future__ import annotations

import copy
import inspect
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from dlfp.paths import EXPERIMENTS_DIR, EXPERIMENTS_ENV, experiment_file  # noqa: F401 (re-exported)
from dlfp.policies.base import Policy, PolicyOptions
from dlfp.policies.dlfp import (PAPER_GAIN, PAPER_INITIAL_CAP, PAPER_MAX_CAP, PAPER_MIN_CAP, PAPER_QUANTUM,
                                PAPER_TARGET_S)
from dlfp.policies.registry import POLICIES, policies_taking, policy_entry
from dlfp.workload_config import (OMITTED_AT_DEFAULT, Float, Int, RequestRow, Strict as _Strict,  # noqa: F401
                                  TraceReplay, Workload)  # (re-exported: the workload section lives there)


class ConfigError(ValueError):
    """A config that cannot run; the message names the file and the field."""


#: Experiment and arm names become directory names under ``--out``: no path separators, no ``..``. A run with
#: ``--set`` overrides is its own experiment ``<name>+<8 hex>`` (``dlfp.pipeline.plan.derived_experiment``).
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\+[0-9a-f]{8})?")


def check_plain_name(v: Any) -> str:
    """``v`` if it is a plain name usable as one directory (``[A-Za-z0-9][A-Za-z0-9._-]*``, no ``..``).

    Raises:
        ValueError: anything else (``../x``, ``a/b``, ``""``), naming the value.
    """
    if not isinstance(v, str) or not _PLAIN_NAME.fullmatch(v) or ".." in v:
        raise ValueError(f"{v!r} must be a plain name ([A-Za-z0-9._-], no '/' or '..')")
    return v


#: Fields a dump leaves out while they hold their default (so older configs dump as before); overrides may set them.
_OMITTED_AT_DEFAULT = frozenset(f"workload.{name}" for name in OMITTED_AT_DEFAULT)


class Assumption(_Strict):
    """A value the paper does not state, chosen openly."""

    field: str
    value: Any
    reason: str


class SLO(_Strict):
    """Per-request service-level objective (seconds): TTFT limit and P99-of-request ITL limit.

    A request passes when its TTFT <= ``ttft_s`` and every one of its
    inter-token gaps at quantile ``itl_quantile`` is <= ``itl_s``
    (``itl_quantile`` = 1.0 means the worst gap).
    """

    ttft_s: Float = Field(gt=0)
    itl_s: Float = Field(gt=0)
    itl_quantile: Float = Field(default=1.0, gt=0, le=1.0)


class PolicyConfig(_Strict):
    """One arm's prefill policy.

    ``policy`` is a name in ``dlfp.policies.registry.POLICIES``; the fields the
    policy's class lists in ``config_fields`` are passed to it (``cap`` only to
    ``fixed``; ``target_s`` .. ``gain`` default to the paper's constants), and
    ``options`` is checked by the policy's options model (none for nocap, fixed
    and dlfp). ``options`` is kept as written, so the resolved config records
    only what the arm set (plus values filled in from the experiment's SLO).
    """

    policy: str
    signal: Literal["host_cadence", "device_completion"] = "host_cadence"
    cap: Int | None = Field(default=None, gt=0, description="for policy=fixed")
    target_s: Float = Field(default=PAPER_TARGET_S, gt=0)
    initial_cap: Int = PAPER_INITIAL_CAP
    min_cap: Int = PAPER_MIN_CAP
    max_cap: Int = PAPER_MAX_CAP
    quantum: Int = PAPER_QUANTUM
    gain: Float = Field(default=PAPER_GAIN, gt=0)
    options: dict[str, Any] = Field(default_factory=dict, description="policy options, checked by its options model")

    @model_validator(mode="before")
    @classmethod
    def _policy_default_signal(cls, data: Any) -> Any:
        """An arm that names no ``signal`` gets its policy's own default (``device_completion`` for DLFP-G)."""
        if isinstance(data, dict) and "signal" not in data and isinstance(data.get("policy"), str) \
                and data["policy"] in POLICIES:
            default = inspect.signature(POLICIES[data["policy"]].cls.__init__).parameters.get("signal")
            if default is not None and default.default is not inspect.Parameter.empty \
                    and default.default != "host_cadence":
                data = {**data, "signal": default.default}
        return data

    @field_validator("policy")
    @classmethod
    def _registered(cls, v: str) -> str:
        policy_entry(v)
        return v

    @field_validator("options")
    @classmethod
    def _valid_options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "policy" in info.data:  # else the unknown policy is the error reported
            policy_entry(info.data["policy"]).options.model_validate(v)
        return v

    @model_validator(mode="after")
    def _check(self) -> "PolicyConfig":
        takes_cap = "cap" in policy_entry(self.policy).cls.config_fields
        if takes_cap and self.cap is None:
            raise ValueError(f"cap is required when policy={self.policy}")
        if not takes_cap and self.cap is not None:
            users = "/".join(policies_taking("cap"))
            raise ValueError(f"cap is only used when policy={users} (policy={self.policy}); remove it")
        unused = [f for f in _CONTROLLER_FIELDS if getattr(self, f) != type(self).model_fields[f].default
                  and f not in policy_entry(self.policy).cls.config_fields]  # (a dump repeats the defaults)
        if unused and policy_entry(self.policy).options is not PolicyOptions:  # a policy with options of its own
            raise ValueError(f"{unused[0]} is not used when policy={self.policy} (its settings are under options); "
                             f"remove it")
        build_policy(self)  # constructing the policy runs its own checks (clamp, quantum)
        return self


#: PolicyConfig fields of the paper's controller, passed only to the policies whose ``config_fields`` name them.
_CONTROLLER_FIELDS = ("target_s", "initial_cap", "min_cap", "max_cap", "quantum", "gain")


def _fill_slo_options(arm: Any, slo: "SLO") -> Any:
    """``arm`` (raw mapping or PolicyConfig) with the SLO values its policy takes added to ``options``.

    Values the arm's options already set are kept; anything malformed is
    returned unchanged for field validation to report.
    """
    if isinstance(arm, PolicyConfig):
        arm = arm.model_dump()
    if not isinstance(arm, dict) or not isinstance(arm.get("policy"), str) or arm["policy"] not in POLICIES:
        return arm
    options = arm.get("options", {})
    if not isinstance(options, dict):
        return arm
    wanted = POLICIES[arm["policy"]].slo_options
    filled = {opt: getattr(slo, fld) for opt, fld in wanted.items() if opt not in options}
    if not filled:
        return arm
    return {**arm, "options": {**filled, **options}}  # SLO values first, as the configs used to write them


class ExperimentConfig(_Strict):
    """One experiment: engine, hardware, workload, arms, seeds, SLO."""

    name: str
    description: str = ""
    model: str = Field(description="key in dlfp/models/*.yaml, e.g. qwen3-0.6b")
    gpu: str = Field(description="key in dlfp/hardware/*.yaml, e.g. a100-sxm4-80gb")
    tp: Int = Field(default=1, ge=1)
    scheduling: Literal["sync", "async"] = "async"
    max_num_batched_tokens: Int = Field(ge=16, description="vLLM's minimum is one 16-token block")
    max_num_seqs: Int = Field(default=256, gt=0)
    block_size: Int = Field(default=16, gt=0, multiple_of=16,
                            description="vLLM's CUDA and CPU attention backends need a multiple of 16")
    gpu_memory_utilization: Float = Field(default=0.9, gt=0, le=1)
    max_model_len: Int = Field(default=40960, gt=0)
    workload: Workload
    slo: SLO
    arms: dict[str, PolicyConfig]
    seeds: list[Annotated[Int, Field(ge=0)]] = Field(default_factory=lambda: [801, 802, 803], min_length=1)
    baseline_arm: str = "baseline"
    assumptions: list[Assumption] = Field(default_factory=list)
    backend_options: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        return check_plain_name(v)

    @field_validator("arms")
    @classmethod
    def _plain_arm_names(cls, v: dict[str, PolicyConfig]) -> dict[str, PolicyConfig]:
        for k in v:
            check_plain_name(k)
        return v

    @model_validator(mode="before")
    @classmethod
    def _slo_to_policies(cls, data: Any) -> Any:
        """Pass the experiment's SLO to the arms whose policy takes it (registry ``slo_options``).

        E.g. every ``dlfps`` arm gets ``options.ttft_slo_s = slo.ttft_s`` unless
        it sets ``ttft_slo_s`` itself. Runs before field validation, so the
        filled value is validated and recorded like a written one; a missing or
        invalid ``slo`` fills nothing (its own field error is reported).
        """
        if not isinstance(data, dict) or not isinstance(data.get("arms"), dict):
            return data
        try:
            slo = SLO.model_validate(data.get("slo"))
        except ValidationError:
            return data
        return {**data, "arms": {name: _fill_slo_options(arm, slo) for name, arm in data["arms"].items()}}

    @model_validator(mode="after")
    def _check(self) -> "ExperimentConfig":
        if self.baseline_arm not in self.arms:
            raise ValueError(f"baseline_arm {self.baseline_arm!r} is not one of the arms {sorted(self.arms)}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct, got {self.seeds}")
        return self

    def require_arm(self, arm: str) -> PolicyConfig:
        """The config of arm ``arm``.

        Raises:
            ConfigError: the experiment has no such arm (lists its arms).
        """
        if arm not in self.arms:
            raise ConfigError(f"experiment {self.name!r} has no arm {arm!r}; arms: {sorted(self.arms)}")
        return self.arms[arm]

    def with_overrides(self, overrides: dict[str, Any] | None) -> "ExperimentConfig":
        """A copy with dotted-key overrides applied, e.g. ``{"workload.num_requests": 10}``.

        Raises:
            ConfigError: an override names a field that does not exist or gives a bad value.
        """
        if not overrides:
            return self
        data = self.model_dump()
        if any(k == "slo" or k.startswith("slo.") for k in overrides):
            _unfill_slo_options(data, self.slo)  # refilled from the overridden SLO by validation
        for key, value in overrides.items():
            node = data
            parts = key.split(".")
            for i, p in enumerate(parts[:-1]):
                if isinstance(node, dict) and p not in node and i > 0 and parts[0] == "backend_options":
                    node[p] = {}  # free-form options: a missing section is created (backend_options.sim.frontend)
                if not isinstance(node, dict) or p not in node:
                    raise ConfigError(f"override {key!r}: no field {p!r} in experiment {self.name!r}")
                node = node[p]
            if not isinstance(node, dict) or (parts[-1] not in node and parts[0] not in ("arms", "backend_options")
                                              and key not in _OMITTED_AT_DEFAULT):
                raise ConfigError(f"override {key!r}: no field {parts[-1]!r} in experiment {self.name!r}")
            node[parts[-1]] = copy.deepcopy(value)
        return _validate(data, f"experiment {self.name!r} with overrides {overrides}")


def _unfill_slo_options(data: dict, slo: "SLO") -> None:
    """Drop from each arm's options the values its policy took from ``slo`` (``PolicyEntry.slo_options``).

    Validation fills them in again from the experiment's SLO, so an override of the SLO reaches the policies
    that follow it. An arm that wrote the same value as the SLO itself follows the new SLO too.
    """
    for arm in data.get("arms", {}).values():
        entry = POLICIES.get(arm.get("policy")) if isinstance(arm, dict) else None
        if entry is None or not isinstance(arm.get("options"), dict):
            continue
        for opt, fld in entry.slo_options.items():
            if opt in arm["options"] and arm["options"][opt] == getattr(slo, fld):
                del arm["options"][opt]


def _validate(data: dict, where: str) -> ExperimentConfig:
    try:
        cfg = ExperimentConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{where}: {validation_message(e)}") from None
    check_runnable(cfg, where)
    return cfg


def _longest_request(cfg: ExperimentConfig) -> tuple[int, str]:
    """The longest request (prompt + output tokens) the workload can send, and how it was found."""
    wl = cfg.workload
    own_outputs = wl.kind == "trace" and wl.trace is not None and wl.trace.use_trace_output_lengths
    if wl.kind == "requests" or own_outputs:
        from dlfp.workload.generator import make_workload  # builds the actual requests (cached trace reads)

        longest = max(max(r.prompt_tokens + r.output_tokens for r in make_workload(wl, s).requests)
                      for s in cfg.seeds)
        return longest, "the longest request of the workload (its prompt + its own output length)"
    return (wl.longest_prompt() + wl.output_tokens,
            f"workload.max_prompt_tokens ({wl.longest_prompt()} after clipping) + workload.output_tokens "
            f"({wl.output_tokens})")


def check_runnable(cfg: ExperimentConfig, where: str | None = None) -> None:
    """Checks across fields that every backend needs, run by ``load_experiment``/``with_overrides``
    (and ``dlfp.pipeline.run_experiment``) before any trial runs.

    * ``max_model_len`` may not exceed the model's ``max_position_embeddings`` (vLLM refuses to start);
    * the longest request (prompt + output tokens; a request list's or a trace's own output lengths when
      used) must fit ``max_model_len``, else vLLM rejects it mid-run.

    Raises:
        ConfigError: naming the fields and the numbers.
        dlfp.workload.requests.WorkloadError: the workload cannot be built (a missing request CSV or trace).
    """
    from dlfp.devices.specs import CostModelError, load_model

    what = where or f"experiment {cfg.name!r}"
    try:
        limit = load_model(cfg.model).max_position_embeddings
    except CostModelError:
        limit = None  # an unknown model is reported by the backend, naming the known ones
    if limit is not None and cfg.max_model_len > limit:
        raise ConfigError(f"{what}: field max_model_len: {cfg.max_model_len} exceeds {cfg.model}'s "
                          f"max_position_embeddings ({limit}); vLLM refuses such an engine")
    longest, how = _longest_request(cfg)
    if longest > cfg.max_model_len:
        raise ConfigError(f"{what}: field max_model_len: {cfg.max_model_len} is shorter than the longest request: "
                          f"{how} = {longest}")


def validation_message(e: ValidationError) -> str:
    """One line for pydantic's first error: ``field <dotted.loc>: <message>`` (no "Value error, " prefix)."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return f"field {loc}: {msg.splitlines()[0] if msg else msg}"


def build_policy(pc: PolicyConfig) -> Policy:
    """Construct the policy object an arm describes: its registry class, given its ``config_fields`` and options.

    Raises:
        ValueError: unknown policy or invalid controller parameters (message names the value).
    """
    cls = policy_entry(pc.policy).cls
    return cls(**{name: getattr(pc, name) for name in cls.config_fields}, **pc.options)


def list_experiments(directory: Path = EXPERIMENTS_DIR) -> list[str]:
    """Names of the experiment configs shipped in ``directory``, sorted."""
    return sorted(p.stem for p in Path(directory).glob("*.yaml"))


#: The fields a variant may set (``resolve_variant``).
VARIANT_KEYS = ("name", "variant_of", "description", "seeds", "keep_arms", "tags", "backend_options")


def resolve_variant(data: dict, where: Path) -> dict:
    """A variant experiment: another experiment's YAML (``variant_of``) with its own ``name``, ``description``,
    ``seeds`` and ``tags``, only the arms in ``keep_arms`` (default all), no fixed-cap frontier or sensitivity
    sweep (``backend_options.frontier_caps`` and ``.sensitivity`` dropped) and its own ``backend_options`` merged
    key by key into the base's (``{sim: {frontend: none}}`` changes that one option). For more seeds of a paper
    experiment, or one backend option changed, without a second copy of its configuration.

    Raises:
        ConfigError: an unknown field, an unknown base experiment, a base that is itself a variant, an arm to keep
            that the base lacks, or a baseline arm not kept (naming the field).
    """
    bad = sorted(set(data) - set(VARIANT_KEYS))
    if bad:
        raise ConfigError(f"{where}: field {bad[0]}: not allowed in a variant; allowed: {', '.join(VARIANT_KEYS)}")
    base_path = experiment_file(str(data["variant_of"]))
    if not base_path.exists():
        raise ConfigError(f"{where}: field variant_of: unknown experiment {data['variant_of']!r}")
    base = yaml.safe_load(base_path.read_text())
    if not isinstance(base, dict) or "variant_of" in base:
        raise ConfigError(f"{where}: field variant_of: {data['variant_of']!r} is itself a variant or not a mapping")
    out = copy.deepcopy(base)
    out.update({k: copy.deepcopy(data[k]) for k in ("name", "description", "seeds", "tags") if k in data})
    out.setdefault("tags", [])
    keep = data.get("keep_arms")
    if keep is not None:
        missing = [a for a in keep if a not in out.get("arms", {})]
        if missing:
            raise ConfigError(f"{where}: field keep_arms: {missing[0]!r} is not an arm of {data['variant_of']!r}")
        if out.get("baseline_arm", "baseline") not in keep:
            raise ConfigError(f"{where}: field keep_arms: must keep the baseline arm")
        out["arms"] = {a: out["arms"][a] for a in keep}
    bo = dict(out.get("backend_options") or {})
    bo.pop("frontier_caps", None)
    bo.pop("sensitivity", None)
    own = data.get("backend_options") or {}
    if not isinstance(own, dict):
        raise ConfigError(f"{where}: field backend_options: must be a mapping, got {own!r}")
    out["backend_options"] = _merged(bo, own)
    return out


def _merged(base: dict, own: dict) -> dict:
    """``base`` with ``own`` merged in key by key (mappings recursively; any other value replaces)."""
    out = copy.deepcopy(base)
    for k, v in own.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def load_experiment(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Load and validate an experiment by name (``experiment_file``: ``experiments/<name>.yaml``) or path.

    Raises:
        ConfigError: unknown experiment name (lists the known ones), unreadable
            YAML, or a field that fails validation (names the field).
    """
    p = Path(name_or_path)
    if p.suffix not in (".yaml", ".yml"):
        p = experiment_file(str(name_or_path))
        if not p.exists():
            raise ConfigError(
                f"unknown experiment {str(name_or_path)!r}; known: {', '.join(list_experiments()) or '(none)'}"
            )
    if not p.exists():
        raise ConfigError(f"experiment config {p} does not exist")
    if p.is_dir():
        raise ConfigError(f"experiment config {p} is a directory, not a YAML file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {str(e).splitlines()[0]}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"experiment config {p} cannot be read ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping at the top level")
    if "variant_of" in data:
        data = resolve_variant(data, p)
    cfg = _validate(data, str(p))
    if p.resolve().parent in (EXPERIMENTS_DIR.resolve(), experiment_file(p.stem).resolve().parent) \
            and cfg.name != p.stem:
        raise ConfigError(f"{p}: field name: {cfg.name!r} does not match the file name {p.stem!r}")
    return cfg.with_overrides(overrides)
