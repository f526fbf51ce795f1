"""Variants of shipped experiments (``variant_of``): the paper experiments on ten seeds, with their rows in
``published_vs_reproduced``, and the emulated experiments without the API server (the simulator's side of
``sim_vs_emu``)."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dlfp.analysis.tables.published import with_seed_variants
from dlfp.config import EXPERIMENTS_ENV, ConfigError, load_experiment
from dlfp.paths import EXPERIMENTS_DIR, REPO_ROOT
from dlfp.trial_config import trial_config

PAPER = ("qwen3-0.6b-tp1", "qwen3-0.6b-tp2", "qwen3-8b-r0.10", "qwen3-8b-r0.25", "qwen3-32b-tp2",
         "qwen3-32b-tp2-completion-sync")
#: The GPU experiments the emulator runs (data/traces/emu), each with a simulator variant without the API server.
EMULATED = ("qwen3-0.6b-tp1", "qwen3-0.6b-tp2", "qwen3-8b-r0.10", "qwen3-8b-r0.25", "qwen3-32b-tp2",
            "qwen3-0.6b-tp1-long-prompt", "qwen3-8b-long-prompt", "qwen3-32b-tp2-long-prompt")


@pytest.mark.parametrize("exp", PAPER)
def test_a_variant_is_its_base_on_ten_seeds_with_baseline_and_dlfp(exp):
    """Everything that shapes a trial is the base's (its trial configuration but the name and the dropped sweeps)."""
    base, var = load_experiment(exp), load_experiment(f"{exp}-10seeds")
    assert var.seeds == list(range(801, 811))
    assert list(var.arms) == ["baseline", "dlfp"]
    assert var.arms["dlfp"] == base.arms["dlfp"] and var.workload == base.workload
    assert "frontier_caps" not in var.backend_options and "sensitivity" not in var.backend_options
    for arm in ("baseline", "dlfp"):
        a, b = trial_config(var, arm), trial_config(base, arm)
        for d in (a, b):
            d.pop("name")
            for k in ("frontier_caps", "sensitivity"):
                d.get("backend_options", {}).pop(k, None)
        assert a == b


def test_the_shipped_variant_traces_repeat_the_papers_seeds_exactly():
    """Seeds 801-803 of a variant are the base experiment's trials: identical token times."""
    traces = REPO_ROOT / "data" / "traces" / "sim"
    for seed in (801, 803):
        a = pd.read_parquet(traces / "qwen3-0.6b-tp1" / "dlfp" / f"seed-{seed}" / "tokens.parquet")
        b = pd.read_parquet(traces / "qwen3-0.6b-tp1-10seeds" / "dlfp" / f"seed-{seed}" / "tokens.parquet")
        pd.testing.assert_frame_equal(a, b)


def write(tmp_path, body: dict):
    p = tmp_path / f"{body['name']}.yaml"
    p.write_text(yaml.safe_dump(body))
    return p


@pytest.mark.parametrize("body, field", [
    (dict(name="v1", variant_of="qwen3-0.6b-tp1", rate=2.0), "rate"),
    (dict(name="v2", variant_of="no-such-experiment"), "variant_of"),
    (dict(name="v3", variant_of="qwen3-0.6b-tp1", keep_arms=["dlfp"]), "keep_arms"),
    (dict(name="v4", variant_of="qwen3-0.6b-tp1", keep_arms=["baseline", "nope"]), "keep_arms"),
])
def test_a_bad_variant_is_refused_naming_the_field(tmp_path, body, field):
    with pytest.raises(ConfigError, match=f"field {field}"):
        load_experiment(write(tmp_path, body))


def test_every_shipped_variant_names_a_paper_or_an_emulated_experiment():
    variants = sorted(p.stem for p in EXPERIMENTS_DIR.glob("*.yaml") if "variant_of" in yaml.safe_load(p.read_text()))
    assert variants == sorted([f"{e}-10seeds" for e in PAPER] + [f"{e}-no-api-server" for e in EMULATED])


@pytest.mark.parametrize("exp", EMULATED)
def test_a_variant_without_the_api_server_changes_that_option_only(exp):
    """The base runs with the API server of ``vllm serve`` (its default on a datasheet GPU); the variant differs in
    ``backend_options.sim.frontend`` alone, with the emulator's three arms on the base's seeds."""
    from dlfp.backends.sim.runner import frontend
    from dlfp.devices import roofline as cm

    base, var = load_experiment(exp), load_experiment(f"{exp}-no-api-server")
    assert var.seeds == base.seeds and list(var.arms) == ["baseline", "dlfp", "dlfpg"]
    assert var.backend_options == {"sim": {"frontend": "none"}} and "sim-only" in var.tags
    assert frontend(base, cm.load_gpu(base.gpu)).request_s > 0 and frontend(var, cm.load_gpu(var.gpu)).request_s == 0
    for arm in var.arms:
        a, b = trial_config(var, arm), trial_config(base, arm)
        for d in (a, b):
            d.pop("name")
            d["backend_options"] = {k: v for k, v in d.get("backend_options", {}).items()
                                    if k not in ("frontier_caps", "sensitivity", "sim")}
        assert a == b


def test_a_variants_backend_options_merge_into_the_bases_key_by_key(tmp_path):
    """A nested option replaces that key alone; the base's other options stay (worked on a made-up base)."""
    base = load_experiment("qwen3-0.6b-tp1").model_dump(mode="json")
    base["name"] = "vbase"
    base["backend_options"] = {"sim": {"frontend": "chat", "prefix_caching": False}, "other": 1}
    write(Path(os.environ[EXPERIMENTS_ENV]), base)  # declared for this test (conftest.declared_experiments)
    own = {"sim": {"frontend": "none"}}
    v = load_experiment(write(tmp_path, dict(name="v", variant_of="vbase", backend_options=own)))
    assert v.backend_options == {"sim": {"frontend": "none", "prefix_caching": False}, "other": 1}
    with pytest.raises(ConfigError, match="field backend_options"):
        load_experiment(write(tmp_path, dict(name="w", variant_of="vbase", backend_options=[1])))


def test_published_rows_are_copied_to_a_traced_variant_without_the_per_seed_ones():
    pubs = pd.DataFrame({"experiment": ["e", "e", "e", "f"], "metric": ["p99_itl"] * 4,
                         "arm_or_change": ["change_seed_801", "change_mean", "baseline", "change_mean"],
                         "value": [1.0, 2.0, 3.0, 4.0]})
    out = with_seed_variants(pubs, {"e": ["sim"], "e-10seeds": ["sim"], "g-10seeds": ["sim"]})
    v = out[out["experiment"] == "e-10seeds"]
    assert list(v["arm_or_change"]) == ["change_mean", "baseline"] and list(v["value"]) == [2.0, 3.0]
    assert len(out) == 6  # g has no published rows: nothing copied


def test_the_rendered_table_has_ten_seed_rows_for_every_paper_experiment():
    pvr = pd.read_csv(REPO_ROOT / "data" / "results" / "published_vs_reproduced.csv")
    sim = pvr[pvr["backend"] == "sim"]
    for exp in PAPER:
        rows = sim[sim["experiment"] == f"{exp}-10seeds"]
        assert len(rows) > 0 and not rows["arm_or_change"].str.startswith("change_seed_").any()
    mean = sim[(sim["experiment"] == "qwen3-0.6b-tp1-10seeds") & (sim["metric"] == "p99_itl")
               & (sim["arm_or_change"] == "change_mean")]
    assert mean["note"].iloc[0] == "paired mean over 10 seed(s)"
