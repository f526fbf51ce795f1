"""The shipped simulator traces are what the code computes: two complete experiments (every arm, every seed)
regenerated from scratch match the committed traces byte for byte (Parquet) and in every metadata field that
describes the trial (``dlfp.traces.compare``), on the compiled core (the default) and on the Python reference path
(``DLFP_SIM_CORE=reference``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlfp.traces.compare import comparable_metadata, tree_differences, trial_differences

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "data" / "traces"
# one async and one sync experiment; together they exercise every policy of the matrix
EXPERIMENTS = ("qwen3-0.6b-tp1", "qwen3-32b-tp2-completion-sync")


@pytest.mark.slow
@pytest.mark.parametrize("core", ["compiled", "reference"])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_a_fresh_run_reproduces_the_committed_traces_byte_for_byte(experiment, core, tmp_path):
    shipped = TRACES / "sim" / experiment
    expected_trials = sorted(p.parent.relative_to(shipped) for p in shipped.rglob("metadata.json"))
    assert len(expected_trials) >= 48, "the committed experiment is incomplete"
    subprocess.run([sys.executable, "-m", "dlfp.cli", "run", experiment, "--backend", "sim", "--out", str(tmp_path),
                    "--force", "--no-progress"], check=True, cwd=REPO, capture_output=True,
                   env={**os.environ, "DLFP_SIM_CORE": core})
    fresh = tmp_path / "sim" / experiment
    assert sorted(p.parent.relative_to(fresh) for p in fresh.rglob("metadata.json")) == expected_trials
    assert tree_differences(shipped, fresh) == {}


def _fake_trial(d: Path, commit: str, seed_value: int) -> None:
    d.mkdir(parents=True)
    for name in ("requests.parquet", "tokens.parquet", "iterations.parquet"):
        (d / name).write_bytes(b"PAR1" + bytes([seed_value]) + b"PAR1")
    (d / "metadata.json").write_text(json.dumps({"git_commit": commit, "versions": {"numpy": commit}, "seed": 801,
                                                 "config": {"description": commit, "tp": 1}}))


def test_provenance_and_free_text_do_not_count_but_any_byte_of_data_does(tmp_path):
    _fake_trial(tmp_path / "a", "abc", 1)
    _fake_trial(tmp_path / "b", "def", 1)
    assert trial_differences(tmp_path / "a", tmp_path / "b") == []
    assert comparable_metadata(tmp_path / "a" / "metadata.json") == {"seed": 801, "config": {"tp": 1}}
    _fake_trial(tmp_path / "c", "abc", 2)
    assert trial_differences(tmp_path / "a", tmp_path / "c") == ["requests.parquet", "tokens.parquet",
                                                                 "iterations.parquet"]
    md = json.loads((tmp_path / "c" / "metadata.json").read_text())
    md["config"]["tp"] = 2
    (tmp_path / "c" / "metadata.json").write_text(json.dumps(md))
    assert "metadata.json" in trial_differences(tmp_path / "a", tmp_path / "c")
