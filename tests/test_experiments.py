"""The shipped experiment configs: they validate, match the paper's table, and record every unstated choice."""
from __future__ import annotations


import pytest
import yaml

from dlfp import policies as ctl
from dlfp.config import EXPERIMENTS_DIR, build_policy, list_experiments, load_experiment
from dlfp.paths import PACKAGE_DIR
from dlfp.workload.generator import resolve_trace_path

PKG = PACKAGE_DIR
MODELS = yaml.safe_load((PKG / "models" / "qwen3.yaml").read_text())
GPUS = yaml.safe_load((PKG / "hardware" / "gpus.yaml").read_text())
WORKLOADS = PACKAGE_DIR.parents[1] / "data" / "workloads"

# The paper's table of experiments: name -> (model, tp, rate req/s or None = our choice, measured requests)
PAPER_TABLE = {
    "qwen3-0.6b-tp1": ("qwen3-0.6b", 1, 1.0, 100),
    "qwen3-0.6b-tp2": ("qwen3-0.6b", 2, 1.0, 100),
    "qwen3-8b-r0.10": ("qwen3-8b", 1, 0.10, 20),
    "qwen3-8b-r0.25": ("qwen3-8b", 1, 0.25, 20),
    "qwen3-32b-tp2": ("qwen3-32b", 2, None, 20),
    "qwen3-32b-tp2-completion-sync": ("qwen3-32b", 2, None, 20),
}
TRACE_ROWS = {"qwen3-0.6b-tp1-mooncake": "qwen3-0.6b-tp1", "qwen3-8b-mooncake": "qwen3-8b-r0.10"}
ALL = list_experiments()
# Unstated in the paper (PAPER.md): each must be recorded as an assumption in every paper experiment.
UNSTATED = ("max_num_batched_tokens", "workload.kind", "workload.num_warmup", "slo")


def _get(cfg, dotted: str):
    node = cfg.model_dump()
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return KeyError
        node = node[part]
    return node


def test_every_experiment_of_the_paper_table_ships():
    assert set(PAPER_TABLE) | set(TRACE_ROWS) | {"cpu-tiny"} <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_config_validates_and_is_consistent(name):
    cfg = load_experiment(name)
    assert cfg.name == name
    assert cfg.model in MODELS, f"{name}: unknown model {cfg.model}"
    arch = MODELS[cfg.model]
    if "cpu" in cfg.tags:
        assert cfg.gpu == "cpu"
    else:
        assert cfg.gpu in GPUS
    # TP must split the attention and KV heads
    assert arch["num_attention_heads"] % cfg.tp == 0 and arch["num_key_value_heads"] % cfg.tp == 0
    wl = cfg.workload
    if wl.kind == "requests":  # a request list is taken as given: every request fits, one seed (others are copies)
        assert max(r.prompt_tokens + r.output_tokens for r in wl.requests) <= cfg.max_model_len
        # on the simulator more seeds would be copies; a real-engine experiment repeats it for its noise
        assert cfg.seeds == [801] or ("vllm" in cfg.tags and cfg.seeds == [801, 802, 803])
    else:
        assert wl.max_prompt_tokens + wl.output_tokens <= cfg.max_model_len
        # a GPU run of the torch backend declares the seeds its device time reached (its header says which)
        assert cfg.seeds == [801, 802, 803] or ("torch" in cfg.tags and "gpu" in cfg.tags and cfg.seeds == [801]) \
            or ("paper-variant" in cfg.tags and cfg.seeds == list(range(801, 811)))
    assert cfg.max_model_len <= arch["max_position_embeddings"]
    assert wl.vocab_size == arch["vocab_size"]
    assert cfg.arms[cfg.baseline_arm].policy == "nocap"
    # the paper's two arms, plus this artifact's controllers DLFP-S and DLFP-G and their ablations
    assert {"baseline", "dlfp"} <= set(cfg.arms)
    for a in set(cfg.arms) - {"baseline", "dlfp"}:
        policy = a.split("-", 1)[0]
        assert policy in ("dlfps", "dlfpg") and cfg.arms[a].policy == policy, f"{name}: arm {a}"
    if "paper-variant" in cfg.tags:  # more seeds of a paper experiment: its two arms only (test_seed_variants)
        assert set(cfg.arms) == {"baseline", "dlfp"}
        return
    if "engine-only" in cfg.tags:  # the simulator beside the emulator: the emulator's arms (test_seed_variants)
        assert set(cfg.arms) == {"baseline", "dlfp", "dlfpg"} and cfg.backend_options == {"sim": {"frontend": "none"}}
        return
    if not {"vllm", "torch"} & set(cfg.tags):  # every simulator experiment runs DLFP-G and each of its ablations
        assert {"dlfpg", "dlfpg-no-estimate", "dlfpg-no-context", "dlfpg-no-ttft-guard",
                "dlfpg-host-cadence"} <= set(cfg.arms)
    if "dlfpg" in cfg.arms:  # the objective is the experiment's own unless the arm states it (cpu-tiny scale)
        opts = cfg.arms["dlfpg"].options
        assert opts["ttft_budget_s"] == cfg.slo.ttft_s
        assert opts["itl_target_s"] == (cfg.slo.itl_s if "scaled" not in cfg.tags else cfg.arms["dlfp"].target_s)
    # every assumption that names a config field states the value the config actually uses
    for a in cfg.assumptions:
        v = _get(cfg, a.field)
        if v is not KeyError and not isinstance(a.value, str):
            assert v == a.value, f"{name}: assumption {a.field}={a.value!r} but the config has {v!r}"
        assert len(a.reason) > 20
    if "torch" in cfg.tags:  # real time on a lent GPU: no fixed-cap frontier
        assert "frontier_caps" not in cfg.backend_options
        return
    caps = cfg.backend_options["frontier_caps"]
    assert caps == sorted(set(caps)) and caps[-1] <= cfg.max_num_batched_tokens


@pytest.mark.parametrize("name", [n for n in ALL if "scaled" not in load_experiment(n).tags])
def test_dlfp_arm_builds_the_paper_controller(name):
    cfg = load_experiment(name)
    pol = build_policy(cfg.arms["dlfp"])
    assert isinstance(pol, ctl.DLFP)
    assert (pol.target_s, pol.initial_cap, pol.min_cap, pol.max_cap, pol.quantum, pol.gain) == (
        0.080, 3072, 1024, 6144, 128, 1.0)
    # behaviour, worked by hand: no cap without decodes; 3,072 at first; a guarded cycle of 160 ms
    # (twice the 80 ms target) halves it to 1,536; one of 20 ms would quadruple it, clamped to 6,144.
    assert pol.prefill_cap(0) is None and pol.prefill_cap(3) == 3072
    sig = "host_interval_s" if pol.signal == "host_cadence" else "device_time_s"
    pol.observe(ctl.Observation(0, 0.0, 2000, 3, 3072, **{sig: 0.160}))
    assert pol.prefill_cap(3) == 1536
    pol.observe(ctl.Observation(1, 0.2, 1536, 3, 1536, **{sig: 0.020}))
    assert pol.prefill_cap(3) == 6144
    # the token budget leaves room for the whole clamp (otherwise the upper caps could never bind)
    assert cfg.max_num_batched_tokens >= pol.max_cap
    # the frontier sweep spans 512..8,192 and brackets the clamp (none on the torch backend's GPU runs, nor in a
    # paper experiment's variant, whose base sweeps it)
    if "torch" in cfg.tags or "paper-variant" in cfg.tags or "engine-only" in cfg.tags:
        return
    caps = cfg.backend_options["frontier_caps"]
    assert caps[0] == 512 and caps[-1] == 8192 and {1024, 3072, 6144} <= set(caps)


@pytest.mark.parametrize("name", list(PAPER_TABLE))
def test_paper_table_values(name):
    cfg = load_experiment(name)
    model, tp, rate, n = PAPER_TABLE[name]
    assert (cfg.model, cfg.tp, cfg.gpu, cfg.workload.num_requests) == (model, tp, "a100-sxm4-80gb", n)
    if rate is not None:
        assert cfg.workload.rate == rate
    else:
        assert "workload.rate" in {a.field for a in cfg.assumptions}
    assert cfg.workload.kind == "agent" and cfg.workload.output_tokens == 128
    fields = {a.field for a in cfg.assumptions}
    assert set(UNSTATED) <= fields, f"{name}: unstated choices without an assumption: {set(UNSTATED) - fields}"
    if name.endswith("completion-sync"):
        assert cfg.scheduling == "sync" and cfg.arms["dlfp"].signal == "device_completion"
        assert cfg.workload == load_experiment("qwen3-32b-tp2").workload  # "as above"
    else:
        assert cfg.scheduling == "async" and cfg.arms["dlfp"].signal == "host_cadence"


@pytest.mark.parametrize("name", list(TRACE_ROWS))
def test_trace_rows(name):
    cfg = load_experiment(name)
    base = load_experiment(TRACE_ROWS[name])
    tr = cfg.workload.trace
    assert cfg.workload.kind == "trace" and tr.format == "mooncake" and tr.nonmatching
    assert (cfg.model, cfg.tp, cfg.workload.rate, cfg.workload.num_requests) == (
        base.model, base.tp, base.workload.rate, base.workload.num_requests)
    assert resolve_trace_path(tr.path) == (WORKLOADS / "mooncake_conversation_trace.jsonl").resolve()
    repo = EXPERIMENTS_DIR.parents[2]
    assert not list((repo / "artifact").rglob("*.jsonl"))  # the public traces live in data/workloads only
    assert {p.parent for p in (repo / "data").rglob("mooncake*.jsonl")} == {WORKLOADS}


@pytest.mark.parametrize("name", list(TRACE_ROWS))
def test_trace_rows_build_their_workload(name):
    from dlfp.workload.generator import make_workload

    cfg = load_experiment(name)
    inst = make_workload(cfg.workload, cfg.seeds[0])
    assert len(inst.measured) == cfg.workload.num_requests
    assert max(r.prompt_tokens for r in inst.requests) <= cfg.workload.max_prompt_tokens


@pytest.mark.parametrize("name", ALL)
def test_sensitivity_values_are_valid_overrides(name):
    cfg = load_experiment(name)
    for key, values in cfg.backend_options.get("sensitivity", {}).items():
        assert cfg.model_dump().get(key.split(".")[0]) is not None, f"{name}: sensitivity key {key} is no config field"
        for v in values:
            alt = cfg.with_overrides({key: v})
            got = alt.model_dump()
            for part in key.split("."):
                got = got[part]
            assert got == v
    # the chosen value is among the sensitivity values it is compared with
    sens = cfg.backend_options.get("sensitivity", {})
    if "max_num_batched_tokens" in sens:
        assert cfg.max_num_batched_tokens in sens["max_num_batched_tokens"]
