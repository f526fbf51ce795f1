"""The ``dlfp`` command line under hostile input: one line naming the thing, exit status 2, nothing written."""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from dlfp import pipeline
from dlfp.cli import main

EXP = "qwen3-0.6b-tp1"
PLAIN = "must be a plain name ([A-Za-z0-9._-], no '/' or '..')"
TOY = {
    "name": "toy",
    "model": "qwen3-0.6b",
    "gpu": "a100-sxm4-80gb",
    "max_num_batched_tokens": 8192,
    "workload": {"kind": "fixed", "rate": 1.0, "num_requests": 2, "prompt_tokens": 64, "output_tokens": 4},
    "slo": {"ttft_s": 2.0, "itl_s": 0.1},
    "arms": {"baseline": {"policy": "nocap"}},
    "seeds": [801],
}


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("dlfp: error: ") and "Traceback" not in err[0]
    return err[0][len("dlfp: error: "):]


def nothing_under(path) -> bool:
    return not path.exists() or not any(path.rglob("*"))


@pytest.fixture(autouse=True)
def _serial(monkeypatch):
    monkeypatch.setenv(pipeline.JOBS_ENV, "1")  # trials in this process: no worker start-up in these tests


def write_cfg(tmp_path, data, name="toy.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_names_cannot_escape_out(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["run", EXP, "--backend", "sim", "--out", str(out), "--set", "name=../../evil2"]) == 2
    assert one_line_error(capsys).endswith(f"field name: '../../evil2' {PLAIN}")
    bad = {**copy.deepcopy(TOY), "name": "../../escape"}
    p = write_cfg(tmp_path, bad)
    assert main(["run", str(p), "--backend", "sim", "--out", str(out)]) == 2
    assert one_line_error(capsys) == f"{p}: field name: '../../escape' {PLAIN}"
    bad = copy.deepcopy(TOY)
    bad["arms"]["x/../../y"] = {"policy": "nocap"}
    p = write_cfg(tmp_path, bad)
    assert main(["run", str(p), "--backend", "sim", "--out", str(out)]) == 2
    assert one_line_error(capsys) == f"{p}: field arms: 'x/../../y' {PLAIN}"
    # out/sim/../../evil2 would have been tmp_path/evil2
    assert nothing_under(out) and not (tmp_path / "evil2").exists() and not (tmp_path.parent / "evil2").exists()


@pytest.mark.parametrize("kind", ["directory", "truncated", "binary", "nan", "start_by_seed"])
def test_bad_trace_files_exit_2_with_the_file_named(tmp_path, capsys, kind):
    trace = tmp_path / "t.jsonl"
    tr = {"path": str(trace), "format": "mooncake", "nonmatching": False}
    if kind == "directory":
        trace.mkdir()
        want = f"workload.trace.path: trace file {trace} is a directory"
    elif kind == "truncated":
        trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 10')
        want = f"trace file {trace} line 2: not valid JSON"
    elif kind == "binary":
        trace.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
        want = f"trace file {trace} line 1: not UTF-8 text (a binary file?)"
    elif kind == "nan":
        trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                         '{"timestamp": NaN, "input_length": 5, "output_length": 1}\n')
        want = f"trace file {trace} line 2: field timestamp is not a finite time"
    else:
        trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                         '{"timestamp": 10, "input_length": 5, "output_length": 1}\n')
        tr["start_by_seed"] = {802: 0}
        want = "workload.trace.start_by_seed has no entry for seed 801"
    cfg = copy.deepcopy(TOY)
    cfg["workload"] = {"kind": "trace", "rate": 1.0, "num_requests": 2, "output_tokens": 4, "trace": tr}
    out = tmp_path / "out"
    assert main(["run", str(write_cfg(tmp_path, cfg)), "--backend", "sim", "--out", str(out), "--no-progress"]) == 2
    assert one_line_error(capsys) == want
    assert nothing_under(out)


def test_seeds_must_be_non_negative_integers(tmp_path, capsys):
    out = tmp_path / "out"
    for cmd in (["run", EXP], ["run-all", "--experiments", EXP]):
        with pytest.raises(SystemExit) as ei:
            main([*cmd, "--backend", "sim", "--seeds", "801", "-5"])
        assert ei.value.code == 2
        assert "argument --seeds: seed -5 is negative (seeds are non-negative integers)" in capsys.readouterr().err
    p = write_cfg(tmp_path, {**copy.deepcopy(TOY), "seeds": [-3]})
    assert main(["run", str(p), "--backend", "sim", "--out", str(out)]) == 2
    assert one_line_error(capsys) == f"{p}: field seeds.0: Input should be greater than or equal to 0"
    assert nothing_under(out)


def test_config_and_output_paths_of_the_wrong_kind(tmp_path, capsys):
    d = tmp_path / "dir.yaml"
    d.mkdir()
    assert main(["run", str(d), "--backend", "sim"]) == 2
    assert one_line_error(capsys) == f"experiment config {d} is a directory, not a YAML file"
    f = tmp_path / "regular"
    f.write_text("keep me")
    assert main(["run", str(write_cfg(tmp_path, TOY)), "--backend", "sim", "--out", str(f)]) == 2
    assert one_line_error(capsys) == f"traces directory (--out) {f} is not a directory"
    traces = tmp_path / "traces"
    traces.mkdir()
    assert main(["figures", "--traces", str(traces), "--out", str(f)]) == 2
    assert one_line_error(capsys) == f"results directory (--out) {f} is not a directory"
    assert main(["figures", "--traces", str(f), "--out", str(tmp_path / "res")]) == 2
    assert one_line_error(capsys) == f"traces directory {f} is not a directory"
    assert f.read_text() == "keep me" and not (tmp_path / "res").exists()


def test_float_and_int_fields_are_strict_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "out"
    for kv, field, msg in (("workload.prompt_scale=inf", "workload.prompt_scale", "Input should be a finite number"),
                           ("workload.num_requests=true", "workload.num_requests",
                            "expected a number, got the boolean True"),
                           ("workload.max_prompt_tokens=40900", "max_model_len",
                            "40960 is shorter than the longest request: workload.max_prompt_tokens (40900 after "
                            "clipping) + workload.output_tokens (128) = 41028")):
        assert main(["run", EXP, "--backend", "sim", "--out", str(out), "--set", kv]) == 2
        assert one_line_error(capsys).endswith(f"field {field}: {msg}")
    assert nothing_under(out)


def test_calibrate_refit_garbage_and_validate_sim_arguments(tmp_path, capsys):
    meas = tmp_path / "meas"
    meas.mkdir()
    (meas / "steps.csv").write_text("a,b\n1,2\n")
    (meas / "tokens.csv").write_text("x\n1\n")
    (meas / "meta.json").write_text(json.dumps({"foo": 1}))
    prof = tmp_path / "prof.yaml"
    assert main(["calibrate", "--refit", str(meas), "--out", str(prof), "--figure", str(tmp_path / "f.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dlfp calibrate: --refit {meas}: not valid saved measurements (steps.csv, tokens.csv, "
                   "meta.json): KeyError: 'sampled_ids'"]
    assert not prof.exists() and not (tmp_path / "f.png").exists()
    out = tmp_path / "fid"
    for args, want in ((["--seeds", "abc"], "argument --seeds: 'abc' is not a comma-separated list of integers"),
                       (["--seeds", "801,-2"], "argument --seeds: '801,-2': seeds are non-negative integers"),
                       (["--backend", "bogus"],
                        "argument --backend: unknown backend 'bogus'; known: sim, emu, vllm, torch")):
        with pytest.raises(SystemExit) as ei:
            main(["validate-sim", "--out", str(out), *args])
        assert ei.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"dlfp validate-sim: error: {want}"
    assert main(["validate-sim", "--experiment", "nosuch", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dlfp validate-sim: unknown experiment 'nosuch'; known: ")
    assert not out.exists()
