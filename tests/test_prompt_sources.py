"""Prompt-length sources of the agent profile (``workload.prompt_source``)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dlfp.config import ConfigError, load_experiment
from dlfp.paths import REPO_ROOT
from dlfp.workload.generator import make_workload
from dlfp.workload.profiles import PROMPT_SOURCES, probability_grid, source_quantiles


def test_default_source_dumps_as_before():
    """At its default the field is left out of dumps: the shipped trace's recorded config still matches."""
    cfg = load_experiment("qwen3-0.6b-tp1")
    assert "prompt_source" not in cfg.model_dump(mode="json")["workload"]
    md = json.loads((REPO_ROOT / "data/traces/sim/qwen3-0.6b-tp1/baseline/seed-801/metadata.json").read_text())
    assert md["config"]["workload"] == cfg.model_dump(mode="json")["workload"]
    other = load_experiment("qwen3-0.6b-tp1", {"workload.prompt_source": "azure-code"})
    assert other.model_dump(mode="json")["workload"]["prompt_source"] == "azure-code"


def test_azure_conversation_quantiles_match_numpy_on_the_trace():
    """The derived table equals numpy.quantile of the CSV's ContextTokens column, read here without dlfp."""
    path = REPO_ROOT / PROMPT_SOURCES["azure-conversation"][0]
    lines = path.read_text().splitlines()
    col = lines[0].split(",").index("ContextTokens")
    x = np.array([float(r.split(",")[col]) for r in lines[1:] if r], dtype=float)
    probs, qs = source_quantiles("azure-conversation")
    np.testing.assert_array_equal(probs, probability_grid())
    np.testing.assert_allclose(qs, np.round(np.quantile(x, probs), 3), rtol=0, atol=0)


def test_mooncake_synthetic_median_is_the_published_11_6k():
    probs, qs = source_quantiles("mooncake-synthetic")
    assert round(float(qs[list(probs).index(0.5)]) / 100) * 100 == 11600  # 11,587 tokens


def test_sources_give_their_own_lengths_and_the_default_is_unchanged():
    base = load_experiment("qwen3-0.6b-tp1")
    default = [r.prompt_tokens for r in make_workload(base.workload, 801).requests]
    same = load_experiment("qwen3-0.6b-tp1", {"workload.prompt_source": "mooncake-conversation"})
    assert [r.prompt_tokens for r in make_workload(same.workload, 801).requests] == default
    azure = load_experiment("qwen3-0.6b-tp1", {"workload.prompt_source": "azure-conversation"})
    lengths = [r.prompt_tokens for r in make_workload(azure.workload, 801).requests]
    assert lengths != default and max(lengths) <= 14050  # the Azure conversation trace's longest context


def test_unknown_source_names_the_field():
    with pytest.raises(ConfigError, match="prompt_source"):
        load_experiment("qwen3-0.6b-tp1", {"workload.prompt_source": "sharegpt"})
