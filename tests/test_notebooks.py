"""The notebooks executed through papermill, with their tables checked against the traces.

Values are recomputed here straight from the Parquet files with pandas/numpy
(not through ``dlfp.analysis.metrics``). ``test_run_all_on_the_simulator`` needs the
simulator backend (``dlfp.backends.sim.runner``) and is skipped, saying so, only when
that module is absent.
"""
from __future__ import annotations

import json

import nbformat
import numpy as np
import pandas as pd
import pytest

from dlfp import pipeline
from dlfp.traces.format import Trial, find_trials, load_trial, trial_dir, write_trial
from dlfp.studies.validation_audit import audit_errors
from dlfp.config import load_experiment
from test_pipeline import EXP, TWO_ARMS, declare_experiment, write_fake_experiment

NOTEBOOKS = ("experiment", "figures", "controller")


def _read_seconds(path):
    """A trace Parquet file with its time columns in float seconds (stored as integers labelled "us" or "ns")."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    df = table.to_pandas()
    for f in table.schema:
        unit = (f.metadata or {}).get(b"unit")
        if unit is not None:
            df[f.name] = df[f.name].astype("float64") / {b"us": 1e6, b"ns": 1e9}[unit]
    return df


def _p99_itl_ms_and_ttft_ms(trial_path):
    """P99 ITL and P99 TTFT (ms) of a trial, from its Parquet files (numpy linear percentile)."""
    rq = _read_seconds(trial_path / "requests.parquet")
    tk = _read_seconds(trial_path / "tokens.parquet")
    ids = rq.loc[~rq["warmup"] & rq["finished"], "request_id"]
    tk = tk[tk["request_id"].isin(ids)].sort_values(["request_id", "index"])
    gaps = tk.groupby("request_id")["time_s"].diff().dropna().to_numpy()
    first = tk.groupby("request_id")["time_s"].min()
    ttft = first - rq.set_index("request_id").loc[first.index, "arrival_s"]
    return 1000 * np.percentile(gaps, 99), 1000 * np.percentile(ttft.to_numpy(), 99)


def _errors(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_sources_are_clean_and_parameterised(name):
    nb = nbformat.read(pipeline.notebooks_dir() / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "store without outputs"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    if name == "experiment":
        for p in ("experiment", "backend", "seeds", "out_dir", "overrides", "force"):
            assert f"\n{p} = " in "\n" + tagged[0].source


def test_figures_notebook_from_cached_traces(tmp_path):
    traces, results = tmp_path / "traces", tmp_path / "results"
    write_fake_experiment(traces, EXP)
    write_fake_experiment(traces, "qwen3-8b-r0.10", async_lag=True)
    bad = trial_dir(traces, "sim", "qwen3-8b-r0.10", "dlfp", 803)
    (bad / "metadata.json").write_text("{ truncated")
    # Section 7 data: an emu twin of the sim experiment whose tokens from index 2 on come 20 ms later.
    for path in find_trials(traces, backend="sim", experiment=EXP):
        t = load_trial(path)
        t.tokens.loc[t.tokens["index"] >= 2, "time_s"] += 0.020
        write_trial(Trial(t.requests, t.tokens, t.iterations, dict(t.metadata, backend="emu")), traces)
    # Section 9 data: validate-sim's error table (real = the sim trials, "sim" = their emu twins).
    real = {(p.parts[-2], int(p.parts[-1][5:])): load_trial(p)
            for p in find_trials(traces, backend="sim", experiment=EXP)}
    twin = {k: load_trial(trial_dir(traces, "emu", EXP, *k)) for k in real}
    (results / "fidelity").mkdir(parents=True)
    audit_errors(EXP, real, twin, {}).to_csv(results / "fidelity" / "audit_errors.csv", index=False)
    missing_pub = tmp_path / "no-published.csv"  # a missing published.csv is said in the table's place
    before = sorted(p.relative_to(results) for p in results.rglob("*"))
    with pytest.raises(pipeline.PipelineError, match="qwen3-8b-r0.10/dlfp/seed-803"):
        pipeline.render_figures(traces, results, published_csv=missing_pub)  # the corrupt trial stops the render
    assert sorted(p.relative_to(results) for p in results.rglob("*")) == before  # and nothing was written
    partial = tmp_path / "results-partial"  # an explicit partial render goes beside it
    (partial / "fidelity").mkdir(parents=True)
    (partial / "fidelity" / "audit_errors.csv").write_bytes((results / "fidelity" / "audit_errors.csv").read_bytes())
    results = partial
    nb = pipeline.render_figures(traces, tmp_path / "results", published_csv=missing_pub, allow_partial=True)
    assert nb == results / "figures.ipynb" and _errors(nb) == []
    pvr_md = (results / "published_vs_reproduced.md").read_text()
    assert "published numbers unavailable" in pvr_md and str(missing_pub) in pvr_md

    head = pd.read_csv(results / "headline_per_seed.csv")
    for path in find_trials(traces):
        if path == bad:
            continue
        backend, exp, arm, seed = path.parts[-4:]
        row = head[(head["backend"] == backend) & (head["experiment"] == exp) & (head["arm"] == arm)
                   & (head["seed"] == int(seed[5:]))]
        assert len(row) == 1
        itl, ttft = _p99_itl_ms_and_ttft_ms(path)
        assert row["p99_itl_ms"].iloc[0] == pytest.approx(itl, abs=5e-4)  # written with 3 decimals
        assert row["p99_ttft_ms"].iloc[0] == pytest.approx(ttft, abs=5e-4)
    # The corrupt trial is named, counted, and not used.
    assert not ((head["experiment"] == "qwen3-8b-r0.10") & (head["arm"] == "dlfp") & (head["seed"] == 803)).any()
    problems = (results / "problems.md").read_text()
    assert "sim/qwen3-8b-r0.10/dlfp/seed-803" in problems and "metadata.json" in problems
    summary = pd.read_csv(results / "headline.csv", dtype={"missing_seeds": str})
    r = summary[(summary["experiment"] == "qwen3-8b-r0.10") & (summary["arm"] == "dlfp")].iloc[0]
    assert r["problems"] == 1 and r["seeds"] == 2 and str(r["missing_seeds"]) == "803"
    for name in ("itl_cdf", "root_cause", "tradeoff", "frontier", f"cap_trajectory_sim_{EXP}",
                 "cap_trajectory_sim_qwen3-8b-r0.10"):
        assert (results / f"{name}.png").stat().st_size > 0 and (results / f"{name}.pdf").stat().st_size > 0
    for name in ("headline", "headline_per_seed", "root_cause", "arm_points", "problems"):
        assert (results / f"{name}.csv").exists() and (results / f"{name}.md").exists()

    # 7. sim vs emu, recomputed from the Parquet files.
    sve = pd.read_csv(results / "sim_vs_emu.csv")
    assert list(sve["arm"]) == ["baseline", "dlfp"] and list(sve["seeds"]) == [3, 3]
    for _, r in sve.iterrows():
        sim = np.mean([_p99_itl_ms_and_ttft_ms(trial_dir(traces, "sim", EXP, r["arm"], s))[0] for s in (801, 802, 803)])
        emu = np.mean([_p99_itl_ms_and_ttft_ms(trial_dir(traces, "emu", EXP, r["arm"], s))[0] for s in (801, 802, 803)])
        assert r["p99_itl_ms_sim"] == pytest.approx(sim, abs=5e-4)
        assert r["p99_itl_ms_emu"] == pytest.approx(emu, abs=5e-4)
        assert r["p99_itl_rel_diff_pct"] == pytest.approx(100 * (sim / emu - 1), abs=0.005)
        assert pd.isna(r["p99_itl_within_10pct"])  # a partial render judges nothing
    # 8. no trial has the dlfps arm: said in the tables' place.
    assert "NO DATA" in (results / "dlfps_targets.md").read_text()
    assert "NO DATA" in (results / "dlfps_ablation.md").read_text()
    # 9. the fidelity table is read from validate-sim's CSV; the missing figures are named in their place.
    fid = pd.read_csv(results / "fidelity_errors.csv")
    r = fid[(fid["arm"] == "baseline") & (fid["metric"] == "itl_p99")].iloc[0]
    real_ms = np.mean([_p99_itl_ms_and_ttft_ms(trial_dir(traces, "sim", EXP, "baseline", s))[0]
                       for s in (801, 802, 803)])
    assert r["real_ms"] == pytest.approx(real_ms, abs=5e-4)
    assert r["error_pct"] == pytest.approx(100 * 20 / real_ms, abs=0.005)
    text = json.dumps([c.get("outputs") for c in nbformat.read(nb, as_version=4).cells])
    assert "NO DATA: ITL CDFs: real engine vs simulator not found" in text
    assert "NO DATA: calibration residuals not found" in text

    # Byte-for-byte reproduction of the committed tables is checked in test_results_regression.py.


def test_run_all_on_the_simulator(tmp_path, monkeypatch):
    monkeypatch.setenv("DLFP_CACHE_DIR", str(tmp_path / "cache"))  # this machine's verification record stays apart
    pytest.importorskip("dlfp.backends.sim.runner",
                        reason="simulator backend dlfp.backends.sim.runner is not installed yet")
    traces, results = tmp_path / "traces", tmp_path / "results"
    small = {"workload.num_requests": 5, "backend_options.frontier_caps": [1024], "arms": TWO_ARMS}
    declare_experiment(load_experiment(EXP, small))  # the experiment as this test declares it (kernels see it too)
    res = pipeline.run_all(backend="sim", experiments=[EXP], seeds=[801], traces_dir=traces, results_dir=results)
    exp_nb = traces / "sim" / EXP / "experiment.ipynb"
    assert res["notebooks"] == [exp_nb] and _errors(exp_nb) == []
    nb = nbformat.read(exp_nb, as_version=4)
    params = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert params and "seeds = [801]" in params[0].source
    dirs = find_trials(traces)
    assert [d.relative_to(traces).as_posix() for d in dirs] == [f"sim/{EXP}/baseline/seed-801",
                                                                f"sim/{EXP}/dlfp/seed-801",
                                                                f"sim/{EXP}/fixed-1024/seed-801"]
    md = json.loads((dirs[0] / "metadata.json").read_text())
    assert md["config"]["workload"]["num_requests"] == 5
    # The experiment notebook's own table (beside the traces) and the figures notebook's agree with the traces.
    # one seed of three: the figures notebook renders what exists into <results>-partial
    partial_head = tmp_path / "results-partial" / "headline_per_seed.csv"
    for table in (traces / "sim" / EXP / "headline_per_seed.csv", partial_head):
        head = pd.read_csv(table)
        assert list(head["arm"]) == ["baseline", "dlfp", "fixed-1024"]
        for d in dirs:
            itl, ttft = _p99_itl_ms_and_ttft_ms(d)
            row = head[head["arm"] == d.parts[-2]].iloc[0]
            assert row["measured"] == 5
            assert row["p99_itl_ms"] == pytest.approx(itl, abs=5e-4)
            assert row["p99_ttft_ms"] == pytest.approx(ttft, abs=5e-4)
        b, c = head.iloc[0], head.iloc[1]
        assert c["p99_itl_change_pct"] == pytest.approx(100 * (c["p99_itl_ms"] - b["p99_itl_ms"]) / b["p99_itl_ms"],
                                                        abs=0.01)
    partial = tmp_path / "results-partial"
    assert res["figures_notebook"] == partial / "figures.ipynb" and _errors(partial / "figures.ipynb") == []
    if pipeline.default_published_csv().exists():  # the real published numbers, joined with this experiment
        pvr = pd.read_csv(partial / "published_vs_reproduced.csv", keep_default_na=False)
        sim_rows = pvr[pvr["backend"] == "sim"]
        assert set(sim_rows["experiment"]) == {EXP}
        r = sim_rows[(sim_rows["metric"] == "p99_itl") & (sim_rows["arm_or_change"] == "change_seed_801")].iloc[0]
        h = pd.read_csv(partial / "headline_per_seed.csv")
        assert float(r["reproduced"]) == pytest.approx(h.loc[h["arm"] == "dlfp", "p99_itl_change_pct"].iloc[0],
                                                       abs=0.01)
    pts = pd.read_csv(partial / "arm_points.csv")
    assert list(pts["arm"]) == ["baseline", "dlfp", "fixed-1024"]
    assert (partial / "frontier.png").exists() and not results.exists()

    # Resume/skip is tested in-process in test_pipeline.py (no second kernel here).


def test_controller_notebook_runs_on_cached_traces(tmp_path):
    traces = tmp_path / "traces"
    write_fake_experiment(traces, EXP, seeds=(801,))
    out = tmp_path / "controller.ipynb"
    pipeline.execute_notebook(pipeline.notebooks_dir() / "controller.ipynb", out,
                              dict(traces_dir=str(traces), backend="sim", experiment=EXP, arm="dlfp", seed=801),
                              progress_env=False)
    assert _errors(out) == []
    text = json.dumps([c.get("outputs") for c in nbformat.read(out, as_version=4).cells])
    assert "1 trial(s) of qwen3-0.6b-tp1/dlfp/seed 801" in text
    # The control law cell: 80 ms observed at cap 3072 keeps 3072; 160 ms halves it (to the 128 quantum).
    assert "'80 ms': 3072" in text and "'160 ms': 1536" in text


def test_failed_notebook_is_kept_and_named(tmp_path):
    with pytest.raises(pipeline.PipelineError, match="failed.ipynb"):
        pipeline.execute_notebook(pipeline.notebooks_dir() / "controller.ipynb", tmp_path / "c.ipynb",
                                  dict(traces_dir=str(tmp_path / "missing")), progress_env=False)
    assert (tmp_path / "c.failed.ipynb").exists() and not (tmp_path / "c.ipynb").exists()


def test_a_successful_notebook_prints_no_kernel_warning(tmp_path, capfd):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"}})
    nb.cells = [nbformat.v4.new_code_cell("x = 7", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("6 * x")]
    src = tmp_path / "tiny.ipynb"
    nbformat.write(nb, str(src))
    out = pipeline.execute_notebook(src, tmp_path / "out" / "tiny.ipynb", {"x": 5})
    cells = nbformat.read(out, as_version=4).cells
    assert cells[-1].outputs[0]["data"]["text/plain"] == "30"  # 6 * 5: the injected parameter was used
    err = capfd.readouterr().err
    assert "IPKernelApp" not in err and "WARNING" not in err and "KeyboardInterrupt" not in err, err


def test_stream_outputs_split_by_timing_are_joined():
    """The kernel may send one cell's printing as one stream message or several (timing); the cleaned copy is
    the same either way: consecutive stream outputs of one name are joined, other outputs stay in place."""
    import nbformat

    from dlfp.pipeline.notebooks import coalesce_streams

    new = nbformat.v4.new_output
    one = [new("stream", name="stdout", text="tables in x:\n  a.csv\n  b.csv\n")]
    split = [new("stream", name="stdout", text="tables in x:"), new("stream", name="stdout", text="\n  a.csv\n"),
             new("stream", name="stdout", text="  b.csv\n")]
    assert coalesce_streams(split) == coalesce_streams(one) == one
    mixed = [new("stream", name="stdout", text="a"), new("stream", name="stderr", text="w"),
             new("stream", name="stdout", text="b"), new("display_data", data={"text/plain": "x"}),
             new("stream", name="stdout", text="c"), new("stream", name="stdout", text="d")]
    got = coalesce_streams(mixed)
    assert [(o.output_type, o.get("name"), "".join(o.get("text", ""))) for o in got] == [
        ("stream", "stdout", "a"), ("stream", "stderr", "w"), ("stream", "stdout", "b"), ("display_data", None, ""),
        ("stream", "stdout", "cd")]
