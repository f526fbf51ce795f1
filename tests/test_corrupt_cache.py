"""A render checks the whole trace set first: a corrupt, partial, missing or mismatched trial stops it.

Works on a copy of committed traces (emu, qwen3-0.6b-tp1: baseline and dlfp x seeds 801-803) in a
temporary directory; the expected values are computed here from ``dlfp.analysis.metrics`` directly.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dlfp.analysis import metrics, tables
from dlfp.traces.format import load_trial, trial_dir

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "data" / "traces"
PUBLISHED = REPO / "data" / "paper" / "published.csv"
EXP = "qwen3-0.6b-tp1"
SEEDS = (801, 802, 803)

pytestmark = pytest.mark.skipif(not (SOURCE / "emu" / EXP).is_dir(), reason="committed emu traces are absent")


@pytest.fixture
def traces(tmp_path):
    root = tmp_path / "traces"
    for arm in ("baseline", "dlfp"):  # the two arms these checks are written for
        shutil.copytree(SOURCE / "emu" / EXP / arm, root / "emu" / EXP / arm,
                        ignore=shutil.ignore_patterns("*.ipynb", "*.md", "*.csv"))
    return root


@pytest.fixture
def results(tmp_path):
    """A results folder that already holds an earlier render (one file), to check it is left alone."""
    out = tmp_path / "results"
    out.mkdir()
    (out / "headline.csv").write_text("earlier render\n")
    return out


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _render(traces, results, **kw):
    return tables.render_tables(traces, results, PUBLISHED, fidelity_dir=traces / "no-fidelity", **kw)


def _edit_metadata(path: Path, edit) -> None:
    md = json.loads((path / "metadata.json").read_text())
    edit(md)
    (path / "metadata.json").write_text(json.dumps(md))


def test_complete_copy_renders_with_agreeing_claims(traces, results):
    out, names = _render(traces, results)
    assert out == results and "published_vs_reproduced" in names
    pvr = pd.read_csv(results / "published_vs_reproduced.csv", keep_default_na=False)
    assert "yes" in set(pvr["agrees"]) and "status" not in pvr.columns
    r = pvr[(pvr["metric"] == "requests_completed")].iloc[0]
    assert (r["reproduced"], r["agrees"]) == ("600", "yes")


def test_truncated_parquet_stops_the_render_and_writes_nothing(traces, results):
    bad = trial_dir(traces, "emu", EXP, "dlfp", 802) / "tokens.parquet"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    before = _snapshot(results)
    with pytest.raises(tables.PartialTraceSet) as e:
        _render(traces, results)
    msg = str(e.value)
    assert msg.startswith(f"{bad}: unreadable Parquet") and "\n" not in msg
    assert _snapshot(results) == before
    assert not (results.parent / "results-partial").exists()


def test_missing_seed_stops_the_render(traces, results):
    gone = trial_dir(traces, "emu", EXP, "baseline", 803)
    shutil.rmtree(gone)
    before = _snapshot(results)
    with pytest.raises(tables.PartialTraceSet, match=f"^{gone}: missing"):
        _render(traces, results)
    assert _snapshot(results) == before


def test_allow_partial_writes_elsewhere_marks_rows_and_judges_nothing(traces, results):
    bad = trial_dir(traces, "emu", EXP, "dlfp", 802) / "tokens.parquet"
    bad.write_bytes(bad.read_bytes()[:100])
    before = _snapshot(results)
    out, _ = _render(traces, results, allow_partial=True)
    assert out == results.parent / "results-partial" and _snapshot(results) == before
    head = pd.read_csv(out / "headline.csv", keep_default_na=False)
    assert list(head["status"]) == ["incomplete", "incomplete"]
    pvr = pd.read_csv(out / "published_vs_reproduced.csv", keep_default_na=False)
    traced = pvr[pvr["backend"] == "emu"]
    assert len(traced) and set(traced["status"]) == {"incomplete"}
    assert set(pvr["agrees"]) == {""} and set(pvr["within_interval"]) == {""}
    assert all(n.startswith("incomplete (") for n in traced["note"])
    lines = [ln for ln in (out / "published_vs_reproduced.md").read_text().splitlines() if ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    verdicts = {r[header.index("direction agrees")] for r in rows} | {r[header.index("magnitude agrees")]
                                                                      for r in rows}
    assert verdicts <= {"", "n/a"} and {r[header.index("status")] for r in rows} >= {"incomplete"}
    assert str(traces) not in (out / "published_vs_reproduced.md").read_text()
    r = traced[traced["metric"] == "requests_completed"].iloc[0]
    assert r["reproduced"] == "500"  # one dlfp trial is left out: 500 of the 600 offered
    problems = pd.read_csv(out / "problems.csv")
    assert list(problems["trial"]) == [f"emu/{EXP}/dlfp/seed-802"]


def test_pairs_must_share_a_workload(traces):
    cand = trial_dir(traces, "emu", EXP, "dlfp", 801)
    base = trial_dir(traces, "emu", EXP, "baseline", 801)
    _edit_metadata(cand, lambda md: md.update(workload_fingerprint="0" * 64))
    with pytest.raises(tables.PartialTraceSet) as e:
        tables.load_traces(traces)
    msg = str(e.value)
    assert msg.startswith(f"{cand} and {base}: different workloads") and "\n" not in msg


def _identity(threads: int) -> dict:
    from dlfp.hostinfo import host_key

    ident = {"cpu_model": "Intel(R) Xeon(R) Processor", "vector_flags": "avx2 avx512f", "mhz": None, "mhz_max": None,
             "logical_cpus": 2, "affinity": [0, 1],
             "env": {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "1" if threads == 1 else f"0-{threads - 1}"},
             "torch": {"num_threads": 2, "num_interop_threads": 2, "cpu_capability": "AVX512"}}
    return {"cpu": ident["cpu_model"], "cpus": 2, "identity": ident, "host_key": host_key(ident)}


def test_a_pair_recorded_on_two_hosts_is_refused_in_one_line_naming_both(traces):
    cand = trial_dir(traces, "emu", EXP, "dlfp", 801)
    base = trial_dir(traces, "emu", EXP, "baseline", 801)
    _edit_metadata(cand, lambda md: md["hardware"].update(host=_identity(1)))
    _edit_metadata(base, lambda md: md["hardware"].update(host=_identity(2)))
    with pytest.raises(tables.PartialTraceSet) as e:
        tables.load_traces(traces)
    msg = str(e.value)
    assert msg.startswith(f"{cand} and {base}: recorded on different hosts (Intel(R) Xeon(R) Processor x2, 1 engine "
                          "threads") and "2 engine threads" in msg and "\n" not in msg
    assert f"`dlfp run {EXP} --backend emu --force`" in msg


def test_a_pair_on_one_host_or_of_unknown_hosts_is_kept(traces):
    # the committed trials predate host identities (one CPU model and count: not refused); one known host pairs too
    assert len(tables.load_traces(traces).trials) == 6
    for arm in ("baseline", "dlfp"):
        _edit_metadata(trial_dir(traces, "emu", EXP, arm, 801), lambda md: md["hardware"].update(host=_identity(2)))
    assert len(tables.load_traces(traces).trials) == 6


def test_a_trial_of_other_settings_than_its_experiment_declares_is_refused(traces):
    import yaml

    declared = yaml.safe_load((REPO / "artifact" / "dlfp" / "experiments" / f"{EXP}.yaml").read_text())
    cand = trial_dir(traces, "emu", EXP, "dlfp", 801)
    _edit_metadata(cand, lambda md: md["config"].update(max_num_batched_tokens=2048))
    with pytest.raises(tables.PartialTraceSet) as e:
        tables.load_traces(traces)
    msg = str(e.value)
    assert msg.startswith(f"{cand}: its configuration is not the one {EXP} declares (first difference "
                          f"max_num_batched_tokens: 2048 vs {declared['max_num_batched_tokens']}, recorded vs "
                          f"experiments/{EXP}.yaml)") and "\n" not in msg


def test_documentation_fields_do_not_break_a_pair(traces):
    _edit_metadata(trial_dir(traces, "emu", EXP, "dlfp", 801),
                   lambda md: md["config"].update(description="reworded", assumptions=[]))
    assert len(tables.load_traces(traces).trials) == 6


def test_identical_workloads_give_no_interval(traces, tmp_path):
    for arm in ("baseline", "dlfp"):
        for seed in SEEDS:
            _edit_metadata(trial_dir(traces, "emu", EXP, arm, seed),
                           lambda md: md.update(workload_fingerprint="f" * 64))
    ts = tables.load_traces(traces)
    head = tables.headline(ts)
    r = head[head["arm"] == "dlfp"].iloc[0]
    assert r["identical_workloads"] == "801 802 803"
    assert np.isnan(r["p99_itl_change_pct_ci_low"]) and np.isnan(r["p99_itl_change_pct_ci_high"])
    # the mean is still the paired mean of the per-seed changes, computed here from the traces
    p99 = {(a, s): metrics.summarize(load_trial(trial_dir(traces, "emu", EXP, a, s)))["itl_p99_s"]
           for a in ("baseline", "dlfp") for s in SEEDS}
    want = np.mean([100 * (p99[("dlfp", s)] - p99[("baseline", s)]) / p99[("baseline", s)] for s in SEEDS])
    assert r["p99_itl_change_pct_mean"] == pytest.approx(want)
    md = tables.headline_markdown_frame(head)
    cell = md[md["arm"] == "dlfp"]["ΔP99 ITL % [95% CI]"].iloc[0]
    assert cell == f"{want:+.1f} (identical workloads: no CI)"
    assert "replayed identical workloads" in md[md["arm"] == "dlfp"]["notes"].iloc[0]
    pvr, _ = tables.published_vs_reproduced(ts, PUBLISHED)
    lo = pvr[(pvr["backend"] == "emu") & (pvr["metric"] == "p99_itl")
             & (pvr["arm_or_change"] == "change_ci95_low")].iloc[0]
    assert np.isnan(lo["reproduced"]) and lo["note"] == "identical workloads: no CI"
    pvr = pvr[pvr["backend"] == "emu"]
    verdict = pvr[pvr["metric"] == "verdict"]
    assert len(verdict) == 0 or (verdict["reproduced"].iloc[0] == "" and verdict["agrees"].iloc[0] is None)


def test_distinct_workloads_keep_their_interval(traces):
    head = tables.headline(tables.load_traces(traces))
    r = head[head["arm"] == "dlfp"].iloc[0]
    assert "identical_workloads" not in head.columns and np.isfinite(r["p99_itl_change_pct_ci_low"])


def test_token_agreement_is_by_construction_only_on_modelled_backends(traces, monkeypatch):
    from dataclasses import replace

    from dlfp.analysis.tables import published
    from dlfp.backends import get_backend

    ts = tables.load_traces(traces)
    pvr, _ = tables.published_vs_reproduced(ts, PUBLISHED)
    row = pvr[pvr["metric"] == "token_ids_agree"].iloc[0]
    assert get_backend("emu").modelled_outputs and row["agrees"] == "by construction"
    real = replace(get_backend("emu"), modelled_outputs=False)  # as if the real engine had produced the ids
    monkeypatch.setattr(published, "get_backend", lambda name: real)
    pvr, _ = tables.published_vs_reproduced(tables.load_traces(traces), PUBLISHED)
    row = pvr[pvr["metric"] == "token_ids_agree"].iloc[0]
    assert row["agrees"] is True and "by construction" not in row["note"]
