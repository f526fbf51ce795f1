"""Experiment config validation: every error names the field."""
import copy

import pytest
import yaml

from dlfp import controller as ctl
from dlfp.config import ConfigError, ExperimentConfig, build_policy, list_experiments, load_experiment

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
