"""Sensitivity sweep (dlfp.studies.sensitivity, `dlfp sensitivity`): plan, table arithmetic, and a tiny real sweep."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dlfp.studies import sensitivity as sens
from dlfp.cli import main as cli_main
from dlfp.config import ExperimentConfig, load_experiment
from dlfp.analysis.metrics import summarize
from dlfp.backends import run_trial
from dlfp.devices.host import HostCosts

T_975_DF2 = 4.302652729749464  # Student-t 0.975 quantile, 2 degrees of freedom (statistical tables)


def _small_config(sensitivity: dict, num_requests: int = 5) -> ExperimentConfig:
    """A hand-made small experiment: 0.6B on one A100, three arms, a hand-written sensitivity block."""
    d = load_experiment("qwen3-0.6b-tp1").model_dump()
    d["name"] = "tiny-sens"
    d["workload"]["num_requests"] = num_requests
    d["workload"]["num_warmup"] = 1
    d["slo"] = {"ttft_s": 2.0, "itl_s": 0.1, "itl_quantile": 0.99}
    d["arms"] = {
        "baseline": {"policy": "nocap", "signal": "host_cadence"},
        "dlfp": d["arms"]["dlfp"],
        "dlfps": {"policy": "dlfps", "signal": "device_completion", "options": {"ttft_slo_s": 2.0}},
    }
    d["backend_options"] = {"sensitivity": sensitivity}
    return ExperimentConfig.model_validate(d)


# ----------------------------------------------------------------------------------------------- plan


def test_plan_overrides_and_trial_counts():
    cfg = _small_config({
        "max_num_batched_tokens": [2048, 8192],
        "workload.num_warmup": [0, 1],
        "slo": [{"ttft_s": 1.0, "itl_s": 0.05, "itl_quantile": 0.99},
                {"ttft_s": 2.0, "itl_s": 0.1, "itl_quantile": 0.99},
                {"ttft_s": 2.0, "itl_s": 0.1}],  # the last: itl_quantile defaults to 1.0 (worst gap), not the default
    })
    plan = sens.build_plan([cfg], seeds=(801, 802), host_scales=(1, 3), measured_host={"schedule_base_s": 1e-3})
    got = [(v.field, v.label, v.is_default) for v in plan.variants]
    assert got == [
        ("max_num_batched_tokens", "2048", False), ("max_num_batched_tokens", "8192", True),
        ("workload.num_warmup", "0", False), ("workload.num_warmup", "1", True),
        ("slo", "TTFT<=1s ITL<=50ms (q0.99)", False), ("slo", "TTFT<=2s ITL<=100ms (q0.99)", True),
        ("slo", "TTFT<=2s ITL<=100ms (q1)", False),
        ("host_costs", "x1", True), ("host_costs", "x3", False), ("host_costs", "measured (cpu profile)", False),
    ]
    v = plan.variants
    assert v[0].overrides == {"max_num_batched_tokens": 2048}
    assert v[2].overrides == {"workload.num_warmup": 0}
    assert all(x.overrides == {} for x in v if x.is_default)
    # the tight SLO moves DLFP-S's TTFT guard with it (ttft_slo_s = slo.ttft_s), not the other arms
    assert v[4].overrides["arms.dlfps.options"] == {"ttft_slo_s": 1.0}
    assert not any(k.startswith("arms.dlfp.") or k.startswith("arms.baseline") for k in v[4].overrides)
    # host x3: every time cost x3 (defaults from HostCosts), token threshold unchanged
    d = HostCosts()
    h3 = v[8].overrides["backend_options.sim"]["host"]
    assert h3["schedule_base_s"] == pytest.approx(3 * d.schedule_base_s)
    assert h3["ingest_s"] == pytest.approx(3 * d.ingest_s)
    assert h3["cudagraph_max_tokens"] == d.cudagraph_max_tokens == 512
    # measured: the measured field replaced, unmeasured ones keep the model's value
    hm = v[9].overrides["backend_options.sim"]["host"]
    assert hm["schedule_base_s"] == 1e-3 and hm["prep_base_s"] == d.prep_base_s
    # 10 variants x 3 arms x 2 seeds cells; distinct runs: 5 distinct configs (default, 2048, warm-up 0, x3,
    # measured) x 3 arms x 2 seeds, plus DLFP-S under the tight SLO (2 seeds) = 32; the q1 SLO shares every run
    # (same TTFT limit, so DLFP-S is unchanged) and is only summarised differently
    assert plan.arms == {"tiny-sens": ["baseline", "dlfp", "dlfps"]}
    assert plan.num_cells == 10 * 3 * 2
    assert plan.num_trials == 5 * 3 * 2 + 2
    # the baseline under the tight SLO reuses the default run, summarised under every SLO variant
    key, slo = plan.cells[(4, "baseline", 801)]
    assert key == plan.cells[(1, "baseline", 801)][0]
    assert json.loads(slo)["ttft_s"] == 1.0 and len(plan.tasks[key].slos) == 3  # default, tight, q1
    assert plan.cells[(4, "dlfps", 801)][0] != plan.cells[(1, "dlfps", 801)][0]
    assert plan.cells[(6, "dlfps", 801)][0] == plan.cells[(1, "dlfps", 801)][0]
    assert len(plan.tasks[plan.cells[(1, "dlfp", 802)][0]].slos) == 3


def test_plan_rejects_unknown_field_and_missing_candidates():
    with pytest.raises(sens.SensitivityError, match="workload.no_such_field"):
        sens.build_plan([_small_config({"workload.no_such_field": [1]})], host=False)
    cfg = _small_config({"max_num_batched_tokens": [2048]})
    with pytest.raises(sens.SensitivityError, match="candidate arms"):
        sens.build_plan([cfg], candidate_arms=("nope",), host=False)


# ----------------------------------------------------------------------------------------------- table


def _hand_trials() -> pd.DataFrame:
    rows = []

    def add(value, is_default, arm, itl, ttft, passes, stall=(0.0, 0.01, 0.05)):
        for seed, i, t, p, st in zip((1, 2, 3), itl, ttft, passes, stall):
            rows.append(dict(experiment="e", field="f", value=value, is_default=is_default, arm=arm, seed=seed,
                             measured=10, completed=10, itl_p50_s=i / 10 * seed, itl_p99_s=i, stall_frac=st,
                             ttft_p99_s=t, e2el_p99_s=1.0, slo_passes=p))

    add("a", True, "baseline", [0.100, 0.200, 0.050], [1.0, 2.0, 4.0], [10, 9, 8])
    add("a", True, "dlfp", [0.080, 0.150, 0.060], [1.5, 2.0, 3.0], [10, 7, 8], stall=(0.1, 0.2, 0.3))
    add("b", False, "baseline", [0.100, 0.100, 0.100], [1.0, 1.0, 1.0], [5, 5, 5])
    add("b", False, "dlfp", [0.110, 0.111, 0.112], [1.0, 1.0, 1.0], [5, 5, 5])
    return pd.DataFrame(rows, columns=list(sens.TRIAL_COLUMNS))


def test_table_changes_hand_computed():
    t = sens.build_table(_hand_trials(), {"e": "decrease"})
    assert list(t.columns) == list(sens.TABLE_COLUMNS)
    assert list(zip(t["value"], t["arm"])) == [("a", "dlfp"), ("b", "dlfp")]
    a, b = t.iloc[0], t.iloc[1]
    # value a: per-seed P99 ITL changes 100*(cand-base)/base = -20, -25, +20 -> mean -25/3
    ch = np.array([-20.0, -25.0, 20.0])
    half = T_975_DF2 * math.sqrt(((ch - ch.mean()) ** 2).sum() / 2) / math.sqrt(3)
    assert a["p99_itl_change_pct"] == pytest.approx(-25 / 3)
    assert a["p99_itl_ci_low_pct"] == pytest.approx(-25 / 3 - half)
    assert a["p99_itl_ci_high_pct"] == pytest.approx(-25 / 3 + half)
    assert not a["p99_itl_ci_excludes_zero"] and a["p99_itl_seeds_lower"] == 2
    assert a["baseline_p99_itl_ms"] == pytest.approx(1e3 * 0.35 / 3)
    assert a["arm_p99_itl_ms"] == pytest.approx(1e3 * 0.29 / 3)
    # P50 ITL 10, 40, 15 ms -> 65/3 ms; stalls 0, 1, 5 % -> 2 %; arm 10, 20, 30 % -> 20 %
    assert a["baseline_p50_itl_ms"] == pytest.approx(65 / 3)
    assert a["baseline_stall_pct"] == pytest.approx(2.0) and a["arm_stall_pct"] == pytest.approx(20.0)
    # P99 TTFT: +50, 0, -25 -> +25/3; SLO passes: 0, -2, 0 -> -2/3
    assert a["p99_ttft_change_pct"] == pytest.approx(25 / 3)
    assert a["baseline_slo_passes"] == pytest.approx(9.0) and a["arm_slo_passes"] == pytest.approx(25 / 3)
    assert a["slo_passes_change"] == pytest.approx(-2 / 3)
    assert a["is_default"] and a["n_seeds"] == 3
    assert a["sign_agrees"] == "yes" and a["paper_p99_itl_direction"] == "decrease"
    # value b: +10, +11, +12 -> +11 with CI 11 +- t*1/sqrt(3) = [8.52, 13.48], excludes zero; opposite to the paper
    assert b["p99_itl_change_pct"] == pytest.approx(11.0)
    assert b["p99_itl_ci_low_pct"] == pytest.approx(11 - T_975_DF2 / math.sqrt(3))
    assert b["p99_itl_ci_high_pct"] == pytest.approx(11 + T_975_DF2 / math.sqrt(3))
    assert b["p99_itl_ci_excludes_zero"] and b["sign_agrees"] == "no"
    # the flip finder returns b, whose sign differs from the default row a
    assert list(sens.flips(t)["value"]) == ["b"]
    md = sens.sweep_markdown(t, command="dlfp sensitivity --experiments e", seeds=(1, 2, 3))
    assert "`dlfp sensitivity --experiments e`" in md and "no traces are cached" in md
    assert "| e | f | a * | dlfp | 21.67 | 2.00 / 20.00 | 116.7 | 96.7 | -8.3 [" in md
    assert "\n|---|---|---|---|---:|---|---:|---:|---|---|---:|---|---|---|\n" in md
    assert b["p99_itl_seeds_lower"] == 0
    # no paper direction -> sign_agrees blank
    assert set(sens.build_table(_hand_trials())["sign_agrees"]) == {""}


def test_stall_sign_table_counts_distinct_runs():
    tr = _hand_trials()
    # baseline stalls per seed: 0 %, 1 %, 5 % (seeds 1, 2, 3). value a (default): changes -20, -25, +20;
    # value b: +10, +11, +12. An SLO variant repeating a's runs must not be counted.
    # Hand count: seed 1 (stalls 0 %): a -20 lower, b +10 higher; seed 2 (1 %, counts as >= 1 %): a -25 lower,
    # b +11 higher; seed 3 (5 %): a +20 higher, b +12 higher.
    slo = tr[tr["value"] == "a"].assign(field="slo", value="tight", is_default=False)
    got = sens.stall_sign_table(pd.concat([tr, slo], ignore_index=True))
    assert got.to_dict("records") == [
        {"baseline_stalls": "< 1 %", "lower": 1, "unchanged": 0, "higher": 1},
        {"baseline_stalls": ">= 1 %", "lower": 1, "unchanged": 0, "higher": 3},
    ]


def test_single_seed_has_no_interval():
    tr = _hand_trials()
    t = sens.build_table(tr[tr["seed"] == 2], {"e": "increase"})
    a = t.iloc[0]
    assert a["p99_itl_change_pct"] == pytest.approx(-25.0) and a["n_seeds"] == 1
    assert math.isnan(a["p99_itl_ci_low_pct"]) and not a["p99_itl_ci_excludes_zero"]
    assert a["sign_agrees"] == "no"


def test_paper_directions_from_published_rows():
    pub = pd.DataFrame({
        "experiment": ["x", "x", "y", "z", "z", "w"],
        "metric": ["p99_itl", "p99_itl", "p99_itl", "p99_itl", "p99_itl", "p99_ttft"],
        "direction": ["decrease", "decrease", "increase", "increase", "decrease", "increase"],
    })
    assert sens.paper_directions(pub) == {"x": "decrease", "y": "increase"}


def test_shipped_published_directions():
    d = sens.paper_directions(Path(__file__).parents[1] / "data" / "paper" / "published.csv")
    # the paper: 0.6B TP1 and TP2 and 8B at 0.25 req/s lower P99 ITL; 8B at 0.10 and 32B TP2 raise it
    assert d["qwen3-0.6b-tp1"] == "decrease" and d["qwen3-0.6b-tp2"] == "decrease"
    assert d["qwen3-8b-r0.25"] == "decrease"
    assert d["qwen3-8b-r0.10"] == "increase" and d["qwen3-32b-tp2"] == "increase"


# ----------------------------------------------------------------------------------------------- tiny real sweep


def _measured_tokens_by_request(cfg, seed):
    """The baseline trial's measured requests' token times, grouped by request (inter-token gaps computed here,
    independently of dlfp.analysis.metrics)."""
    trial = run_trial(cfg, "baseline", seed, backend="sim")
    req = trial.requests
    measured = set(req.loc[~req["warmup"].astype(bool), "request_id"])
    tk = trial.tokens[trial.tokens["request_id"].isin(measured)].sort_values(["request_id", "time_s"])
    return tk.groupby("request_id")


def test_tiny_real_sweep_matches_independent_trials(tmp_path):
    """Two token budgets, one seed, five requests, through the CLI; every row recomputed from run_trial."""
    cfg = _small_config({"max_num_batched_tokens": [2048, 8192]})
    d = cfg.model_dump()
    d["arms"] = {k: d["arms"][k] for k in ("baseline", "dlfp")}
    import yaml

    path = tmp_path / "tiny-sens.yaml"
    path.write_text(yaml.safe_dump(d))
    out = tmp_path / "out"
    rc = cli_main(["sensitivity", "--experiments", str(path), "--seeds", "801", "--host-scales", "1",
                   "--no-measured", "--jobs", "1", "--out", str(out)])
    assert rc == 0
    table = pd.read_csv(out / "sensitivity.csv", keep_default_na=False)
    assert list(table["field"]) == ["max_num_batched_tokens", "max_num_batched_tokens", "host_costs"]
    assert list(table["value"].astype(str)) == ["2048", "8192", "x1"]
    for _, row in table.iterrows():
        budget = 2048 if str(row["value"]) == "2048" else 8192
        c = load_experiment(path).with_overrides({"max_num_batched_tokens": budget})
        b = summarize(run_trial(c, "baseline", 801, backend="sim"))
        x = summarize(run_trial(c, "dlfp", 801, backend="sim"))
        assert row["baseline_p99_itl_ms"] == pytest.approx(1e3 * b["itl_p99_s"], rel=1e-5)
        assert row["arm_p99_itl_ms"] == pytest.approx(1e3 * x["itl_p99_s"], rel=1e-5)
        assert row["baseline_p50_itl_ms"] == pytest.approx(1e3 * b["itl_p50_s"], rel=1e-5)
        gaps = np.sort(np.concatenate([np.diff(g["time_s"].to_numpy()) for _, g in
                                       _measured_tokens_by_request(c, 801)]))
        stall = 100 * np.mean(gaps > sens.STALL_FACTOR * np.median(gaps))
        assert row["baseline_stall_pct"] == pytest.approx(stall, rel=1e-5, abs=1e-9)
        want = 100 * (x["itl_p99_s"] - b["itl_p99_s"]) / b["itl_p99_s"]
        assert row["p99_itl_change_pct"] == pytest.approx(want, rel=1e-5, abs=1e-9)
        want_ttft = 100 * (x["ttft_p99_s"] - b["ttft_p99_s"]) / b["ttft_p99_s"]
        assert row["p99_ttft_change_pct"] == pytest.approx(want_ttft, rel=1e-5, abs=1e-9)
        assert row["slo_passes_change"] == x["slo_passes"] - b["slo_passes"]
        assert row["n_seeds"] == 1 and str(row["sign_agrees"]) == ""  # tiny-sens has no published row
    trials = pd.read_csv(out / "sensitivity_trials.csv")
    assert len(trials) == 3 * 2 and set(trials["measured"]) == {5}
    md = (out / "sensitivity.md").read_text()
    assert f"--experiments {path}" in md
    # deterministic: a second run writes identical bytes
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert cli_main(["sensitivity", "--experiments", str(path), "--seeds", "801", "--host-scales", "1",
                     "--no-measured", "--jobs", "1", "--out", str(out)]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
