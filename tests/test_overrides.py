"""Trials run with ``--set`` overrides are their own experiment ``<name>+<8 hex>``, never the shipped one."""
from __future__ import annotations

import hashlib
import json

from dlfp import pipeline
from dlfp.analysis import tables
from dlfp.cli import main
from dlfp.traces.format import find_trials, load_trial, trial_dir
from test_pipeline import EXP, SMALL, install_fake_backend, write_fake_experiment


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


def test_explicit_out_keeps_the_canonical_name(tmp_path, monkeypatch):
    install_fake_backend(monkeypatch)
    run = pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[801], overrides=SMALL, progress=False)
    assert run.config.name == EXP
    assert [p.relative_to(tmp_path).as_posix() for p in find_trials(tmp_path)] == [
        f"sim/{EXP}/baseline/seed-801", f"sim/{EXP}/dlfp/seed-801"]


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
