"""Experiment config validation: every error names the field."""
import copy

import pytest
import yaml

from dlfp import policies as ctl
from dlfp.config import ConfigError, ExperimentConfig, PolicyConfig, build_policy, list_experiments, load_experiment
from dlfp.policies.registry import POLICIES

BASE = {
    "name": "toy",
    "model": "qwen3-0.6b",
    "gpu": "a100-sxm4-80gb",
    "max_num_batched_tokens": 8192,
    "workload": {"kind": "agent", "rate": 1.0, "num_requests": 100, "num_warmup": 4},
    "slo": {"ttft_s": 2.0, "itl_s": 0.1},
    "arms": {"baseline": {"policy": "nocap"}, "dlfp": {"policy": "dlfp"}},
}


def write(tmp_path, data, name="toy.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_valid_config_and_defaults(tmp_path):
    cfg = load_experiment(write(tmp_path, BASE))
    assert cfg.seeds == [801, 802, 803]  # paper's paired seeds
    assert cfg.scheduling == "async" and cfg.tp == 1
    assert cfg.workload.output_tokens == 128  # paper: 128 output tokens
    assert cfg.slo.itl_quantile == 1.0
    p = build_policy(cfg.arms["dlfp"])
    assert isinstance(p, ctl.DLFP)
    assert (p.target_s, p.initial_cap, p.min_cap, p.max_cap, p.quantum) == (0.08, 3072, 1024, 6144, 128)
    assert isinstance(build_policy(cfg.arms["baseline"]), ctl.NoCap)


def test_unknown_field_is_named(tmp_path):
    data = copy.deepcopy(BASE)
    data["workload"]["burstiness"] = 3
    with pytest.raises(ConfigError, match=r"field workload\.burstiness: Extra inputs"):
        load_experiment(write(tmp_path, data))


@pytest.mark.parametrize("rate", [0, -1.0, ".inf"])
def test_rate_must_be_positive_and_finite(tmp_path, rate):
    data = copy.deepcopy(BASE)
    data["workload"]["rate"] = float(rate) if rate != ".inf" else float("inf")
    with pytest.raises(ConfigError, match=r"field workload\.rate"):
        load_experiment(write(tmp_path, data))


def test_unknown_experiment_name():
    with pytest.raises(ConfigError, match="unknown experiment 'no-such-experiment'"):
        load_experiment("no-such-experiment")


def test_baseline_arm_must_exist(tmp_path):
    data = copy.deepcopy(BASE)
    data["baseline_arm"] = "stock"
    with pytest.raises(ConfigError, match="baseline_arm 'stock' is not one of the arms"):
        load_experiment(write(tmp_path, data))


def test_bad_controller_parameters_name_the_value(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"]["dlfp"] = {"policy": "dlfp", "initial_cap": 3000}
    with pytest.raises(ConfigError, match=r"field arms\.dlfp.*initial_cap=3000 is not a multiple"):
        load_experiment(write(tmp_path, data))


def test_fixed_needs_cap(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"]["fixed"] = {"policy": "fixed"}
    with pytest.raises(ConfigError, match=r"arms\.fixed.*cap is required"):
        load_experiment(write(tmp_path, data))


def test_duplicate_seeds_rejected(tmp_path):
    data = {**copy.deepcopy(BASE), "seeds": [801, 801]}
    with pytest.raises(ConfigError, match="seeds must be distinct"):
        load_experiment(write(tmp_path, data))


def test_overrides(tmp_path):
    cfg = load_experiment(write(tmp_path, BASE), overrides={"workload.num_requests": 10, "seeds": [1]})
    assert cfg.workload.num_requests == 10 and cfg.seeds == [1]
    with pytest.raises(ConfigError, match="no field 'nope'"):
        cfg.with_overrides({"workload.nope": 1})
    with pytest.raises(ConfigError, match=r"field workload\.num_requests"):
        cfg.with_overrides({"workload.num_requests": 0})


def test_not_yaml_mapping(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_experiment(p)
    p.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_experiment(p)


def test_shipped_experiments_validate():
    # Every config shipped in the package must load (none yet is acceptable while they are written).
    for name in list_experiments():
        cfg = load_experiment(name)
        assert isinstance(cfg, ExperimentConfig) and cfg.name == name


# --------------------------------------------------------------------------- robustness (hostile input)

PLAIN = "must be a plain name ([A-Za-z0-9._-], no '/' or '..')"


@pytest.mark.parametrize("name", ["../../escape", "", "a/b", "a..b", ".hidden", "-dash"])
def test_experiment_name_must_be_a_plain_name(tmp_path, name):
    data = {**copy.deepcopy(BASE), "name": name}
    with pytest.raises(ConfigError) as ei:
        load_experiment(write(tmp_path, data))
    assert str(ei.value) == f"{tmp_path / 'toy.yaml'}: field name: {name!r} {PLAIN}"


def test_override_name_and_arm_names_must_be_plain(tmp_path):
    cfg = load_experiment(write(tmp_path, BASE))
    with pytest.raises(ConfigError, match=r"field name: '\.\./\.\./evil2' must be a plain name"):
        cfg.with_overrides({"name": "../../evil2"})
    data = copy.deepcopy(BASE)
    data["arms"]["x/../../y"] = {"policy": "nocap"}
    with pytest.raises(ConfigError) as ei:
        load_experiment(write(tmp_path, data))
    assert str(ei.value).endswith(f"field arms: 'x/../../y' {PLAIN}")
    # names the shipped configs use are plain
    ok = {**copy.deepcopy(BASE), "name": "qwen3-0.6b-tp1_x"}
    ok["arms"]["fixed-1024"] = {"policy": "fixed", "cap": 1024}
    assert set(load_experiment(write(tmp_path, ok)).arms) == {"baseline", "dlfp", "fixed-1024"}


@pytest.mark.parametrize("where,key,value", [
    ("workload", "prompt_scale", float("inf")),
    ("workload", "prompt_scale", float("nan")),
    ("workload", "rate", float("nan")),
    ("slo", "itl_s", float("inf")),
    ("slo", "ttft_s", float("nan")),
    ("arms.dlfp", "target_s", float("inf")),
    ("arms.dlfp", "gain", float("nan")),
    (None, "gpu_memory_utilization", float("nan")),
])
def test_float_fields_must_be_finite(tmp_path, where, key, value):
    data = copy.deepcopy(BASE)
    node = data
    for part in (where.split(".") if where else []):
        node = node[part]
    node[key] = value
    loc = f"{where}.{key}" if where else key
    with pytest.raises(ConfigError, match=rf"field {loc}: Input should be a finite number"):
        load_experiment(write(tmp_path, data))


@pytest.mark.parametrize("where,key", [("workload", "num_requests"), ("arms.dlfp", "quantum"),
                                       ("slo", "ttft_s"), (None, "max_num_seqs")])
def test_booleans_are_not_numbers(tmp_path, where, key):
    data = copy.deepcopy(BASE)
    node = data
    for part in (where.split(".") if where else []):
        node = node[part]
    node[key] = True
    loc = f"{where}.{key}" if where else key
    with pytest.raises(ConfigError, match=rf"field {loc}: expected a number, got the boolean True"):
        load_experiment(write(tmp_path, data))


def test_seeds_must_be_non_negative(tmp_path):
    with pytest.raises(ConfigError, match=r"field seeds\.1: Input should be greater than or equal to 0"):
        load_experiment(write(tmp_path, {**copy.deepcopy(BASE), "seeds": [801, -5]}))
    with pytest.raises(ConfigError, match=r"field seeds\.0: expected a number, got the boolean True"):
        load_experiment(write(tmp_path, {**copy.deepcopy(BASE), "seeds": [True]}))


def test_longest_request_must_fit_max_model_len(tmp_path):
    data = {**copy.deepcopy(BASE), "max_model_len": 4096}
    data["workload"]["max_prompt_tokens"] = 4000  # 4000 + 128 output tokens = 4128 > 4096
    with pytest.raises(ConfigError) as ei:
        load_experiment(write(tmp_path, data))
    assert str(ei.value) == (f"{tmp_path / 'toy.yaml'}: field max_model_len: 4096 is shorter than the longest "
                             "request: workload.max_prompt_tokens (4000 after clipping) + workload.output_tokens "
                             "(128) = 4128")
    data["workload"]["max_prompt_tokens"] = 3968  # exactly fits: 3968 + 128 = 4096
    assert load_experiment(write(tmp_path, data)).max_model_len == 4096
    # fixed prompts: the fixed length (after clipping) is what must fit, not max_prompt_tokens
    data["workload"] = {"kind": "fixed", "rate": 1.0, "num_requests": 3, "prompt_tokens": 1000,
                        "max_prompt_tokens": 32768}
    assert load_experiment(write(tmp_path, data)).workload.longest_prompt() == 1000


def test_engine_shape_limits(tmp_path):
    with pytest.raises(ConfigError, match=r"field block_size: Input should be a multiple of 16"):
        load_experiment(write(tmp_path, {**copy.deepcopy(BASE), "block_size": 24}))
    with pytest.raises(ConfigError, match=r"field max_num_batched_tokens: Input should be greater than or equal to 16"):
        load_experiment(write(tmp_path, {**copy.deepcopy(BASE), "max_num_batched_tokens": 8}))


def test_cap_only_with_fixed_policy(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"]["dlfp"] = {"policy": "dlfp", "cap": 100}
    with pytest.raises(ConfigError, match=r"field arms\.dlfp: cap is only used when policy=fixed \(policy=dlfp\)"):
        load_experiment(write(tmp_path, data))


def test_config_path_that_is_a_directory(tmp_path):
    d = tmp_path / "dir.yaml"
    d.mkdir()
    with pytest.raises(ConfigError) as ei:
        load_experiment(d)
    assert str(ei.value) == f"experiment config {d} is a directory, not a YAML file"


def test_policy_name_comes_from_the_registry(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"]["dlfp"] = {"policy": "pid"}
    with pytest.raises(ConfigError, match=r"field arms\.dlfp\.policy: unknown policy 'pid'; known: dlfp, dlfpg, "
                                          r"dlfps, fixed, nocap$"):
        load_experiment(write(tmp_path, data))
    slo = {"itl_s": 0.1, "ttft_s": 2.0}
    for name, entry in POLICIES.items():  # every entry builds from its config fields and the SLO values it takes
        pc = PolicyConfig(policy=name, cap=512 if "cap" in entry.cls.config_fields else None,
                          options={opt: slo[fld] for opt, fld in entry.slo_options.items()})
        pol = build_policy(pc)
        assert type(pol) is entry.cls and pol.name == name


@pytest.mark.parametrize("options,loc,msg", [
    ({"forgetting": 1.5}, "forgetting", "Input should be less than or equal to 1"),
    ({"min_samples": 2.0}, "min_samples", "Input should be a valid integer"),
    ({"use_estimator": 1}, "use_estimator", "Input should be a valid boolean"),
    ({"tail_margin": True}, "tail_margin", "expected a number, got the boolean True"),
    ({"nope": 1}, "nope", "Extra inputs are not permitted"),
])
def test_dlfps_options_are_typed_and_named(tmp_path, options, loc, msg):
    data = copy.deepcopy(BASE)
    data["arms"]["dlfps"] = {"policy": "dlfps", "options": options}
    with pytest.raises(ConfigError) as ei:
        load_experiment(write(tmp_path, data))
    assert str(ei.value) == f"{tmp_path / 'toy.yaml'}: field arms.dlfps.options.{loc}: {msg}"


def test_options_of_a_policy_without_options_are_rejected(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"]["dlfp"] = {"policy": "dlfp", "options": {"ttft_slo_s": 2.0}}
    with pytest.raises(ConfigError, match=r"field arms\.dlfp\.options\.ttft_slo_s: Extra inputs are not permitted"):
        load_experiment(write(tmp_path, data))


def test_the_experiment_slo_reaches_the_policies_that_take_it(tmp_path):
    data = copy.deepcopy(BASE)
    data["arms"]["dlfps"] = {"policy": "dlfps", "options": {"use_estimator": False}}
    data["arms"]["own-slo"] = {"policy": "dlfps", "options": {"ttft_slo_s": 7.5}}
    cfg = load_experiment(write(tmp_path, data))
    # slo.ttft_s = 2.0 is filled in first, the arm's own options follow; an arm's own value wins
    assert list(cfg.arms["dlfps"].options.items()) == [("ttft_slo_s", 2.0), ("use_estimator", False)]
    assert cfg.arms["own-slo"].options == {"ttft_slo_s": 7.5}
    assert cfg.arms["dlfp"].options == {} and cfg.arms["baseline"].options == {}
    assert build_policy(cfg.arms["dlfps"]).ttft_slo_s == 2.0
    # an override of the SLO reaches the arms that follow it; an arm's own value stays
    over = cfg.with_overrides({"slo.ttft_s": 4.0})
    assert over.arms["dlfps"].options["ttft_slo_s"] == 4.0 and over.arms["own-slo"].options == {"ttft_slo_s": 7.5}
    assert list(over.arms["dlfps"].options.items()) == [("ttft_slo_s", 4.0), ("use_estimator", False)]
    # a config built in Python gets it too
    assert ExperimentConfig.model_validate(cfg.model_dump()).arms["dlfps"].options["ttft_slo_s"] == 2.0


def test_require_arm(tmp_path):
    cfg = load_experiment(write(tmp_path, BASE))
    assert cfg.require_arm("dlfp") is cfg.arms["dlfp"]
    with pytest.raises(ConfigError) as ei:
        cfg.require_arm("dlfps")
    assert str(ei.value) == "experiment 'toy' has no arm 'dlfps'; arms: ['baseline', 'dlfp']"
