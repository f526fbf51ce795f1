"""``dlfp audit``: which real-engine trials a host must (re)run, the replicate runs, the emulator traces it keeps,
its one-line refusals, and the calibration's cost form as written and quoted."""
from __future__ import annotations

import json

import pytest

from dlfp.paths import REPO_ROOT
from reproduce_quotes import quoted_block


def _write_small_trial(root, experiment: str = "cpu-tiny", arm: str = "baseline", seed: int = 801,
                       hardware: dict | None = None):
    """A complete trial (a 3-request simulator run of ``experiment``) under ``root`` as the vllm backend's."""
    from dlfp.backends.sim.runner import run_trial
    from dlfp.config import load_experiment
    from dlfp.traces.format import write_trial

    cfg = load_experiment(experiment, {"workload.num_requests": 3, "workload.num_warmup": 0})
    t = run_trial(cfg, arm, seed)
    t.metadata["backend"] = "vllm"
    if hardware is not None:
        t.metadata["hardware"] = hardware
    return write_trial(t, root, overwrite=True)


def _ident(bind: str) -> dict:
    return {"cpu_model": "CPU A", "vector_flags": "avx2", "logical_cpus": 2, "affinity": [0, 1],
            "torch": {"num_threads": 2, "num_interop_threads": 2, "cpu_capability": "AVX2"},
            "env": {"VLLM_CPU_OMP_THREADS_BIND": bind, "OMP_WAIT_POLICY": "PASSIVE"}}


def test_a_trial_runs_again_when_missing_or_recorded_on_another_host(tmp_path):
    from dlfp.hostinfo import host_key
    from dlfp.studies.validation_runs import needs_run, trial_host_key

    here, there = host_key(_ident("1")), host_key(_ident("0-1"))
    path = _write_small_trial(tmp_path, hardware={"cpu": "CPU A", "cpus": 2, "identity": _ident("1"),
                                                  "host_key": "stale key of an older definition"})
    assert trial_host_key(path) == here  # recomputed from the identity
    assert not needs_run(path, here) and needs_run(path, there)
    assert not needs_run(path, None)  # without a host to match, a complete trial is kept
    assert needs_run(tmp_path / "vllm" / "cpu-tiny" / "baseline" / "seed-802", here)  # missing
    legacy = _write_small_trial(tmp_path, seed=803, hardware={"cpu": "CPU A", "cpus": 2})
    assert trial_host_key(legacy) is None and needs_run(legacy, here)  # an unknown host is another host


def test_replicate_runs_are_numbered_trace_roots_loaded_in_run_order(tmp_path):
    from dlfp.studies.validation_runs import load_replicates, replicate_root, replicate_roots

    rep = tmp_path / "replicates"
    for n in (2, 1, 10):
        _write_small_trial(replicate_root(rep, n))
    (rep / "notes").mkdir()
    assert [p.name for p in replicate_roots(rep)] == ["1", "2", "10"]
    runs = load_replicates(rep, "cpu-tiny")
    assert len(runs) == 3 and all(set(r) == {("baseline", 801)} for r in runs)
    assert load_replicates(rep, "cpu-tiny", keys={("dlfp", 801): None}) == []
    assert replicate_roots(tmp_path / "absent") == []


def test_emulator_trials_over_another_profile_are_left_out():
    from types import SimpleNamespace

    from dlfp.devices import roofline as cm
    from dlfp.studies.validation_hosts import emu_over_profile

    fit = cm.load_gpu("cpu").fit
    same = SimpleNamespace(metadata={"hardware": {"gpu": {"fit": json.loads(json.dumps(fit, default=str))}}})
    other = SimpleNamespace(metadata={"hardware": {"gpu": {"fit": {"in_sample": {"n": 1}}}}})
    kept, left = emu_over_profile({("baseline", 801): same, ("dlfp", 801): other}, "cpu")
    assert list(kept) == [("baseline", 801)] and left == 1
    kept, left = emu_over_profile({("baseline", 801): other}, "a100")  # a datasheet GPU: nothing was measured
    assert list(kept) == [("baseline", 801)] and left == 0


@pytest.mark.parametrize("argv, expected", [
    (["--replicate-runs", "0"], "dlfp audit: --replicate-runs 0: at least 1 replicate run is needed"),
    (["--experiments", "no-such-workload"], "dlfp audit: "),
])
def test_bad_input_is_one_line_and_exit_2(argv, expected, capsys):
    from dlfp.studies.audit import main_audit

    assert main_audit(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(expected) and "\n" not in err


def test_the_profile_and_this_host_key_agree_in_form(monkeypatch):
    """This host's key (with the engine's thread pinning) is a sha256; the shipped profile's key is recomputed from
    its identity the same way (``record_key``)."""
    import os

    from dlfp.backends.vllm.runner import PINNED_ENV
    from dlfp.hostinfo import host_key
    from dlfp.studies.audit import profile_host_key, this_host_key

    for k in PINNED_ENV:  # restored after the test: pinning writes them into this process's environment
        monkeypatch.setenv(k, os.environ[k]) if k in os.environ else monkeypatch.delenv(k, raising=False)

    key = this_host_key()
    assert len(key) == 64 and int(key, 16) >= 0
    from dlfp.devices import roofline as cm

    assert profile_host_key() == host_key(cm.load_gpu("cpu").machine["identity"])


def test_cost_form_written_out_by_hand():
    from dlfp.studies.calibration.report import cost_form_markdown

    host = {"schedule_base_s": 1e-4, "schedule_per_req_s": 4e-6, "prep_base_s": 5e-4, "prep_per_req_s": 5e-6,
            "prep_per_token_s": 1.1e-7, "bookkeeping_base_s": 3e-4, "bookkeeping_per_req_s": 6.5e-6,
            "update_base_s": 8e-5, "update_per_req_s": 5e-6, "engine_loop_s": 1.3e-4, "frontend_output_s": 1.5e-3,
            "ingest_s": 6e-4}
    fitted = {"step_s": 7e-3, "per_token_s": 3e-4, "per_sampled_s": 8e-5, "per_attn_pair_s": 8.4e-8,
              "per_kv_token_s": 8.5e-7, "lm_head_rows": [1, 2], "lm_head_s": [6e-3, 7.5e-3]}
    med = {"schedule_cost_s": 1.5e-4, "prep_s": 5.3e-4, "forward_s": 1.2e-2, "logits_s": 9e-3, "sample_s": 6e-4,
           "bookkeeping_s": 3.4e-4, "update_s": 1.2e-4, "loop_s": 1.3e-4}
    stats = {"n": 10, "median_abs": 0.052, "p90_abs": 0.131}
    md = cost_form_markdown({"fitted": fitted, "host": host, "fit": {
        "in_sample": stats, "held_out": stats, "grid": {"part_medians_s": med, "whole_step": {"held_out": stats}}}})
    assert "| `Scheduler.schedule()` | `schedule_base_s` + `schedule_per_req_s` x (running + scheduled) | 100.0 us + " \
           "4.0 us | 150.0 us |" in md
    assert "| 7.00 ms + 300.0 us + 0.084 us + 0.850 us | 12.00 ms |" in md
    assert "6.00 ms (1 row), 7.50 ms (2 rows), ..." in md
    assert "| device time, held-out shapes | 10 | 5.2 % | 13.1 % |" in md


def test_committed_cost_form_regenerates_from_the_profile_and_reproduce_quotes_it():
    import yaml

    from dlfp.studies.calibration.profile import DEFAULT_KEY, DEFAULT_PROFILE
    from dlfp.studies.calibration.report import cost_form_markdown

    path = REPO_ROOT / "data" / "results" / "calibration" / "cost_form.md"
    prof = yaml.safe_load(DEFAULT_PROFILE.read_text())[DEFAULT_KEY]
    assert path.read_text() == cost_form_markdown(prof)
    assert quoted_block("calibration/cost_form.md") == path.read_text()
