"""Failures that are not the user's configuration: a full disk, a read-only traces root, notebook parameters of the
wrong type, a missing trace file. Each ends in one line naming the thing and what to do, exit status 2, nothing
left behind."""
from __future__ import annotations

import errno
import tempfile
import types

import pytest

from dlfp import pipeline
from dlfp.cli import main
from dlfp.config import load_experiment
from dlfp.traces import format as trace_format
from test_cli import one_line_error
from test_pipeline import EXP, SMALL, declare_experiment, install_fake_backend


@pytest.fixture
def small(monkeypatch):
    calls: list = []
    install_fake_backend(monkeypatch, calls)
    declare_experiment(load_experiment(EXP, SMALL))
    return calls


def test_a_full_disk_is_one_line_naming_the_folder_and_its_free_space(tmp_path, monkeypatch, capsys, small):
    out = tmp_path / "traces"

    def full(df, path, cols):
        path.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(trace_format, "_write_parquet", full)
    monkeypatch.setattr(trace_format.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=300 * 1024))
    assert main(["run", EXP, "--out", str(out), "--seeds", "801", "--no-progress"]) == 2
    msg = one_line_error(capsys)
    dest = out / "sim" / EXP / "baseline" / "seed-801"
    assert msg == (f"no space left on the device writing {dest}: 300.0 KB free in {out}; free some space or write "
                   f"elsewhere (--out DIR)")
    assert small == [("baseline", 801)] and list(out.rglob("*")) == []  # no temporary, no empty arm folder


def test_a_read_only_traces_root_is_named_as_itself(tmp_path, monkeypatch, capsys, small):
    out = tmp_path / "traces"
    out.mkdir()
    real = tempfile.mkdtemp

    def refuse(*args, dir=None, **kw):
        if dir is not None and str(dir).startswith(str(out)):
            raise PermissionError(errno.EACCES, "Permission denied", str(dir) + "/.tmp-x")
        return real(*args, dir=dir, **kw)

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    assert main(["run", EXP, "--out", str(out), "--seeds", "801", "--no-progress"]) == 2
    assert one_line_error(capsys) == (f"traces directory {out} is not writable: Permission denied; make it writable "
                                      f"or choose another with --out DIR")
    assert small == [] and list(out.iterdir()) == []
    assert main(["run-all", "--backend", "sim", "--experiments", EXP, "--traces", str(out), "--no-progress"]) == 2
    assert one_line_error(capsys).startswith(f"traces directory {out} is not writable: Permission denied; ")


@pytest.mark.parametrize("name,value,expected", [
    ("seeds", 801, "parameter seeds: expected a list of integers or None, e.g. [801, 802]; got int 801"),
    ("overrides", "tp=3", "parameter overrides: expected a mapping of dotted config keys to values, e.g. "
                          "{\"workload.num_requests\": 5}; got str 'tp=3'"),
    ("force", "yes", "parameter force: expected true or false, e.g. True; got str 'yes'"),
])
def test_arguments_of_the_wrong_type_are_named_before_anything_runs(tmp_path, small, name, value, expected):
    with pytest.raises(pipeline.PipelineError) as e:
        pipeline.run_experiment(EXP, out_dir=tmp_path, progress=False, **{name: value})
    assert str(e.value).startswith(expected) and small == [] and list(tmp_path.iterdir()) == []


def test_notebook_parameters_of_the_wrong_type_are_one_line_in_the_cell(tmp_path):
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(pipeline.notebooks_dir() / "experiment.ipynb"), str(tmp_path / "o.ipynb"),
                            parameters=dict(experiment=EXP, backend="sim", seeds=801, out_dir=str(tmp_path / "t")),
                            kernel_name="python3", progress_bar=False)
    want = ("dlfp: error: parameter seeds: expected a list of integers or None, e.g. [801, 802]; got int 801 "
            "(papermill takes it as YAML: -y '{\"seeds\": [801, 802]}')")
    assert e.value.ename == "PipelineError" and e.value.traceback == [want]
    assert not (tmp_path / "t").exists()


def test_a_missing_trace_file_stops_the_run_before_any_trial(tmp_path, monkeypatch, capsys):
    calls: list = []
    install_fake_backend(monkeypatch, calls)
    out = tmp_path / "traces"
    assert main(["run", "qwen3-8b-mooncake", "--out", str(out), "--no-progress",
                 "--set", "workload.trace.path=nope.jsonl"]) == 2
    msg = one_line_error(capsys)
    assert msg.startswith(f"workload.trace.path: trace file {pipeline.repo_root() / 'nope.jsonl'} does not exist "
                          f"(a path relative to the repository root, e.g. ")
    assert calls == [] and not out.exists()


@pytest.mark.parametrize("force,how", [
    ([], "rerun the same command to resume"),
    (["--force"], "rerun the same command without --force to resume (with --force every trial runs again)"),
])
def test_the_interrupt_line_says_how_to_continue(tmp_path, monkeypatch, capsys, force, how):
    calls: list = []
    install_fake_backend(monkeypatch, calls, fail_on=2)  # Ctrl-C while the second trial runs
    declare_experiment(load_experiment(EXP, SMALL))
    assert main(["run", EXP, "--out", str(tmp_path), "--seeds", "801", "--no-progress", *force]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dlfp: interrupted (SIGINT) after 1 trial(s) finished, kept on disk; {how}"]
