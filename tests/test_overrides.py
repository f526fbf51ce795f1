"""Trials run with ``--set`` overrides are their own experiment ``<name>+<8 hex>``, never the shipped one."""
from __future__ import annotations

import hashlib
import json

import pytest

from dlfp import pipeline
from dlfp.analysis import tables
from dlfp.cli import main
from dlfp.config import ConfigError, load_experiment
from dlfp.traces.format import find_trials, load_trial, trial_dir
from test_pipeline import EXP, SMALL, declare_experiment, install_fake_backend, write_fake_experiment


def _expected_id(name: str, overrides: dict) -> str:
    blob = json.dumps(overrides, sort_keys=True, separators=(",", ":"))
    return f"{name}+{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


def test_derived_id_is_a_hash_of_the_sorted_overrides():
    a = {"workload.num_requests": 5, "arms": {"b": {"policy": "nocap"}}}
    b = {"arms": {"b": {"policy": "nocap"}}, "workload.num_requests": 5}
    assert pipeline.derived_experiment(EXP, a) == pipeline.derived_experiment(EXP, b) == _expected_id(EXP, a)
    assert pipeline.derived_experiment(EXP, {"workload.num_requests": 6}) != _expected_id(EXP, a)


def test_overrides_never_replace_the_canonical_trials(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(pipeline.ROOT_ENV, str(tmp_path))
    root = tmp_path / "data" / "traces"
    write_fake_experiment(root, EXP, seeds=(801,))
    shipped = trial_dir(root, "sim", EXP, "baseline", 801)
    before = {p.name: p.read_bytes() for p in shipped.iterdir()}
    install_fake_backend(monkeypatch)
    over = {**SMALL, "workload.num_requests": 5}
    run = pipeline.run_experiment(EXP, seeds=[801], arms=["baseline"], overrides=over, progress=False)
    derived = _expected_id(EXP, over)
    assert run.config.name == derived and [o.status for o in run.outcomes] == ["ran"]
    assert {p.name: p.read_bytes() for p in shipped.iterdir()} == before  # untouched
    t = load_trial(trial_dir(root, "sim", derived, "baseline", 801))
    assert t.metadata["experiment"] == derived and t.metadata["config"]["name"] == derived
    assert t.measured_requests.shape[0] == 5
    err = capsys.readouterr().err
    assert f"experiment {derived}, in data/traces/sim/{derived}" in err
    # A render of the shipped matrix leaves the derived experiment out; asked for by name, it is its own group,
    # never paired with the canonical one.
    ts = tables.load_traces(root, allow_partial=True)  # one seed of three: not a complete set
    assert sorted(ts.groups()) == [("sim", EXP)]
    ts = tables.load_traces(root, experiments=[EXP, derived], allow_partial=True)
    assert sorted(ts.groups()) == [("sim", EXP), ("sim", derived)]


def test_explicit_out_gets_the_derived_name_too(tmp_path, monkeypatch):
    install_fake_backend(monkeypatch)
    run = pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[801], overrides=SMALL, progress=False)
    derived = _expected_id(EXP, SMALL)
    assert run.config.name == derived
    assert [p.relative_to(tmp_path).as_posix() for p in find_trials(tmp_path)] == [
        f"sim/{derived}/baseline/seed-801", f"sim/{derived}/dlfp/seed-801"]


def test_cli_prints_where_the_derived_trials_went(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(pipeline.ROOT_ENV, str(tmp_path))
    install_fake_backend(monkeypatch)
    args = ["run", EXP, "--arms", "baseline", "--seeds", "801", "--no-progress",
            "--set", "workload.num_requests=5", "--set", "backend_options.frontier_caps=[]"]
    assert main(args) == 0
    derived = _expected_id(EXP, {"workload.num_requests": 5, "backend_options.frontier_caps": []})
    out = capsys.readouterr().out
    assert f"traces: data/traces/sim/{derived}" in out
    assert not (tmp_path / "data" / "traces" / "sim" / EXP).exists()


# ------------------------------------------------------------- every route: --set never writes into a shipped folder


def _snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _shipped_root(tmp_path):
    """A traces root holding one shipped-style trial pair of ``EXP`` (its bytes to compare afterwards)."""
    root = tmp_path / "traces"
    write_fake_experiment(root, EXP, seeds=(801,))
    return root, _snapshot(root / "sim" / EXP)


def test_run_with_set_and_out_into_the_shipped_root_goes_to_the_derived_id(tmp_path, monkeypatch, capsys):
    root, before = _shipped_root(tmp_path)
    install_fake_backend(monkeypatch)
    assert main(["run", EXP, "--out", str(root), "--seeds", "801", "--no-progress",
                 "--set", "workload.num_requests=5"]) == 0
    derived = _expected_id(EXP, {"workload.num_requests": 5})
    assert _snapshot(root / "sim" / EXP) == before
    assert [p.relative_to(root).as_posix() for p in find_trials(root, experiment=derived)] == [
        f"sim/{derived}/baseline/seed-801", f"sim/{derived}/dlfp/seed-801"]
    assert load_trial(trial_dir(root, "sim", derived, "dlfp", 801)).measured_requests.shape[0] == 5
    assert f"traces: {root / 'sim' / derived}" in capsys.readouterr().out


def test_run_all_with_set_and_traces_into_the_shipped_root_goes_to_the_derived_id(tmp_path):
    root, before = _shipped_root(tmp_path)
    assert main(["run-all", "--backend", "sim", "--experiments", EXP, "--seeds", "801", "--traces", str(root),
                 "--no-figures", "--no-progress", "--set", "workload.num_requests=3"]) == 0
    derived = _expected_id(EXP, {"workload.num_requests": 3})
    assert _snapshot(root / "sim" / EXP) == before
    assert {p.parts[-2] for p in find_trials(root, experiment=derived)} == {"baseline", "dlfp"}
    assert (root / "sim" / derived / "experiment.ipynb").is_file()
    assert load_trial(trial_dir(root, "sim", derived, "baseline", 801)).measured_requests.shape[0] == 3


def test_papermill_with_overrides_and_out_dir_into_the_shipped_root_goes_to_the_derived_id(tmp_path):
    import papermill as pm

    root, before = _shipped_root(tmp_path)
    out = tmp_path / "o.ipynb"
    pm.execute_notebook(str(pipeline.notebooks_dir() / "experiment.ipynb"), str(out), kernel_name="python3",
                        parameters=dict(experiment=EXP, backend="sim", seeds=[801], out_dir=str(root),
                                        overrides={"workload.num_requests": 3}), progress_bar=False)
    derived = _expected_id(EXP, {"workload.num_requests": 3})
    assert _snapshot(root / "sim" / EXP) == before  # neither trials nor the headline tables beside them
    assert {p.parts[-2] for p in find_trials(root, experiment=derived)} == {"baseline", "dlfp"}
    assert (root / "sim" / derived / "headline.csv").is_file()


# ------------------------------------------------------------- a render reads only what each experiment declares


def test_a_whole_experiment_run_with_other_settings_is_refused_naming_the_field(tmp_path, capsys):
    root = tmp_path / "traces"
    write_fake_experiment(root, EXP)  # a complete experiment, every trial alike, at 4 measured requests
    declare_experiment(load_experiment(EXP, {**SMALL, "workload.num_requests": 5}))  # the experiment says 5
    with pytest.raises(tables.PartialTraceSet) as e:
        tables.load_traces(root)
    first = trial_dir(root, "sim", EXP, "baseline", 801)
    assert str(e.value).startswith(f"{first}: its configuration is not the one {EXP} declares (first difference "
                                   f"workload.num_requests: 4 vs 5, recorded vs ")
    assert "(and 5 more problem(s))" in str(e.value) and "\n" not in str(e.value)
    assert main(["figures", "--traces", str(root), "--out", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{first}: its configuration is not the one {EXP} declares" in err[0]
    assert "workload.num_requests: 4 vs 5" in err[0] and not (tmp_path / "results" / "headline.csv").exists()


def test_trials_of_one_derived_experiment_must_share_one_configuration(tmp_path, monkeypatch):
    install_fake_backend(monkeypatch)
    run = pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[801, 802], overrides=SMALL, progress=False)
    odd = trial_dir(tmp_path, "sim", run.config.name, "dlfp", 802)
    md = json.loads((odd / "metadata.json").read_text())
    md["config"]["workload"]["num_requests"] = 9
    (odd / "metadata.json").write_text(json.dumps(md))
    with pytest.raises(tables.PartialTraceSet) as e:
        tables.load_traces(tmp_path, experiments=[run.config.name], allow_partial=False)
    assert str(e.value).startswith(f"{odd}: its configuration differs from that of ")
    assert "first difference workload.num_requests: 9 vs 4" in str(e.value)


def test_quick_runs_never_go_into_the_shipped_root(tmp_path, monkeypatch):
    monkeypatch.setenv(pipeline.ROOT_ENV, str(tmp_path))
    install_fake_backend(monkeypatch)
    with pytest.raises(pipeline.PipelineError) as e:
        pipeline.run_experiment(EXP, out_dir=tmp_path / "data" / "traces", quick=True, progress=False)
    assert str(e.value).startswith("--quick trials do not go into the shipped traces data/traces")
    assert not (tmp_path / "data" / "traces").exists()


def test_a_yaml_naming_a_shipped_experiment_with_other_settings_is_refused(tmp_path):
    import yaml

    cfg = load_experiment(EXP, {"workload.num_requests": 7})
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    declared = yaml.safe_load((pipeline.repo_root() / "artifact" / "dlfp" / "experiments" / f"{EXP}.yaml").read_text())
    with pytest.raises(ConfigError) as e:
        pipeline.load_config(str(mine))
    assert str(e.value).startswith(f"{mine}: names experiment '{EXP}' but differs from ")
    assert f"(workload.num_requests: 7 vs {declared['workload']['num_requests']})" in str(e.value)
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(load_experiment(EXP).model_dump(mode="json")))
    assert pipeline.load_config(str(same)).name == EXP
