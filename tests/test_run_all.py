"""``run-all``: configuration checked before the cache, the simulator rerun as a reproducibility check,
executed notebooks byte-identical on rerun, one summary line."""
from __future__ import annotations

import os
import shutil

import pytest

from dlfp import pipeline
from dlfp.cli import main
from dlfp.config import load_experiment
from dlfp.pipeline import execute, verify
from dlfp.traces.compare import trial_differences
from dlfp.traces.format import find_trials, trial_dir, write_trial
from test_cli import one_line_error
from test_pipeline import EXP, SMALL, declare_experiment, fake_trial

TINY = {"workload.num_requests": 5, "workload.num_warmup": 1, "workload.output_tokens": 8,
        "backend_options.frontier_caps": [], "arms": {"baseline": {"policy": "nocap"}, "dlfp": {"policy": "dlfp"}}}


@pytest.mark.parametrize("override,named", [("tp=3", "tp"), ("model=qwen3-0.7b", "qwen3-0.7b")])
def test_bad_configuration_is_one_line_before_the_cache_is_read(tmp_path, monkeypatch, capsys, override, named):
    # A cache full of trials that the bad override would make stale: none of them may be named or touched.
    traces = tmp_path / "traces"
    cfg = pipeline.load_config(EXP, SMALL)
    for arm in cfg.arms:
        write_trial(fake_trial(cfg, arm, 801), traces)
    before = {p: p.stat().st_mtime_ns for p in traces.rglob("*")}
    ran = []
    monkeypatch.setattr(execute, "execute_experiment_notebook_checked", lambda *a, **k: ran.append(a))
    monkeypatch.setattr(verify, "verify_trials", lambda *a, **k: ran.append(a))
    assert main(["run-all", "--backend", "sim", "--traces", str(traces), "--results", str(tmp_path / "r"),
                 "--set", override]) == 2
    msg = one_line_error(capsys)
    assert named in msg and "stale" not in msg
    assert ran == [] and {p: p.stat().st_mtime_ns for p in traces.rglob("*")} == before
    assert not (tmp_path / "r").exists()


def test_tp_the_model_cannot_split_names_the_heads(capsys):
    assert main(["run", EXP, "--backend", "sim", "--set", "tp=3", "--no-progress"]) == 2
    msg = one_line_error(capsys)
    assert "16" in msg and "3" in msg


def _plan(seeds=(801, 802)):
    cfg = pipeline.prepare_config(EXP, "sim", overrides=TINY)
    return cfg, pipeline.select_arms(cfg, None), list(seeds)


def test_rerun_keeps_identical_trials_untouched_and_replaces_the_rest(tmp_path, capsys):
    shipped, fresh = tmp_path / "shipped", tmp_path / "fresh"
    pipeline.run_experiment(_plan()[0], backend="sim", out_dir=shipped, seeds=[801, 802], jobs=1,
                            progress=False)
    pipeline.run_experiment(_plan()[0], backend="sim", out_dir=fresh, seeds=[801, 802], jobs=1,
                            progress=False)  # the independent reference
    same = trial_dir(shipped, "sim", EXP, "dlfp", 801)
    stamp = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in same.iterdir()}
    changed = trial_dir(shipped, "sim", EXP, "baseline", 802)
    (changed / "tokens.parquet").write_bytes((changed / "tokens.parquet").read_bytes() + b"x")
    shutil.rmtree(trial_dir(shipped, "sim", EXP, "dlfp", 802))
    res = verify.verify_trials([_plan()], "sim", shipped, jobs=1, progress=False)
    assert res.summary() == ("2 of 4 simulator trials identical to the shipped traces; 1 replaced by the fresh run; "
                             "1 missing, added from the fresh run")
    assert res.replaced == {f"sim/{EXP}/baseline/seed-802": ["tokens.parquet"]}
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in same.iterdir()} == stamp
    for d in find_trials(fresh):
        assert trial_differences(d, shipped / d.relative_to(fresh)) == []
    assert [p for p in shipped.rglob("*") if p.name.startswith(".")] == []
    err = capsys.readouterr().err
    assert f"sim/{EXP}/baseline/seed-802 differs from the fresh run (tokens.parquet); replaced" in err


def _repo_copy(tmp_path):
    """A repository root with the notebooks (results and traces relative to it, as in a checkout)."""
    root = tmp_path / "repo"
    shutil.copytree(pipeline.notebooks_dir(), root / "notebooks")
    return root


def test_run_all_twice_is_byte_identical_and_ends_with_one_summary_line(tmp_path, monkeypatch, capsys):
    root = _repo_copy(tmp_path)
    monkeypatch.setenv(pipeline.ROOT_ENV, str(root))
    monkeypatch.setenv(pipeline.JOBS_ENV, "1")
    traces, results = root / "data" / "traces", root / "data" / "results"
    declare_experiment(load_experiment(EXP, TINY))  # the experiment as declared here (the kernels see it too)
    args = ["run-all", "--backend", "sim", "--experiments", EXP, "--traces", str(traces),
            "--results", str(results), "--no-progress"]
    assert main(args) == 0
    nbs = [traces / "sim" / EXP / "experiment.ipynb", results / "figures.ipynb"]
    first = [p.read_bytes() for p in nbs]
    trials = {p: p.stat().st_mtime_ns for p in traces.rglob("*.parquet")}
    capsys.readouterr()
    assert main(args) == 0
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    assert [p.read_bytes() for p in nbs] == first
    assert {p: p.stat().st_mtime_ns for p in traces.rglob("*.parquet")} == trials  # untouched
    assert "dlfp run-all: 6 trials fresh: verified by this code, not rerun; --force reruns" in captured.err
    assert len(out) == 1 and out[0].startswith(
        "run-all on sim: 1 experiment(s), 6 trials fresh (verified by this code, not rerun); 1 of 1 experiment "
        "notebook(s) fresh, not re-executed; results in data/results (fresh, not re-rendered); ") \
        and out[0].endswith(" s")
    stamps = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.json") if p.name != "metadata.json")
    assert stamps == ["data/results/figures.stamp.json", "data/traces/sim/VERIFIED.json",
                      f"data/traces/sim/{EXP}/experiment.stamp.json"]
    assert main(args + ["--force"]) == 0  # reruns and compares every trial, executes every notebook again
    out = capsys.readouterr().out.strip().splitlines()
    assert [p.read_bytes() for p in nbs] == first
    assert {p: p.stat().st_mtime_ns for p in traces.rglob("*.parquet")} == trials  # identical: untouched
    assert len(out) == 1 and out[0].startswith(
        "run-all on sim: 1 experiment(s), 6 trials rerun, 6 identical to the shipped traces, 0 replaced; "
        "results in data/results; ") and out[0].endswith(" s")
    for text in (b.decode() for b in first):
        assert str(tmp_path) not in text and os.sep + "work" + os.sep not in text
        for stamp in ('"start_time"', '"end_time"', '"duration"', "iopub.", "shell.execute_reply"):
            assert stamp not in text
    assert '"input_path": "notebooks/experiment.ipynb"' in first[0].decode()
    assert f'"output_path": "data/traces/sim/{EXP}/experiment.ipynb"' in first[0].decode()


def test_a_killed_runs_scratch_folder_is_removed_by_the_next_run_and_git_ignores_it(tmp_path):
    import subprocess

    traces = tmp_path / "traces"
    dead = subprocess.Popen(["true"])
    dead.wait()  # a process id that no longer runs
    stale = traces / f"{verify.SCRATCH_PREFIX}{dead.pid}-abc" / "sim"
    stale.mkdir(parents=True)
    (stale / "half.parquet").write_bytes(b"x")
    other = traces / f"{verify.SCRATCH_PREFIX}1-init"  # pid 1 runs: another run's scratch, left alone
    other.mkdir()
    assert verify.remove_stale_scratch(traces) == [stale.parent]
    assert sorted(p.name for p in traces.iterdir()) == [other.name]
    ignored = subprocess.run(["git", "check-ignore", "-v", "data/traces/.rerun-123-abc/sim/x"],
                             cwd=pipeline.repo_root(), capture_output=True, text=True)
    assert ignored.stdout.startswith(".gitignore:")  # the project's own rule, not a local exclude


def test_an_identical_rerun_rewrites_no_file_for_a_git_commit_difference(tmp_path):
    from test_pipeline import fake_trial

    cfg = pipeline.load_config(EXP, SMALL)
    first = fake_trial(cfg, "dlfp", 801)
    d = write_trial(first, tmp_path)
    before = {p.name: (p.stat().st_ino, p.read_bytes()) for p in d.iterdir()}
    again = fake_trial(cfg, "dlfp", 801)
    again.metadata["git_commit"] = "another-commit"
    assert write_trial(again, tmp_path, overwrite=True) == d
    assert {p.name: (p.stat().st_ino, p.read_bytes()) for p in d.iterdir()} == before
    changed = fake_trial(cfg, "dlfp", 801)
    changed.metadata["energy"] = {"joules": 1.0}
    write_trial(changed, tmp_path, overwrite=True)
    assert '"joules": 1.0' in (d / "metadata.json").read_text() and list(tmp_path.rglob(".*")) == []
