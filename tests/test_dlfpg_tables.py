"""DLFP-G's tables: the target rows on hand-made frames, and the shipped tables as REPRODUCE.md shows them."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dlfp.analysis.tables.dlfpg import _real_engine_rows, _slo_rows, dev_targets
from reproduce_quotes import quoted_block, rendered

REPO = Path(__file__).resolve().parents[1]


def _frame(rows):
    return pd.DataFrame(rows, columns=["experiment", "arm", "seed", "itl_p99_s", "ttft_p99_s", "slo_passes"])


def test_slo_passes_are_summed_over_seeds():
    df = _frame([("e", "baseline", 801, 0.1, 1.0, 10), ("e", "baseline", 802, 0.1, 1.0, 12),
                 ("e", "dlfpg", 801, 0.1, 1.0, 13), ("e", "dlfpg", 802, 0.1, 1.0, 8),
                 ("f", "baseline", 801, 0.1, 1.0, 3)])
    rows = _slo_rows("sim", df)
    assert len(rows) == 1  # experiment f has no DLFP-G arm
    r = rows[0]
    # 13 + 8 = 21 < 10 + 12 = 22
    assert (r["experiment"], r["value"], r["threshold"], r["reached"]) == ("e", 21.0, 22.0, False)


def test_the_real_engine_row_compares_dlfpg_with_dlfp_seed_by_seed():
    rows = []
    for seed, b, d, g in [(801, 1.0, 0.4, 0.1), (802, 2.0, 0.5, 0.2), (803, 0.5, 0.3, 0.05)]:
        rows += [("cpu", "baseline", seed, b, 4.0, 5), ("cpu", "dlfp", seed, d, 6.0, 5),
                 ("cpu", "dlfpg", seed, g, 3.0, 5)]
    (r,) = _real_engine_rows("vllm", _frame(rows))
    # DLFP-G's P99 ITL changes: -0.9, -0.9, -0.9 (mean -0.9); DLFP's: -0.6, -0.75, -0.4 (mean -0.5833)
    assert r["value"] == pytest.approx(-0.9) and r["threshold"] == pytest.approx(-0.5833333)
    # P99 TTFT: DLFP-G -25 % against DLFP +50 %: reached
    assert r["reached"] is True and "P99 TTFT -25.0 % vs DLFP +50.0 %" in r["detail"]


def test_the_development_targets_use_the_same_frontier_and_slo_rules():
    rows = []
    for seed, shift in [(901, 0.0), (902, 0.001), (903, -0.001)]:
        rows += [("e", "baseline", seed, 0.2, 1.0, 5), ("e", "fixed-512", seed, 0.03, 4.0, 5),
                 ("e", "fixed-2048", seed, 0.05, 2.0, 5), ("e", "dlfpg", seed, 0.035 + shift, 3.0, 6)]
    df = _frame(rows)
    dt = dev_targets(df).set_index("target")
    # frontier at TTFT 3 s: halfway between (2 s, 50 ms) and (4 s, 30 ms) = 40 ms; DLFP-G 35 ms: gap -5 ms
    assert dt.loc["frontier", "value"] == pytest.approx(-0.005)
    assert bool(dt.loc["frontier", "reached"]) and dt.loc["frontier", "seeds"] == 3
    assert dt.loc["slo_passes", "value"] == 18 and dt.loc["slo_passes", "threshold"] == 15


@pytest.mark.parametrize("name", ["dlfpg_targets.md", "dlfpg_dev.md"])
def test_reproduce_carries_the_dlfpg_tables_verbatim(name):
    """REPRODUCE.md shows DLFP-G's tables as rendered, between markers: no number typed by hand."""
    assert quoted_block(name) == rendered(name)


def test_the_development_set_uses_other_seeds_and_other_trace_windows():
    from dlfp.config import load_experiment
    from dlfp.studies.controller_dev import DEV_SEEDS, dev_config, dev_experiments

    names = dev_experiments()
    assert "qwen3-8b-long-prompt" not in names and "cpu-tiny" not in names  # request lists, CPU: not in it
    assert {"qwen3-0.6b-tp1", "qwen3-8b-mooncake"} <= set(names)
    cfg = dev_config("qwen3-0.6b-tp1-mooncake")
    reported = load_experiment("qwen3-0.6b-tp1-mooncake").workload.trace.start_by_seed
    dev = cfg.workload.trace.start_by_seed
    assert cfg.seeds == list(DEV_SEEDS) and not set(DEV_SEEDS) & set(reported)
    # a window of 100 nonmatching requests spans a few hundred trace rows: the starts are 2,000 rows apart
    starts = sorted(list(dev.values()) + list(reported.values()))
    assert min(b - a for a, b in zip(starts, starts[1:])) >= 2000
    assert set(cfg.arms) == {"baseline", "dlfp", "dlfpg"} | {a for a in cfg.arms if a.startswith("fixed-")}


def test_a_malformed_development_table_is_one_line_naming_the_file(tmp_path):
    from dlfp.studies.controller_dev import read_dev

    for text in ("", "experiment,arm\nx,y\n"):
        (tmp_path / "dev.csv").write_text(text)
        with pytest.raises(ValueError, match=r"dev\.csv: not a development-set table"):
            read_dev(tmp_path / "dev.csv")
