"""data/paper/published.csv: every published number of issue 7's table, internally consistent and joinable."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dlfp.config import list_experiments, load_experiment

ROOT = Path(__file__).resolve().parents[1]
PUB = ROOT / "data" / "paper" / "published.csv"
COLUMNS = ["experiment", "metric", "arm_or_change", "value", "unit", "direction", "qualitative", "source_sentence",
           "source_document"]
PAPER_EXPERIMENTS = ["qwen3-0.6b-tp1", "qwen3-0.6b-tp2", "qwen3-8b-r0.10", "qwen3-8b-r0.25", "qwen3-32b-tp2",
                     "qwen3-32b-tp2-completion-sync"]


@pytest.fixture(scope="module")
def pub() -> pd.DataFrame:
    return pd.read_csv(PUB)


def val(pub, exp, metric, arm):
    r = pub[(pub.experiment == exp) & (pub.metric == metric) & (pub.arm_or_change == arm)]
    assert len(r) == 1, (exp, metric, arm)
    return float(r.value.iloc[0])


def test_schema_and_vocabulary(pub):
    assert list(pub.columns) == COLUMNS
    assert set(pub.direction) <= {"decrease", "increase", "none"}
    assert not pub.duplicated(["experiment", "metric", "arm_or_change"]).any()
    # a row is either a number or a qualitative statement
    assert (pub.value.notna() | pub.qualitative.notna()).all()
    assert set(pub.experiment) <= set(list_experiments())


def test_every_experiment_has_rows(pub):
    counts = pub.experiment.value_counts()
    for e in PAPER_EXPERIMENTS:
        assert counts.get(e, 0) >= 1, f"no published rows for {e}"


def test_every_number_appears_in_its_source_sentence(pub):
    for r in pub.itertuples():
        if pd.isna(r.value) or r.unit == "bool":
            continue
        v = abs(r.value)
        forms = {f"{v:g}", f"{v:,.0f}", f"{v:.1f}", f"{v / 1000:.3f}"}  # 1763 ms is written "1.763 s"
        nums = set(re.findall(r"\d[\d,]*(?:\.\d+)?", r.source_sentence))
        assert forms & nums, f"{r.experiment} {r.metric} {r.arm_or_change}: {r.value} not in {r.source_sentence!r}"


def test_headline_seeds_average_to_the_published_mean(pub):
    e = "qwen3-0.6b-tp1"
    seeds = [val(pub, e, "p99_itl", f"change_seed_{s}") for s in (801, 802, 803)]
    mean = val(pub, e, "p99_itl", "change_mean")
    assert abs(np.mean(seeds) - mean) < 0.1  # (-24.8 - 30.1 - 28.2) / 3 = -27.7
    lo, hi = val(pub, e, "p99_itl", "change_ci95_low"), val(pub, e, "p99_itl", "change_ci95_high")
    assert lo < mean < hi < 0
    # the published interval is a t interval on 3 paired seeds: mean +- t(0.975, 2) * sd / sqrt(3)
    from scipy import stats

    half = stats.t.ppf(0.975, 2) * np.std(seeds, ddof=1) / np.sqrt(3)
    assert abs(half - (hi - lo) / 2) < 0.15, f"t half-width {half:.2f} vs published {(hi - lo) / 2:.2f}"


def test_direction_agrees_with_sign_of_changes(pub):
    ch = pub[pub.arm_or_change.str.startswith("change") & pub.value.notna() & (pub.unit == "percent")]
    for r in ch.itertuples():
        assert r.direction == ("decrease" if r.value < 0 else "increase"), r
    for e, metric in [("qwen3-8b-r0.10", "p99_itl"), ("qwen3-8b-r0.25", "p99_itl"), ("qwen3-8b-r0.10", "slo_passes")]:
        b, d = val(pub, e, metric, "baseline"), val(pub, e, metric, "dlfp")
        rows = pub[(pub.experiment == e) & (pub.metric == metric)]
        assert set(rows.direction) == {"increase" if d > b else "decrease"}


def test_counts_match_the_experiment_config(pub):
    """600/600 requests = 100 measured x 3 seeds x 2 arms; 76,800 token ids = 600 x 128 output tokens.

    The paper's two arms are the baseline and DLFP; this artifact's extra arms (DLFP-S and its ablations)
    are not part of the published counts.
    """
    cfg = load_experiment("qwen3-0.6b-tp1")
    paper_arms = [a for a in cfg.arms if cfg.arms[a].policy in ("nocap", "dlfp")]
    assert sorted(paper_arms) == ["baseline", "dlfp"]
    n = cfg.workload.num_requests * len(cfg.seeds) * len(paper_arms)
    e = cfg.name
    assert val(pub, e, "requests_completed", "all_arms_seeds") == val(pub, e, "requests_offered", "all_arms_seeds") == n
    assert val(pub, e, "token_ids_agree", "across_arms") == val(pub, e, "token_ids_total", "across_arms") \
        == n * cfg.workload.output_tokens
    # SLO passes are counts out of the measured requests
    for e in ("qwen3-8b-r0.10", "qwen3-8b-r0.25"):
        rows = pub[(pub.experiment == e) & (pub.metric == "slo_passes") & pub.value.notna()]
        assert (rows.unit == f"requests of {load_experiment(e).workload.num_requests}").all()
