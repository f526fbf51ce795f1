"""The compiled simulator core equals the Python reference path bit for bit: whole runs over every mechanism it
covers (both loops, preemption with and without prefix caching, the API server, closed loops, eager launches,
NoCap, FixedCap, DLFP on both signals and DLFP-G with each ablation), the policies' state after a run, and its
device-time pieces against the attention model's own functions.
The shipped traces are checked on both paths by ``test_regeneration``."""
from __future__ import annotations

import heapq
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlfp import policies as ctl
from dlfp.backends.sim import SimEngine, compiled
from dlfp.backends.sim.compiled import device as cdev
from dlfp.backends.sim.compiled import layout as L
from dlfp.devices import roofline as cm
from dlfp.devices.frontend import frontend_costs
from dlfp.policies.base import decisions_frame
from dlfp.policies.dlfpg import DLFPG
from test_sim import Req

REPO = Path(__file__).resolve().parents[1]


def workload(n: int = 60, rate: float = 4.0, seed: int = 5) -> list[Req]:
    """Poisson arrivals, prompts of 20-3,000 tokens and 2-150 outputs (enough to mix prefill and decode)."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n))
    return [Req(f"r{i}", float(t[i]), int(rng.integers(20, 3000)), int(rng.integers(2, 150))) for i in range(n)]


def both(make_engine, reqs, **kw):
    """The same run on the reference and the compiled path, each on a fresh engine and policy."""
    return make_engine().run(reqs, core="reference", **kw), make_engine().run(reqs, core="compiled", **kw)


def assert_same(ref, comp) -> None:
    assert comp.token_times == ref.token_times
    assert comp.iterations.equals(ref.iterations)
    assert (comp.energy_j, comp.busy_energy_j, comp.end_s) == (ref.energy_j, ref.busy_energy_j, ref.end_s)
    assert (comp.num_preemptions, comp.num_schedule_calls, comp.sent, comp.extra) == (
        ref.num_preemptions, ref.num_schedule_calls, ref.sent, ref.extra)
    assert (comp.finished == ref.finished).all()


def make(policy, *, scheduling="async", blocks=100_000, budget=2048, prefix=True, fe="none", eager=False,
         model="qwen3-0.6b", tp=1):
    dm = cm.device_model(model, "a100-sxm4-80gb", tp)

    def build():
        return SimEngine(dm, policy(), scheduling=scheduling, max_num_batched_tokens=budget, max_num_seqs=32,
                         num_gpu_blocks=blocks, prefix_caching=prefix, enforce_eager=eager,
                         frontend=frontend_costs(fe))
    return build


POLICIES = {"nocap": ctl.NoCap, "fixed": lambda: ctl.FixedCap(512),
            "dlfp": lambda: ctl.DLFP(target_s=0.004),
            "dlfp-device": lambda: ctl.DLFP(target_s=0.004, signal="device_completion"),
            "dlfpg": lambda: DLFPG(itl_target_s=0.01, ttft_budget_s=0.5),
            "dlfpg-no-estimate": lambda: DLFPG(itl_target_s=0.01, ttft_budget_s=0.5, use_estimate=False),
            "dlfpg-no-context": lambda: DLFPG(itl_target_s=0.01, ttft_budget_s=0.5, use_context=False),
            "dlfpg-no-budget": lambda: DLFPG(itl_target_s=0.01),
            "dlfpg-host-cadence": lambda: DLFPG(signal="host_cadence", itl_target_s=0.01, ttft_budget_s=0.5)}


@pytest.mark.parametrize("scheduling", ["sync", "async"])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_whole_runs_match_on_every_policy_and_loop(policy, scheduling):
    ref, comp = both(make(POLICIES[policy], scheduling=scheduling), workload())
    assert_same(ref, comp)
    assert ref.finished.all() and len(ref.iterations) > 100


@pytest.mark.parametrize("prefix", [True, False])
@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_preemption_with_and_without_prefix_caching_matches(prefix, scheduling):
    # 400 blocks of 16 tokens hold about two long requests: requests are preempted, and with prefix caching they
    # hit their own cached blocks when they resume
    ref, comp = both(make(POLICIES["dlfp"], scheduling=scheduling, blocks=400, prefix=prefix), workload(rate=8.0))
    assert_same(ref, comp)
    assert ref.num_preemptions > 10
    assert (ref.extra["num_cached_tokens_hit"] > 0) == prefix


@pytest.mark.parametrize("fe", ["completions", "completions_ids", "chat"])
def test_the_api_server_queue_matches(fe):
    ref, comp = both(make(POLICIES["fixed"], fe=fe), workload(rate=20.0))
    assert_same(ref, comp)


@pytest.mark.parametrize("concurrency", [1, 4])
def test_closed_loops_match(concurrency):
    ref, comp = both(make(POLICIES["dlfp"], fe="completions"), workload(n=30), concurrency=concurrency)
    assert_same(ref, comp)
    assert ref.sent is not None and ref.sent[0] == workload(n=30)[0].arrival_s


def test_eager_launches_and_tp2_match():
    ref, comp = both(make(POLICIES["nocap"], eager=True, model="qwen3-8b", tp=2, budget=8192), workload(rate=6.0))
    assert_same(ref, comp)


def _policies_after_both(policy):
    pols = []

    def build():
        pols.append(policy())
        return pols[-1]

    both(make(build, scheduling="async", blocks=400), workload(rate=8.0))
    return pols


def test_dlfp_ends_as_on_the_reference_path():
    ref, comp = _policies_after_both(POLICIES["dlfp"])
    assert comp.cap == ref.cap
    assert decisions_frame(comp).equals(decisions_frame(ref))
    assert {d.reason for d in ref.decisions} == {"unguarded", "proportional"}


def test_dlfpg_ends_as_on_the_reference_path():
    ref, comp = _policies_after_both(lambda: DLFPG(itl_target_s=0.02, ttft_budget_s=0.2))
    assert decisions_frame(comp).equals(decisions_frame(ref))
    assert (comp.estimator.theta, comp.estimator.P) == (ref.estimator.theta, ref.estimator.P)
    for attr in ("samples", "prefill_samples", "largest_prefill", "largest_prefill_s"):
        assert getattr(comp.estimator, attr) == getattr(ref.estimator, attr)
    assert (comp.chunk, comp.guard_grants, list(comp._issued)) == (ref.chunk, ref.guard_grants, list(ref._issued))
    # the run exercises the estimate, the TTFT guard and the reasons of iterations without a decision
    assert {"estimate", "ttft_guard", "no_cap", "no_prefill", "warmup"} <= {d.reason for d in ref.decisions}
    assert ref.guard_grants > 0
    assert ref._issued.maxlen == L.G_ISSUED


def test_a_policy_without_a_compiled_form_runs_on_the_reference_path_and_says_so_once(capsys):
    from dlfp.policies.dlfps import DLFPS

    compiled._NOTICED.clear()
    ref, comp = both(make(lambda: DLFPS(ttft_slo_s=0.5)), workload(n=20))
    assert_same(ref, comp)
    make(lambda: DLFPS(ttft_slo_s=0.5))().run(workload(n=20))
    err = capsys.readouterr().err
    assert err.count("policy 'dlfps' has no compiled form; simulating it on the reference path") == 1
    assert compiled.unsupported(make(POLICIES["dlfpg"])()) is None


def test_an_unknown_core_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv(compiled.CORE_ENV, "fast")
    with pytest.raises(ValueError, match=r"^environment variable DLFP_SIM_CORE: unknown core 'fast'; known: "):
        make(POLICIES["nocap"])().run(workload(n=3))
    with pytest.raises(ValueError, match="core: unknown 'jit'"):
        make(POLICIES["nocap"])().run(workload(n=3), core="jit")


def test_the_cli_refuses_an_unknown_core_in_one_line(tmp_path):
    env = {"PATH": "/usr/bin:/bin", compiled.CORE_ENV: "fast", "HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "dlfp.cli", "run", "cpu-tiny", "--backend", "sim", "--quick",
                        "--out", str(tmp_path), "--no-progress"], cwd=REPO, env=env, capture_output=True, text=True)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1].endswith("environment variable DLFP_SIM_CORE: unknown core 'fast'; "
                                                      "known: compiled, reference")
    assert not list(tmp_path.rglob("*.parquet"))


def _python_makespan(durations, workers):
    heap = [0.0] * workers
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(heap, heap[0] + d)
    return max(heap)


def test_makespan_is_cpythons_list_scheduling():
    rng = np.random.default_rng(0)
    for n, w in ((7, 3), (200, 108), (1000, 132), (5, 8)):
        d = np.sort(rng.integers(1, 50, n) * 1.7e-6)[::-1].copy()
        want = _python_makespan(list(d), w) if n > w else float(d.max())
        assert cdev.makespan_desc(d, w) == want


@pytest.mark.parametrize("model,tp", [("qwen3-0.6b", 1), ("qwen3-32b", 2)])
def test_attention_times_equal_the_attention_model(model, tp):
    eng = make(POLICIES["nocap"], model=model, tp=tp)()
    dm = eng.dm
    ci = compiled._int_config(eng, L.NOCAP, None)
    cf = compiled._float_config(eng, L.NOCAP)
    for c, p in ((1, 0), (127, 0), (128, 5), (129, 4000), (3000, 17), (8192, 30000)):
        assert cdev.prefill_time(ci, cf, c, p) == dm.att.prefill_time(c, p, tp)
    for d, ctx in ((1, 1), (3, 129), (64, 5000), (256, 40000)):
        assert cdev.decode_time(ci, cf, d, ctx) == dm._decode_time(d, ctx)
        assert math.isclose(dm._decode_time(d, ctx), dm.att.decode_time(d, ctx, tp), rel_tol=1e-12)


def test_cached_machine_code_is_dropped_when_any_source_of_the_core_changes(tmp_path, monkeypatch):
    # numba keys its cache by each function's own file; the core reads layout constants across files
    import shutil

    pkg = Path(compiled.__file__).parent
    for f in pkg.glob("*.py"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.setattr(compiled, "__file__", str(tmp_path / "__init__.py"))
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    (cache / "engine.simulate-1.py311.nbi").write_text("stale")
    compiled._drop_stale_cache()
    assert not (cache / "engine.simulate-1.py311.nbi").exists()
    (cache / "engine.simulate-1.py311.nbi").write_text("fresh")
    compiled._drop_stale_cache()  # the sources are as they were: the cache stays
    assert (cache / "engine.simulate-1.py311.nbi").exists()
    (tmp_path / "layout.py").write_text((tmp_path / "layout.py").read_text() + "\n# edited\n")
    compiled._drop_stale_cache()
    assert not (cache / "engine.simulate-1.py311.nbi").exists()
