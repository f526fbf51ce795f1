"""Freshness decided from content: render stamps, the simulator's verification record, the per-trial digest cache.

Every check works on small copies in a temporary folder, never on the committed data.
"""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from dlfp import fingerprint, pipeline
from dlfp.analysis import tables
from dlfp.analysis.tables import digest_cache, loading
from dlfp.cli import main
from dlfp.pipeline import stamps, verified, verify
from dlfp.traces.format import find_trials, trial_dir
from test_pipeline import EXP, write_fake_experiment
from test_run_all import TINY, _plan


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Each test its own digest cache folder."""
    monkeypatch.setenv(digest_cache.CACHE_ENV, str(tmp_path / "cache"))


def _flip_last_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- fingerprints


def test_code_fingerprint_covers_every_package_file_and_nothing_else(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.yaml").write_text("k: v\n")
    first = fingerprint.tree_sha256(pkg)
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (pkg / ".a.py.swp").write_text("editor")
    assert fingerprint.tree_sha256(pkg) == first  # byte-code and hidden files do not count
    (pkg / "sub" / "b.yaml").write_text("k: w\n")
    assert fingerprint.tree_sha256(pkg) != first  # a data file counts
    assert [p.name for p in fingerprint.package_files(pkg)] == ["a.py", "b.yaml"]
    a = fingerprint.code_fingerprint("trial", pkg, fresh=True)
    (pkg / "a.py").write_text("x = 2\n")
    assert fingerprint.code_fingerprint("trial", pkg) == a  # computed once per process ...
    assert fingerprint.code_fingerprint("trial", pkg, fresh=True) != a  # ... unless asked afresh
    with pytest.raises(ValueError, match="kind"):
        fingerprint.code_fingerprint("plot")


# --------------------------------------------------------------------------- render stamps


def _stamped_output(tmp_path):
    traces, out = tmp_path / "traces", tmp_path / "out"
    write_fake_experiment(traces, EXP, seeds=(801,))
    out.mkdir()
    (out / "figures.ipynb").write_text("{}\n")
    (out / "headline.csv").write_text("a,b\n1,2\n")
    return traces, out / "figures.ipynb"


def test_a_stamp_matches_until_a_trace_byte_an_output_the_parameters_or_the_code_change(tmp_path, monkeypatch):
    traces, nb = _stamped_output(tmp_path)
    params = {"formats": ["png"], "allow_partial": False}
    inputs = stamps.traces_digests(traces)
    assert list(inputs) == [f"traces/sim/{EXP}"]
    path = stamps.write_stamp(nb, inputs, params)
    assert path == nb.parent / "figures.stamp.json"
    assert json.loads(path.read_text())["outputs"] == {"figures.ipynb": fingerprint.file_sha256(nb),
                                                       "headline.csv": fingerprint.file_sha256(nb.parent /
                                                                                               "headline.csv")}
    assert stamps.stale_reason(nb, stamps.traces_digests(traces), params) is None
    tokens = trial_dir(traces, "sim", EXP, "dlfp", 801) / "tokens.parquet"
    original = tokens.read_bytes()
    _flip_last_byte(tokens)
    assert stamps.stale_reason(nb, stamps.traces_digests(traces), params) == \
        f"changed input(s): traces/sim/{EXP}"
    tokens.write_bytes(original)
    assert stamps.stale_reason(nb, stamps.traces_digests(traces), params) is None  # content, not mtimes
    assert stamps.stale_reason(nb, inputs, {**params, "formats": ["pdf"]}) == "the notebook parameters changed"
    (nb.parent / "headline.csv").write_text("a,b\n1,3\n")
    assert stamps.stale_reason(nb, inputs, params).startswith("output(s) changed or missing since the render: "
                                                              "headline.csv")
    stamps.write_stamp(nb, inputs, params)
    monkeypatch.setattr(stamps, "code_fingerprint", lambda kind: "0" * 64)
    assert stamps.stale_reason(nb, inputs, params) == "the dlfp code or the installed packages changed"


def test_a_stamp_is_deterministic_and_names_no_absolute_path(tmp_path):
    traces, nb = _stamped_output(tmp_path)
    params = {"traces_dir": "data/traces", "formats": ["png", "pdf"]}
    path = stamps.write_stamp(nb, stamps.traces_digests(traces), params)
    first = path.read_bytes()
    stamps.write_stamp(nb, dict(reversed(list(stamps.traces_digests(traces).items()))), dict(reversed(params.items())))
    assert path.read_bytes() == first
    assert str(tmp_path) not in first.decode() and "time" not in json.loads(first)


def test_figures_render_once_then_fresh_and_a_changed_or_corrupt_trace_is_rendered_or_refused(tmp_path, capsys):
    traces, results = tmp_path / "traces", tmp_path / "results"
    write_fake_experiment(traces, EXP)
    args = ["figures", "--traces", str(traces), "--out", str(results), "--published", str(tmp_path / "none.csv")]
    assert main(args) == 0
    assert "executed notebook" in capsys.readouterr().out
    written = {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}
    assert "figures.stamp.json" in written and "itl_cdf.png" in written
    mtimes = {p.name: p.stat().st_mtime_ns for p in results.iterdir()}
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "fresh: rendered by this code from these traces and inputs, not re-rendered; --force re-renders" in out
    assert {p.name: p.stat().st_mtime_ns for p in results.iterdir()} == mtimes  # nothing ran, nothing written
    # A valid change of one trial: stale, rendered again, and the table says what the trace now says.
    d = trial_dir(traces, "sim", EXP, "dlfp", 802)
    from dlfp.traces.format import Trial, load_trial, write_trial

    t = load_trial(d)
    t.tokens.loc[t.tokens["index"] >= 3, "time_s"] += 0.5  # a longer gap before token 3
    write_trial(Trial(t.requests, t.tokens, t.iterations, t.metadata), traces, overwrite=True)
    r = pipeline.render_figures_checked(traces, results, tmp_path / "none.csv")
    assert not r.fresh and r.reason == f"changed input(s): traces/sim/{EXP}"
    assert (results / "headline_per_seed.csv").read_bytes() != written["headline_per_seed.csv"]
    stamp = (results / "figures.stamp.json").read_bytes()
    # A corrupt trial: refused (one line naming it), the outputs and stamp left as they were, so still stale.
    _flip_last_byte(d / "requests.parquet")
    before = {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()}
    with pytest.raises(pipeline.PipelineError, match=f"{EXP}/dlfp/seed-802"):
        pipeline.render_figures_checked(traces, results, tmp_path / "none.csv")
    assert {p.name: p.read_bytes() for p in results.iterdir() if p.is_file()} == before
    assert (results / "figures.stamp.json").read_bytes() == stamp
    from dlfp.pipeline.notebooks import _figures_inputs

    inputs, params = _figures_inputs(traces, results, tmp_path / "none.csv"), json.loads(stamp)["parameters"]
    assert stamps.stale_reason(results / "figures.ipynb", inputs, params) == f"changed input(s): traces/sim/{EXP}"


# --------------------------------------------------------------------------- verification record


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """Two seeds of a tiny simulator experiment, run once for the module."""
    root = tmp_path_factory.mktemp("shipped")
    pipeline.run_experiment(_plan()[0], backend="sim", out_dir=root, seeds=[801, 802], jobs=1,
                            progress=False)
    return root


@pytest.fixture
def traces(shipped, tmp_path):
    root = tmp_path / "traces"
    shutil.copytree(shipped, root)
    return root


def _no_rerun(*args):
    raise AssertionError(f"trial rerun although fresh: {args[1:3]}")


def test_verified_trials_are_not_rerun_until_forced(traces, tmp_path, monkeypatch, capsys):
    first = verify.verify_trials([_plan()], "sim", traces, jobs=1, progress=False)
    assert (first.total, first.identical, first.fresh) == (4, 4, 0)
    record = verified.record_path("sim")
    assert record == tmp_path / "cache" / "verified" / "sim.json"
    entries = json.loads(record.read_text())["trials"]
    assert sorted(entries) == [f"{EXP}/{a}/seed-{s}" for a in ("baseline", "dlfp") for s in (801, 802)]
    d = trial_dir(traces, "sim", EXP, "dlfp", 801)
    assert entries[f"{EXP}/dlfp/seed-801"]["trace"] == fingerprint.trial_sha256(d)
    from dlfp.pipeline import execute

    monkeypatch.setattr(execute, "_trial_worker", _no_rerun)
    again = verify.verify_trials([_plan()], "sim", traces, jobs=1, progress=False)
    assert (again.total, again.fresh) == (0, 4)
    assert again.fresh_line() == "4 trials fresh: verified by this code on this machine, not rerun; --force reruns"
    with pytest.raises(AssertionError, match="fresh"):
        verify.verify_trials([_plan()], "sim", traces, jobs=1, progress=False, force=True)


def test_the_record_is_deterministic(traces):
    verify.verify_trials([_plan()], "sim", traces, jobs=1, progress=False)
    record = verified.record_path("sim")
    first = record.read_bytes()
    rec = json.loads(first)
    entries = {tuple(k.rsplit("/", 2)[:2]) + (int(k.rsplit("-", 1)[1]),): v for k, v in rec["trials"].items()}
    record.unlink()
    verified.write_record(record, rec["code"], dict(reversed(list(entries.items()))))
    assert record.read_bytes() == first
    text = first.decode()
    assert str(traces) not in text and "time" not in text and text.endswith("}\n")


def test_a_changed_code_config_or_trace_byte_makes_a_trial_not_fresh(traces):
    plans = [_plan()]
    verify.verify_trials(plans, "sim", traces, jobs=1, progress=False)
    rec = verified.load_record(verified.record_path("sim"))
    code = fingerprint.code_fingerprint("trial")
    assert len(verified.fresh_trials(rec, plans, "sim", traces, code)) == 4
    assert verified.fresh_trials(rec, plans, "sim", traces, "f" * 64) == {}  # other code: nothing is fresh
    cfg = pipeline.prepare_config(EXP, "sim", overrides={**TINY, "workload.output_tokens": 9})
    other = [(cfg, pipeline.select_arms(cfg, None), [801, 802])]
    assert verified.fresh_trials(rec, other, "sim", traces, code) == {}  # another configuration
    doc = pipeline.prepare_config(EXP, "sim", overrides={**TINY, "description": "reworded"})
    assert len(verified.fresh_trials(rec, [(doc, ["baseline", "dlfp"], [801, 802])], "sim", traces, code)) == 4
    _flip_last_byte(trial_dir(traces, "sim", EXP, "baseline", 802) / "iterations.parquet")
    fresh = verified.fresh_trials(rec, plans, "sim", traces, code)
    assert (EXP, "baseline", 802) not in fresh and len(fresh) == 3
    res = verify.verify_trials(plans, "sim", traces, jobs=1, progress=False)
    assert (res.fresh, res.total, list(res.replaced)) == (3, 1, [f"sim/{EXP}/baseline/seed-802"])
    rec = verified.load_record(verified.record_path("sim"))
    assert len(verified.fresh_trials(rec, plans, "sim", traces, code)) == 4  # the replaced trial is recorded


# --------------------------------------------------------------------------- digest cache


def test_the_digest_cache_serves_unchanged_trials_and_never_a_changed_or_corrupt_one(tmp_path, monkeypatch):
    traces = tmp_path / "traces"
    write_fake_experiment(traces, EXP)
    old = tmp_path / "cache" / "digests" / ("0" * 16) / "ab" / "ab12.pkl"  # digests of other code
    old.parent.mkdir(parents=True)
    old.write_bytes(b"old")
    first = tables.headline_per_seed(tables.load_traces(traces, workers=1))
    assert len(list((tmp_path / "cache" / "digests").rglob("*.pkl"))) == len(find_trials(traces))
    assert not old.exists()  # one generation kept: this code's

    def computed(path):
        raise AssertionError(f"{path} computed although cached")

    with monkeypatch.context() as m:
        m.setattr(loading, "_compute_digest", computed)
        ts = tables.load_traces(traces, workers=1)
        pd.testing.assert_frame_equal(tables.headline_per_seed(ts), first)
        assert isinstance(ts.trials[0].trial, digest_cache.LazyTrial)
        assert len(ts.trials[0].trial.iterations) == 30  # frames read on first use
    bad = trial_dir(traces, "sim", EXP, "dlfp", 803) / "tokens.parquet"
    _flip_last_byte(bad)
    with pytest.raises(tables.PartialTraceSet, match=f"{EXP}/dlfp/seed-803"):
        tables.load_traces(traces, workers=1)
    _flip_last_byte(bad)  # back as it was: served from the cache again
    for f in (tmp_path / "cache" / "digests").rglob("*.pkl"):
        _flip_last_byte(f)  # a damaged cache file is not used: recomputed, same tables
    pd.testing.assert_frame_equal(tables.headline_per_seed(tables.load_traces(traces, workers=1)), first)
