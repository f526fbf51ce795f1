"""Pipeline and CLI: resume/skip/force, corrupt and stale trials, interrupted runs, backend choice, bad input.

The engine is replaced by a tiny fake backend (``fake_trial``) that fabricates
a small valid trial whose numbers are known by construction; the other test
modules import ``fake_trial``/``install_fake_backend`` from here.
"""
from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dlfp import pipeline, backends as runners
from dlfp.cli import main
from dlfp.config import EXPERIMENTS_ENV, ConfigError, load_experiment
from dlfp.traces.format import (Trial, find_trials, is_complete,
                         load_trial, trial_dir, write_trial)

EXP = "qwen3-0.6b-tp1"
#: The paper's two arms (configs may carry more, e.g. DLFP-S ablations).
TWO_ARMS = {"baseline": {"policy": "nocap"}, "dlfp": {"policy": "dlfp"}}
SMALL = {"workload.num_requests": 4, "workload.num_warmup": 1, "workload.output_tokens": 6,
         "backend_options.frontier_caps": [], "arms": TWO_ARMS}


# --------------------------------------------------------------------------- the fake backend


def spike_s(arm: str, seed: int) -> float:
    """The single large gap (s) every measured request of a fake trial has: dlfp halves the baseline's."""
    base = 0.200 + 0.010 * (seed - 800)
    return base / 2 if arm != "baseline" else base


def ttft_s(arm: str, seed: int, i: int) -> float:
    """TTFT (s) of measured request ``i`` of a fake trial: dlfp adds 20 ms."""
    return 0.050 + 0.010 * (i % 5) + 0.001 * (seed - 800) + (0.020 if arm != "baseline" else 0.0)


GAP_S = 0.010  # every other gap of a fake trial
JOULES = {"baseline": 100.0, "dlfp": 110.0}


def fake_trial(cfg, arm: str, seed: int, progress=None, *, flip_tokens: int = 0, async_lag: bool = False) -> Trial:
    """A small valid trial with known numbers.

    Requests: ``num_warmup`` warm-ups then ``num_requests`` measured ones, one
    per second. Each emits ``output_tokens`` tokens: first at arrival + ttft_s,
    then gaps of GAP_S except one gap of spike_s at index 2. Token ids depend
    on the seed only (so arms agree), except that ``flip_tokens`` tokens of the
    first measured request differ in a non-baseline arm. Iterations: 30, with
    device time 40..100 ms; host interval = own device time (sync) or the
    previous one (``async_lag``); the non-baseline arm is guarded every
    iteration with a cap stepping down by 128 tokens.
    """
    wl = cfg.workload
    nw, nm, k = wl.num_warmup, wl.num_requests, wl.output_tokens
    rng = np.random.default_rng(seed)
    req, tok = [], []
    for j in range(nw + nm):
        rid = f"r{j:04d}"
        warm = j < nw
        i = j - nw
        arr = float(j)
        req.append(dict(request_id=rid, arrival_s=arr, prompt_tokens=100 + j, output_tokens=k, warmup=warm,
                        finished=True, fingerprint=f"fp-{seed}"))
        t = arr + (0.05 if warm else ttft_s(arm, seed, i))
        ids = rng.integers(10, 1000, size=k)
        if arm != "baseline" and i == 0 and flip_tokens:
            ids[:flip_tokens] += 1
        for idx in range(k):
            if idx > 0:
                t += spike_s(arm, seed) if idx == 2 else GAP_S
            tok.append(dict(request_id=rid, index=idx, token_id=int(ids[idx]), time_s=t))
        if progress:
            progress(j + 1, nw + nm)
    dev = np.array([0.040 + 0.010 * ((3 * m) % 7) for m in range(30)])
    host = np.r_[dev[0], dev[:-1]] if async_lag else dev.copy()
    guarded = arm != "baseline"
    cap = pd.array([3072 - 128 * (m % 5) if guarded else None for m in range(30)], dtype="Int64")
    sched = np.r_[0.0, np.cumsum(host)[:-1]]
    its = pd.DataFrame(dict(
        iteration=np.arange(30), schedule_s=sched, prefill_tokens=np.full(30, 512), num_prefills=np.ones(30, int),
        num_decodes=np.full(30, 2), cap=cap, cap_after=cap, guarded=np.full(30, guarded),
        signal=["host_cadence"] * 30, observed_interval_s=host if guarded else np.full(30, np.nan),
        host_interval_s=host, device_time_s=dev, issue_s=sched, device_start_s=sched, device_end_s=sched + dev,
        energy_j=np.full(30, np.nan)))
    md = dict(format_version=1, experiment=cfg.name, arm=arm, seed=seed, backend="sim", versions={},
              hardware={"fake": True}, git_commit="test", workload_fingerprint=f"fp-{seed}",
              policy=cfg.arms[arm].model_dump(mode="json"), config=cfg.model_dump(mode="json"),
              energy={"joules": JOULES.get(arm, 120.0)}, clock="fake")
    return Trial(pd.DataFrame(req), pd.DataFrame(tok), its, md)


def install_fake_backend(monkeypatch, calls: list | None = None, fail_on: int | None = None, **kw):
    """Make every backend name resolve to the fake one; record (arm, seed) calls; optionally interrupt."""
    def run_trial(cfg, arm, seed, progress=None):
        if calls is not None:
            calls.append((arm, seed))
            if fail_on is not None and len(calls) == fail_on:
                raise KeyboardInterrupt
        return fake_trial(cfg, arm, seed, progress, **kw)

    monkeypatch.setattr(runners, "backend_module", lambda backend: types.SimpleNamespace(run_trial=run_trial))
    monkeypatch.setenv(pipeline.BACKEND_ENV, "sim")
    monkeypatch.setenv(pipeline.JOBS_ENV, "1")  # the fake backend lives in this process only


def declare_experiment(cfg) -> None:
    """Declare ``cfg`` as its experiment for the rest of the test (a YAML in ``$DLFP_EXPERIMENTS_DIR``, which
    ``conftest.declared_experiments`` gives every test)."""
    import os

    import yaml

    folder = Path(os.environ[EXPERIMENTS_ENV])
    (folder / f"{cfg.name}.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=True))


def write_fake_experiment(root: Path, experiment: str = EXP, seeds=(801, 802, 803), overrides=None, **kw) -> None:
    """Write fake trials of every arm x seed of ``experiment`` under ``root`` (no backend involved), and declare
    their smaller settings as the experiment's (``declare_experiment``)."""
    import os

    shipped = Path(os.environ[EXPERIMENTS_ENV]) / f"{experiment}.yaml"
    shipped.unlink(missing_ok=True)  # start from the package's declaration
    cfg = load_experiment(experiment, {**SMALL, **(overrides or {})})
    declare_experiment(cfg)
    for seed in seeds:
        for arm in cfg.arms:
            write_trial(fake_trial(cfg, arm, seed, **kw), root)


def declare_small(extra=None):
    """Declare ``EXP`` with the ``SMALL`` settings (and ``extra``) for the rest of the test; returns its config."""
    import os

    (Path(os.environ[EXPERIMENTS_ENV]) / f"{EXP}.yaml").unlink(missing_ok=True)
    cfg = load_experiment(EXP, {**SMALL, **(extra or {})})
    declare_experiment(cfg)
    return cfg


# --------------------------------------------------------------------------- resume / skip / force


def test_run_writes_every_arm_and_seed_then_skips_then_forces(tmp_path, monkeypatch):
    calls: list = []
    install_fake_backend(monkeypatch, calls)
    declare_small()
    run = pipeline.run_experiment(EXP, out_dir=tmp_path, progress=False)
    # Seed-major order: both arms of a seed before the next seed (pairs survive an interruption).
    assert calls == [("baseline", 801), ("dlfp", 801), ("baseline", 802), ("dlfp", 802), ("baseline", 803),
                     ("dlfp", 803)]
    assert [o.status for o in run.outcomes] == ["ran"] * 6
    dirs = find_trials(tmp_path)
    assert len(dirs) == 6 and all(is_complete(d) for d in dirs)
    t = load_trial(trial_dir(tmp_path, "sim", EXP, "dlfp", 802))
    assert t.metadata["config"]["workload"]["num_requests"] == 4 and len(t.tokens) == (4 + 1) * 6

    again = pipeline.run_experiment(EXP, out_dir=tmp_path, progress=False)
    assert len(calls) == 6  # nothing re-ran
    assert [o.status for o in again.outcomes] == ["skipped"] * 6

    forced = pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[802], force=True, progress=False)
    assert calls[6:] == [("baseline", 802), ("dlfp", 802)]
    assert [(o.arm, o.seed, o.status) for o in forced.outcomes] == [("baseline", 802, "ran"), ("dlfp", 802, "ran")]


def test_corrupt_trial_is_named_and_rerun(tmp_path, monkeypatch, capsys):
    calls: list = []
    install_fake_backend(monkeypatch, calls)
    declare_small()
    pipeline.run_experiment(EXP, out_dir=tmp_path, progress=False)
    bad = trial_dir(tmp_path, "sim", EXP, "dlfp", 803)
    (bad / "tokens.parquet").write_bytes(b"not parquet")
    assert not is_complete(bad)
    run = pipeline.run_experiment(EXP, out_dir=tmp_path, progress=False)
    assert calls[6:] == [("dlfp", 803)]
    assert [o.status for o in run.outcomes].count("reran") == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "corrupt" in err and "tokens.parquet" in err
    assert is_complete(bad)


def test_trial_with_a_different_config_is_stale_and_rerun(tmp_path, monkeypatch):
    calls: list = []
    install_fake_backend(monkeypatch, calls)
    declare_small()
    pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[801], progress=False)
    declare_small({"workload.num_requests": 5})  # the experiment's YAML changed
    run = pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[801], progress=False)
    assert [o.status for o in run.outcomes] == ["reran", "reran"]
    assert "workload.num_requests" in run.outcomes[0].reason
    assert load_trial(trial_dir(tmp_path, "sim", EXP, "baseline", 801)).measured_requests.shape[0] == 5


def test_config_mismatch_ignores_other_arms_and_docs():
    cfg = load_experiment(EXP)
    md = {"config": cfg.model_dump(mode="json")}
    assert pipeline.config_mismatch(md, cfg, "baseline") == []
    # An extra arm (e.g. DLFP-S added later) and a new description must not invalidate existing trials.
    changed = cfg.with_overrides({"description": "new words", "arms.dlfps": {"policy": "fixed", "cap": 512}})
    assert pipeline.config_mismatch(md, changed, "baseline") == []
    tuned = cfg.with_overrides({"arms.dlfp.target_s": 0.05})
    assert pipeline.config_mismatch(md, tuned, "dlfp") == ["arms.dlfp.target_s"]
    assert pipeline.config_mismatch(md, tuned, "baseline") == []
    assert pipeline.config_mismatch({"config": "opaque"}, tuned, "dlfp") == []


def test_interrupted_run_keeps_completed_trials_and_resumes(tmp_path, monkeypatch):
    calls: list = []
    install_fake_backend(monkeypatch, calls, fail_on=3)
    declare_small()
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_experiment(EXP, out_dir=tmp_path, progress=False)
    done = find_trials(tmp_path)
    assert [d.relative_to(tmp_path).as_posix() for d in done] == [f"sim/{EXP}/baseline/seed-801",
                                                                  f"sim/{EXP}/dlfp/seed-801"]
    # No temporary or partial directory is left behind.
    leftovers = [p for p in (tmp_path / "sim" / EXP).rglob("*") if p.name.startswith(".")]
    assert leftovers == []
    calls.clear()
    install_fake_backend(monkeypatch, calls)
    run = pipeline.run_experiment(EXP, out_dir=tmp_path, progress=False)
    assert calls == [("baseline", 802), ("dlfp", 802), ("baseline", 803), ("dlfp", 803)]
    assert [o.status for o in run.outcomes] == ["skipped", "skipped", "ran", "ran", "ran", "ran"]


def test_progress_reports_requests_done_of_total(tmp_path, monkeypatch):
    seen = []
    install_fake_backend(monkeypatch)
    declare_small()

    class Bar:
        def __init__(self, *a, total=None, **k):
            self.total, self.n, self.desc = total, 0, k.get("desc", "")
            self.it = a[0] if a else None

        def __iter__(self):
            return iter(self.it)

        def update(self, k):
            self.n += k
            seen.append((self.desc.strip(), self.n, self.total))

        def refresh(self):
            pass

        def set_postfix_str(self, s):
            pass

        def close(self):
            pass

    import tqdm

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[801], arms=["dlfp"], progress=True)
    # 1 warm-up + 4 measured requests, one update per finished request, with the experiment/arm/seed named;
    # then the trials bar counts the one trial done.
    assert seen == [(f"{EXP} dlfp seed 801", n, 5) for n in range(1, 6)] + [(f"{EXP} [sim] trials", 1, 1)]


# --------------------------------------------------------------------------- backend choice, overrides, matrix


def test_resolve_backend(monkeypatch):
    from dlfp.pipeline import plan

    monkeypatch.delenv(pipeline.BACKEND_ENV, raising=False)
    monkeypatch.setattr(plan, "gpu_present", lambda: False)
    monkeypatch.setattr(plan, "software_present", lambda backend: True)
    assert pipeline.resolve_backend(None) == "sim"
    assert pipeline.resolve_backend("auto") == "sim"
    monkeypatch.setattr(plan, "gpu_present", lambda: True)
    assert pipeline.resolve_backend("auto") == "vllm"
    monkeypatch.setattr(plan, "software_present", lambda backend: backend.name == "sim")  # no vLLM installed
    assert pipeline.resolve_backend("auto") == "sim"
    monkeypatch.setenv(pipeline.BACKEND_ENV, "emu")
    assert pipeline.resolve_backend(None) == "emu"
    assert pipeline.resolve_backend("auto") == "emu"  # `make run-all` passes --backend auto by default
    assert pipeline.resolve_backend("sim") == "sim"  # an explicit flag beats the environment
    with pytest.raises(pipeline.PipelineError, match="'gpu'"):
        pipeline.resolve_backend("gpu")


def test_auto_choice_is_registry_data():
    from dlfp.backends import REGISTRY, Backend, get_backend, register

    assert pipeline.software_present(get_backend("sim"))  # needs nothing beyond the base install
    assert [b.name for b in REGISTRY.values() if b.auto == "default"] == [pipeline.auto_backend(gpu=False)]
    fields = dict(runner="x", parallel_safe=False, real_time=False, needs_gpu=False, hardware_matched=False,
                  modelled_outputs=False, frontier_by_default=False, description="x", requires=())
    with pytest.raises(ValueError, match="auto='sometimes'"):
        register(Backend("new", auto="sometimes", **fields))
    with pytest.raises(ValueError, match="already auto='default'"):
        register(Backend("new", auto="default", **fields))
    assert "new" not in REGISTRY


def test_parse_overrides():
    assert pipeline.parse_overrides(["workload.num_requests=5", "workload.rate=0.5", "force=true",
                                     "seeds=[801, 802]", "name=abc"]) == {
        "workload.num_requests": 5, "workload.rate": 0.5, "force": True, "seeds": [801, 802], "name": "abc"}
    with pytest.raises(pipeline.PipelineError, match="'workload.num_requests'"):
        pipeline.parse_overrides(["workload.num_requests"])


def test_quick_caps_measured_requests():
    cfg = load_experiment(EXP)
    assert pipeline.quick_overrides(cfg) == {"workload.num_requests": pipeline.QUICK_NUM_REQUESTS}
    small = cfg.with_overrides({"workload.num_requests": 7})
    assert pipeline.quick_overrides(small) == {}
    assert pipeline.load_config(EXP, quick=True).workload.num_requests == pipeline.QUICK_NUM_REQUESTS


def test_default_matrix_respects_backend_tags_and_hardware():
    from dlfp import config

    for backend in ("sim", "emu"):
        matrix = pipeline.default_matrix(backend, gpu=False)
        for n in config.list_experiments():
            only = pipeline.experiment_backends(n)
            assert (n in matrix) == (only is None or backend in only), (backend, n, only)
    assert "qwen3-0.6b-tp1" in pipeline.default_matrix("sim")
    # vLLM without a GPU runs only the CPU experiments; with a GPU only the GPU ones.
    cpu_only = pipeline.default_matrix("vllm", gpu=False)
    assert cpu_only and all(load_experiment(n).gpu == "cpu" for n in cpu_only)
    assert all(load_experiment(n).gpu != "cpu" for n in pipeline.default_matrix("vllm", gpu=True))


def test_frontier_arms(tmp_path, monkeypatch):
    cfg = load_experiment(EXP)
    caps = cfg.backend_options["frontier_caps"]
    ov = pipeline.frontier_overrides(cfg)
    assert ov == {f"arms.fixed-{c}": {"policy": "fixed", "cap": c} for c in caps}
    calls: list = []
    install_fake_backend(monkeypatch, calls)
    declare_small({"backend_options.frontier_caps": [2048, 512]})
    pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[801], frontier=True, progress=False)
    # Baseline first, then named arms, then fixed caps in cap order.
    assert calls == [("baseline", 801), ("dlfp", 801), ("fixed-512", 801), ("fixed-2048", 801)]
    t = load_trial(trial_dir(tmp_path, "sim", EXP, "fixed-512", 801))
    assert t.metadata["policy"] == {**t.metadata["policy"], "policy": "fixed", "cap": 512}
    # Running without the frontier afterwards leaves the existing baseline/dlfp trials valid (skipped).
    run = pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[801], frontier=False,
                                  progress=False)
    assert [o.status for o in run.outcomes] == ["skipped", "skipped"]
    with pytest.raises(pipeline.PipelineError, match="frontier_caps"):
        pipeline.frontier_overrides(cfg.with_overrides({"backend_options.frontier_caps": ["big"]}))


# --------------------------------------------------------------------------- CLI


def test_cli_unknown_experiment_is_one_line_exit_2(capsys):
    assert main(["run", "qwen3-7b-nonexistent", "--backend", "sim"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "qwen3-7b-nonexistent" in err[0] and EXP in err[0] and "Traceback" not in err[0]


def test_cli_run_all_rejects_unknown_experiment_before_running(capsys, monkeypatch):
    ran = []
    from dlfp.pipeline import execute

    monkeypatch.setattr(execute, "execute_experiment_notebook_checked", lambda *a, **k: ran.append(a))
    assert main(["run-all", "--backend", "sim", "--experiments", EXP, "nope-exp"]) == 2
    assert ran == []
    assert "nope-exp" in capsys.readouterr().err


def test_cli_bad_override_and_missing_traces(capsys, tmp_path):
    assert main(["run", EXP, "--backend", "sim", "--set", "workload.no_such_field=3"]) == 2
    assert "no_such_field" in capsys.readouterr().err
    missing = tmp_path / "nothing-here"
    assert main(["figures", "--traces", str(missing), "--out", str(tmp_path / "r")]) == 2
    assert str(missing) in capsys.readouterr().err


def test_cli_run_with_fake_backend(tmp_path, monkeypatch, capsys):
    calls: list = []
    install_fake_backend(monkeypatch, calls)
    args = ["run", EXP, "--out", str(tmp_path), "--seeds", "801", "--no-progress"] + sum(
        (["--set", f"{k}={v}"] for k, v in SMALL.items()), [])
    assert main(args) == 0
    assert calls == [("baseline", 801), ("dlfp", 801)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "2 ran" in out and "2 skipped" in out


def test_console_script_is_installed_and_exits_2():
    exe = Path(sys.executable).with_name("dlfp")
    if not exe.exists():
        pytest.skip("dlfp console script not installed in this environment (pip install -e .)")
    r = subprocess.run([str(exe), "run", "no-such-exp"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "no-such-exp" in r.stderr and "Traceback" not in r.stderr


def test_unknown_arm_is_named(tmp_path, monkeypatch):
    install_fake_backend(monkeypatch)
    with pytest.raises(pipeline.PipelineError, match="nope"):
        pipeline.run_experiment(EXP, out_dir=tmp_path, arms=["nope"], progress=False)
    with pytest.raises(ConfigError, match="nope-exp"):
        pipeline.run_experiment("nope-exp", out_dir=tmp_path, progress=False)


def test_cli_delegates_calibrate_and_validate_sim(monkeypatch, capsys):
    import dlfp.studies.calibration
    import dlfp.studies.validation

    seen = []
    monkeypatch.setattr(dlfp.studies.calibration, "main_calibrate", lambda argv: seen.append(("cal", argv)) or 0)
    monkeypatch.setattr(dlfp.studies.validation, "main_validate", lambda argv: seen.append(("val", argv)) or 3)
    assert main(["calibrate", "--quick", "-h"]) == 0
    assert main(["validate-sim", "--experiment", "cpu-tiny"]) == 3
    assert seen == [("cal", ["--quick", "-h"]), ("val", ["--experiment", "cpu-tiny"])]
    from dlfp import cli

    monkeypatch.setitem(cli._DELEGATED, "calibrate", ("stats", "no_such_function"))
    assert main(["calibrate"]) == 2
    assert "not available" in capsys.readouterr().err


# --------------------------------------------------------------------------- robustness


def test_seeds_must_be_non_negative_and_extra_seeds_are_noted(tmp_path, monkeypatch, capsys):
    calls: list = []
    install_fake_backend(monkeypatch, calls)
    declare_small()
    with pytest.raises(pipeline.PipelineError) as ei:
        pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[801, -1], progress=False)
    assert str(ei.value) == f"seeds [-1] of experiment '{EXP}': seeds are non-negative integers"
    assert calls == [] and not (tmp_path / "sim").exists()
    run = pipeline.run_experiment(EXP, out_dir=tmp_path, seeds=[999], progress=False)
    assert [o.seed for o in run.outcomes] == [999, 999]
    err = capsys.readouterr().err
    assert f"dlfp: note: seed(s) 999 are not among {EXP}'s paired seeds 801, 802, 803" in err


def test_out_dir_that_is_a_file_is_rejected_before_running(tmp_path, monkeypatch):
    calls: list = []
    install_fake_backend(monkeypatch, calls)
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(pipeline.PipelineError) as ei:
        pipeline.run_experiment(EXP, out_dir=f, overrides=SMALL, progress=False)
    assert str(ei.value) == f"traces directory (--out) {f} is not a directory"
    with pytest.raises(pipeline.PipelineError) as ei:
        pipeline.run_experiment(EXP, out_dir=f / "sub", overrides=SMALL, progress=False)
    assert str(ei.value) == f"traces directory (--out) {f / 'sub'} is not a directory ({f} is a file)"
    assert calls == [] and f.read_text() == "x"


class _InterruptingBar:
    """A progress bar whose first update is a Ctrl-C (after the first trial finished and was written)."""

    def update(self, n):
        raise KeyboardInterrupt

    def set_postfix_str(self, s):
        pass


def test_ctrl_c_stops_parallel_trials_and_keeps_completed_ones(tmp_path):
    import multiprocessing as mp

    cfg = load_experiment("cpu-tiny", {"workload.num_requests": 30, "workload.num_warmup": 0,
                                       "backend_options.frontier_caps": []})
    seeds = range(801, 821)
    todo = [(seed, arm, trial_dir(tmp_path, "sim", cfg.name, arm, seed), "missing", "")
            for seed in seeds for arm in ("baseline", "dlfp")]
    run = pipeline.ExperimentRun(config=cfg, backend="sim", traces_dir=tmp_path)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_parallel(cfg, "sim", tmp_path, todo, 1, run, _InterruptingBar())
    assert mp.active_children() == []  # the worker was terminated and reaped, not left running
    done = find_trials(tmp_path)
    # the first finished trial interrupts; how many more the worker finished before the parent saw it depends on
    # the machine's load, but the 40 trials are never all run, and whatever is on disk is whole
    assert 1 <= len(done) < len(todo)
    assert all(is_complete(d) for d in done)
    assert not list(tmp_path.rglob(".seed-*"))  # no half-written temporaries


def test_config_object_too_long_for_max_model_len_is_rejected_before_running(tmp_path, monkeypatch):
    calls: list = []
    install_fake_backend(monkeypatch, calls)
    cfg = load_experiment(EXP, SMALL).model_copy(update={"max_model_len": 1000})  # bypasses validation
    with pytest.raises(ConfigError, match=r"field max_model_len: 1000 is shorter than the longest request: "
                                          r"workload\.max_prompt_tokens \(40832 after clipping\)"):
        pipeline.run_experiment(cfg, out_dir=tmp_path, progress=False)
    assert calls == [] and not tmp_path.joinpath("sim").exists()
