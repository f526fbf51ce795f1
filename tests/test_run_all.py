"""``run-all``: configuration checked before the cache, the simulator rerun as a reproducibility check,
executed notebooks byte-identical on rerun, one summary line."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from dlfp import fingerprint, pipeline
from dlfp.cli import main
from dlfp.config import load_experiment
from dlfp.paths import CACHE_ENV, REPO_ROOT
from dlfp.pipeline import execute, provenance, verified, verify
from dlfp.traces.compare import trial_differences
from dlfp.traces.format import find_trials, trial_dir, write_trial
from test_cli import one_line_error
from test_pipeline import EXP, SMALL, declare_experiment, fake_trial

TINY = {"workload.num_requests": 5, "workload.num_warmup": 1, "workload.output_tokens": 8,
        "backend_options.frontier_caps": [], "arms": {"baseline": {"policy": "nocap"}, "dlfp": {"policy": "dlfp"}}}


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test its own cache folder: this machine's verification record is never touched."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))


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
    monkeypatch.delenv(CACHE_ENV)  # the default: the record in the root's .cache/
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
    assert ("dlfp run-all: 6 trials fresh: verified by this code on this machine, not rerun; --force reruns"
            in captured.err)
    assert len(out) == 1 and out[0].startswith(
        "run-all on sim: 1 experiment(s), 6 trials fresh (verified by this code on this machine, not rerun); 1 of 1 "
        "experiment notebook(s) fresh, not re-executed; results in data/results (fresh, not re-rendered); ") \
        and out[0].endswith(" s")
    stamps = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.json") if p.name != "metadata.json")
    assert stamps == [".cache/dlfp/verified/sim.json", "data/results/figures.stamp.json",
                      "data/traces/sim/PROVENANCE.json", f"data/traces/sim/{EXP}/experiment.stamp.json"]
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


def test_a_fresh_clone_reruns_every_trial_and_a_second_run_skips_them(tmp_path, monkeypatch, capsys):
    """Shipped traces and their provenance but no record of this machine (a fresh clone): every trial is rerun
    and compared; the record then lets the next run skip them, and the provenance stays byte for byte."""
    root = _repo_copy(tmp_path)
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv(pipeline.ROOT_ENV, str(root))
    monkeypatch.setenv(pipeline.JOBS_ENV, "1")
    traces = root / "data" / "traces"
    args = ["run-all", "--backend", "sim", "--experiments", EXP, "--traces", str(traces), "--results",
            str(root / "data" / "results"), "--no-progress", "--no-figures"]
    declare_experiment(load_experiment(EXP, TINY))  # the experiment as declared here
    assert main(args) == 0  # the "shipping" run: 6 trials added to an empty traces folder
    record = root / ".cache" / "dlfp" / "verified" / "sim.json"
    assert verified.record_path("sim") == record
    prov_path = traces / "sim" / "PROVENANCE.json"
    prov = prov_path.read_bytes()
    names = sorted(d.relative_to(traces / "sim").as_posix() for d in find_trials(traces))
    assert len(names) == 6 and sorted(json.loads(prov)["trials"]) == names
    code = fingerprint.code_fingerprint("trial")
    for name in names:
        entry = json.loads(prov)["trials"][name]
        assert entry["code"] == code and entry["trace"] == fingerprint.trial_sha256(traces / "sim" / name)
    assert list(json.loads(prov)["codes"]) == [code]
    trials = {p: p.stat().st_mtime_ns for p in traces.rglob("*.parquet")}

    record.unlink()  # a fresh clone: the traces and the provenance, no record of this machine
    capsys.readouterr()
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "dlfp run-all: 6 of 6 simulator trials identical to the shipped traces" in captured.err.splitlines()
    assert "trials fresh" not in captured.err
    assert captured.out.startswith("run-all on sim: 1 experiment(s), 6 trials rerun, 6 identical to the shipped "
                                   "traces, 0 replaced; ")
    assert {p: p.stat().st_mtime_ns for p in traces.rglob("*.parquet")} == trials  # identical: untouched
    assert prov_path.read_bytes() == prov
    rec = json.loads(record.read_text())
    assert rec["code"] == code and sorted(rec["trials"]) == names

    def no_rerun(*a):
        raise AssertionError(f"trial rerun although verified on this machine: {a[1:3]}")

    monkeypatch.setattr(execute, "_trial_worker", no_rerun)
    capsys.readouterr()
    assert main(args) == 0  # the second run on this machine
    captured = capsys.readouterr()
    assert ("dlfp run-all: 6 trials fresh: verified by this code on this machine, not rerun; --force reruns"
            in captured.err.splitlines())
    assert prov_path.read_bytes() == prov


def test_the_record_is_per_machine_and_the_committed_provenance_names_no_verification(monkeypatch):
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.delenv(pipeline.ROOT_ENV, raising=False)
    record = verified.record_path("sim")
    assert record == REPO_ROOT / ".cache" / "dlfp" / "verified" / "sim.json"
    rel = record.relative_to(REPO_ROOT).as_posix()
    assert "/.cache/" in (REPO_ROOT / ".gitignore").read_text().splitlines()
    if shutil.which("git") and (REPO_ROOT / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", "-q", rel], cwd=REPO_ROOT)
        assert ignored.returncode == 0, f"{rel} is not git-ignored"
    monkeypatch.setenv(CACHE_ENV, "off")
    assert verified.record_path("sim") is None
    shipped = REPO_ROOT / "data" / "traces" / "sim"
    assert not (shipped / "VERIFIED.json").exists()
    prov = provenance.load_provenance(provenance.provenance_path(REPO_ROOT / "data" / "traces", "sim"))
    assert "verified" not in prov["about"].lower()
    on_disk = sorted(d.relative_to(shipped).as_posix() for d in find_trials(shipped.parent)
                     if d.parts[-4] == "sim" and "+" not in d.parts[-3])
    assert on_disk  # the shipped simulator matrix
    assert sorted(prov["trials"]) == on_disk
    for name in on_disk:
        assert prov["trials"][name]["trace"] == fingerprint.trial_sha256(shipped / name), name
        assert prov["trials"][name]["code"] in prov["codes"]


def test_with_the_cache_off_every_run_reruns_every_trial(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "off")
    traces = tmp_path / "traces"
    first = verify.verify_trials([_plan()], "sim", traces, jobs=1, progress=False)
    again = verify.verify_trials([_plan()], "sim", traces, jobs=1, progress=False)
    assert (first.total, first.added, again.total, again.identical, again.fresh) == (4, 4, 4, 4, 0)
    assert not (tmp_path / "cache").exists() and not (traces / "sim" / "VERIFIED.json").exists()


def test_a_replaced_trial_names_the_code_that_wrote_it_in_the_provenance(tmp_path):
    traces = tmp_path / "traces"
    verify.verify_trials([_plan()], "sim", traces, jobs=1, progress=False)
    changed = trial_dir(traces, "sim", EXP, "dlfp", 802)
    (changed / "tokens.parquet").write_bytes((changed / "tokens.parquet").read_bytes() + b"x")
    path = provenance.provenance_path(traces, "sim")
    prov = json.loads(path.read_text())
    old = "0" * 64  # as if older code had written every trial, the changed one with the bytes it has now
    prov["codes"] = {old: {"python": "3.11"}}
    prov["trials"] = {n: {**e, "code": old} for n, e in prov["trials"].items()}
    prov["trials"][f"{EXP}/dlfp/seed-802"]["trace"] = fingerprint.trial_sha256(changed)
    fingerprint.write_json_atomic(path, prov)
    res = verify.verify_trials([_plan()], "sim", traces, jobs=1, progress=False, force=True)
    assert (res.identical, list(res.replaced)) == (3, [f"sim/{EXP}/dlfp/seed-802"])
    now = json.loads(path.read_text())
    code = fingerprint.code_fingerprint("trial")
    want = {f"{EXP}/{a}/seed-{s}": code if (a, s) == ("dlfp", 802) else old
            for a in ("baseline", "dlfp") for s in (801, 802)}
    assert {n: e["code"] for n, e in now["trials"].items()} == want
    assert now["trials"][f"{EXP}/dlfp/seed-802"]["trace"] == fingerprint.trial_sha256(changed)
    assert sorted(now["codes"]) == sorted([old, code]) and now["codes"][code] == fingerprint.environment()
    assert provenance.update_provenance(path, code, fingerprint.environment(),
                                        {(EXP, "baseline", 801): {k: now["trials"][f"{EXP}/baseline/seed-801"][k]
                                                                  for k in ("config", "trace")}}) == []
