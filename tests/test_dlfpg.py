"""DLFP-G (dlfp.policies.dlfpg): options, estimate, chunk choice, TTFT guard, reasons, and its backend plumbing.

Every expected chunk below is worked out by hand in the comments from the iteration-time law fed in; no timing
is measured.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from dlfp.config import ConfigError, load_experiment
from dlfp.policies.base import Observation, ScheduleContext, reason_runs
from dlfp.policies.dlfpg import DLFPG, CostEstimator, chunk_pairs

TARGET = 0.1  # decode-gap objective (s); with the default headroom 0.25 the aim is 0.075 s


def law(a=0.010, b=1e-5, c=0.0, d=1e-3, e=0.0):
    """T = a + b * prefill + c * pairs + d * decodes + e * decode context (seconds)."""
    return lambda p, pairs, nd, dctx: a + b * p + c * pairs + d * nd + e * dctx


def feed(pol: DLFPG, timing, samples) -> None:
    """Observe one completed iteration per ``(prefill, context, decodes, decode_context)``, timed by ``timing``."""
    for i, (p, ctx, nd, dctx) in enumerate(samples):
        pairs = chunk_pairs(p, ctx) if p else 0.0
        pol.observe(Observation(iteration=i, time_s=float(i), prefill_tokens=p, num_decodes=nd, cap=None,
                                device_time_s=timing(p, pairs, nd, dctx), prefill_pairs=pairs,
                                decode_context_tokens=dctx))


# (prefill, its context, decodes, their summed context): varied so that all five terms are identifiable
VARIED = [(8192, 0, 0, 0), (4096, 2000, 3, 900), (1024, 0, 1, 4000), (6000, 9000, 5, 2500), (2048, 500, 2, 6000),
          (512, 0, 7, 1500), (7000, 20000, 4, 12000), (3000, 100, 6, 3000), (0, 0, 8, 20000), (5000, 4000, 2, 700),
          (1500, 30000, 9, 9000), (2500, 0, 3, 15000)]


# ---------------------------------------------------------------------------- options


@pytest.mark.parametrize("opts, needle", [
    ({"itl_target_s": -1.0}, "dlfpg option itl_target_s"),
    ({}, "itl_target_s is required"),
    ({"itl_target_s": 0.1, "headroom": 1.0}, "dlfpg option headroom"),
    ({"itl_target_s": 0.1, "headroom": True}, "dlfpg option headroom"),
    ({"itl_target_s": 0.1, "min_chunk": 100}, "min_chunk=100 is not a multiple of quantum=128"),
    ({"itl_target_s": 0.1, "initial_chunk": 16384}, "initial_chunk=16384 is outside"),
    ({"itl_target_s": 0.1, "warmup": 3}, "dlfpg option warmup: unknown option"),
])
def test_bad_options_are_one_line_naming_the_option(opts, needle):
    with pytest.raises(ValueError) as ei:
        DLFPG(**opts)
    assert needle in str(ei.value) and "\n" not in str(ei.value)


def test_an_experiment_fills_the_objective_from_its_slo_and_rejects_a_bad_option():
    cfg = load_experiment("qwen3-8b-r0.10")
    assert cfg.arms["dlfpg"].options == {"itl_target_s": cfg.slo.itl_s, "ttft_budget_s": cfg.slo.ttft_s}
    assert cfg.arms["dlfpg-no-context"].options["use_context"] is False
    with pytest.raises(ConfigError, match=r"arms\.dlfpg\.options.*headroom"):
        load_experiment("qwen3-8b-r0.10", {"arms.dlfpg.options.headroom": 2.0})


# ---------------------------------------------------------------------------- estimate


def test_the_estimate_recovers_a_linear_cost_law_with_context():
    truth = law(a=0.004, b=2e-5, c=3e-10, d=2e-4, e=5e-8)
    est = CostEstimator(use_context=True, forgetting=1.0)
    for p, ctx, nd, dctx in VARIED * 3:
        pairs = chunk_pairs(p, ctx) if p else 0.0
        est.update(p, pairs, nd, dctx, truth(p, pairs, nd, dctx))
    # with forgetting 1 the recursion is ridge regression on the scaled features with penalty 1 / 1e4 (the prior
    # variance): the closed form, solved directly, gives the same coefficients; both are within 1 % of the law
    scale = np.array([1.0, 1e3, 1e6, 1e2, 1e5])
    X = np.array([[1.0, p, chunk_pairs(p, ctx) if p else 0.0, nd, dctx] for p, ctx, nd, dctx in VARIED * 3]) / scale
    y = np.array([truth(*(x * scale)[1:]) for x in X])
    ridge = np.linalg.solve(X.T @ X + np.eye(5) / 1e4, X.T @ y) / scale
    assert est.coef == pytest.approx(ridge, rel=1e-6)
    assert est.coef == pytest.approx([0.004, 2e-5, 3e-10, 2e-4, 5e-8], rel=1e-2)
    # 1,024 tokens after 30,000 cached, beside 4 decodes with 8,000 tokens of context:
    # 0.004 + 0.02048 + 3e-10 * (1024 * 30000 + 1024 * 1025 / 2) + 0.0008 + 0.0004 = 0.034999...
    pairs = 1024 * 30000 + 1024 * 1025 / 2
    assert est.predict(1024, pairs, 4, 8000) == pytest.approx(0.004 + 0.02048 + 3e-10 * pairs + 0.0008 + 0.0004,
                                                              rel=1e-4)
    assert est.largest_prefill == 8192 and est.prefill_samples == 33


def test_chunk_pairs_counts_causal_attention_pairs():
    # 3 new tokens after 2 cached: token k (1-based) attends to 2 + k positions: 3 + 4 + 5 = 12
    assert chunk_pairs(3, 2) == 12


# ---------------------------------------------------------------------------- the chunk


def test_the_chunk_is_the_largest_quantum_multiple_within_the_aim():
    pol = DLFPG(itl_target_s=TARGET)
    feed(pol, law(), VARIED)
    assert pol.estimate_ready
    # T(n) = 0.010 + 1e-5 n + 1e-3 * 4 <= 0.075  ->  n <= 6,100  ->  47 * 128 = 6,016
    assert pol.choose(4, ScheduleContext(0, 2000)) == (6016, "estimate")
    assert pol.prefill_cap(4, context=ScheduleContext(0, 2000)) == 6016
    brute = max(n for n in range(128, 8193, 128) if pol.predict_s(n, 0, 4, 2000) <= pol.aim_s)
    assert brute == 6016
    assert pol.prefill_cap(0) is None  # nothing decodes: no cap


def test_a_deep_context_makes_even_the_smallest_chunk_infeasible():
    pol = DLFPG(itl_target_s=TARGET)
    feed(pol, law(c=2e-9), VARIED)
    # 128 tokens after 300,000 cached: 0.010 + 0.00128 + 0.004 + 2e-9 * (128 * 300000 + 8256) = 0.0922 > 0.075
    assert pol.choose(4, ScheduleContext(300_000, 0)) == (128, "infeasible")
    # near the start of the same prompt the chunk is sized by the pairs term as well:
    # 0.014 + 1e-5 n + 2e-9 n (n + 1) / 2 <= 0.075 -> 1e-9 n^2 + 1e-5 n <= 0.061 -> n <= 4,273 -> 33 * 128 = 4,224
    assert pol.choose(4, ScheduleContext(0, 0)) == (4224, "estimate")


def test_without_context_conditioning_the_deep_context_is_invisible():
    pol = DLFPG(itl_target_s=TARGET, use_context=False)
    feed(pol, law(), VARIED)
    assert pol.choose(4, ScheduleContext(300_000, 0)) == pol.choose(4, ScheduleContext(0, 0)) == (6016, "estimate")


def test_the_estimate_is_not_trusted_far_beyond_the_largest_prefill_timed():
    pol = DLFPG(itl_target_s=TARGET)
    small = [(p, 0, nd, 0) for p, nd in [(256, 1), (512, 2), (384, 3), (640, 1), (768, 4), (128, 2), (896, 3),
                                         (1024, 1), (0, 2)]]
    feed(pol, law(), small)
    # the largest prefill timed is 1,024 tokens: at most 2 x 1,024 = 2,048 although 6,016 would fit the aim
    assert pol.choose(4, ScheduleContext(0, 0)) == (2048, "trust_limit")


def test_beyond_the_largest_prefill_the_prediction_scales_that_iteration():
    pol = DLFPG(itl_target_s=TARGET)
    # eight 1,024-token prefills alone took 0.0755 s each: a fit cannot split the fixed and per-token cost,
    # so 2,048 tokens are predicted at >= 0.0755 * 2 = 0.151 s, over the aim
    for i in range(8):
        pol.observe(Observation(iteration=i, time_s=float(i), prefill_tokens=1024, num_decodes=0, cap=None,
                                device_time_s=0.0755, prefill_pairs=chunk_pairs(1024, 0), decode_context_tokens=0))
    assert pol.predict_s(2048, 0, 0, 0) >= 0.151 - 1e-12
    chunk, _ = pol.choose(1, ScheduleContext(0, 0))
    assert chunk <= 1024


# ---------------------------------------------------------------------------- warm-up and the proportional law


def test_the_proportional_law_shrinks_on_any_timed_prefill_and_grows_only_on_a_full_chunk():
    pol = DLFPG(itl_target_s=TARGET, use_estimate=False)
    assert pol.prefill_cap(2) == 1024  # initial_chunk
    # an uncapped 1,024-token prefill took 0.15 s: 1024 * 0.075 / 0.15 = 512
    pol.observe(Observation(0, 0.0, 1024, 0, None, device_time_s=0.15))
    assert pol.chunk == 512
    # a 256-token chunk beside decodes came in short (0.02 s): smaller than the chunk, never grows it
    pol.observe(Observation(1, 1.0, 256, 3, 512, device_time_s=0.02))
    assert pol.chunk == 512
    # a full 512-token chunk took 0.03 s: 512 * 0.075 / 0.03 = 1,280, at most 2x: 1,024
    pol.observe(Observation(2, 2.0, 512, 3, 512, device_time_s=0.03))
    assert pol.chunk == 1024
    assert pol.decisions[-1].reason == "proportional"


# ---------------------------------------------------------------------------- TTFT guard


def test_the_ttft_guard_spends_bounded_slack_only_where_it_rescues_the_budget():
    pol = DLFPG(itl_target_s=TARGET, ttft_budget_s=2.0)
    feed(pol, law(d=0.0), VARIED)
    # T(n) = 0.010 + 1e-5 n; aim 0.075 -> 6,500 -> chunk 6,400; 100,000 tokens left = 16 x 0.074 = 1.184 s.
    ctx = ScheduleContext(0, 0)
    assert pol.prefill_cap(2, context=ctx, oldest_waiting_s=0.8, oldest_remaining_tokens=100_000) == 6400
    # waited 0.85 s: slack 1.15 s. 15 chunks of 6,784 (ceil(100000/15) -> 128s) take 15 x 0.07784 = 1.1676 > 1.15;
    # 14 chunks of 7,168 take 14 x 0.08168 = 1.1435 <= 1.15, and 0.08168 <= 2 x 0.1: granted
    assert pol.prefill_cap(2, context=ctx, oldest_waiting_s=0.85, oldest_remaining_tokens=100_000) == 7168
    assert pol.guard_grants == 1
    # waited 1.5 s: no chunk up to 8,192 (12 x 0.09192 = 1.10 s) rescues 0.5 s of slack: nothing granted
    assert pol.prefill_cap(2, context=ctx, oldest_waiting_s=1.5, oldest_remaining_tokens=100_000) == 6400
    # the budget already lost: nothing granted either
    assert pol.prefill_cap(2, context=ctx, oldest_waiting_s=2.5, oldest_remaining_tokens=100_000) == 6400


def test_the_ttft_guard_never_sizes_an_iteration_beyond_its_bound():
    pol = DLFPG(itl_target_s=TARGET, ttft_budget_s=2.0, ttft_guard_factor=1.0)
    feed(pol, law(d=0.0), VARIED)
    # the rescuing 7,168-token chunk takes 0.08168 s <= 1.0 x 0.1: still granted ...
    ctx = ScheduleContext(0, 0)
    assert pol.prefill_cap(2, context=ctx, oldest_waiting_s=0.85, oldest_remaining_tokens=100_000) == 7168
    slow = DLFPG(itl_target_s=0.05, ttft_budget_s=2.0, ttft_guard_factor=1.0)
    feed(slow, law(d=0.0), VARIED)
    # ... but with a 0.05 s objective (aim 0.0375 -> 2,688 tokens) any larger chunk above 4,000 tokens is over
    # 1.0 x 0.05 s: 100,000 tokens in 38 chunks of 0.03688 s = 1.40 s > slack 1.15; the first larger chunk that
    # meets the slack needs 15 x (0.010 + 1e-5 * 6,784) -> 0.0778 s > 0.05: nothing granted
    assert slow.prefill_cap(2, context=ctx, oldest_waiting_s=0.85, oldest_remaining_tokens=100_000) == 2688


# ---------------------------------------------------------------------------- reasons


def test_each_decision_carries_the_reason_of_the_chunk_it_ran_under():
    pol = DLFPG(itl_target_s=TARGET)
    feed(pol, law(c=2e-9), VARIED)
    deep = ScheduleContext(300_000, 0)
    cap = pol.prefill_cap(4, context=deep)
    pol.observe(Observation(100, 100.0, cap, 4, cap, device_time_s=0.09, prefill_pairs=chunk_pairs(cap, 300_000),
                            decode_context_tokens=0))
    d = pol.decisions[-1]
    assert (d.reason, d.cap_before, d.cap_after) == ("infeasible", 128, 128)
    assert pol.decisions[0].reason == "no_cap"


def test_reason_runs_encode_changes_only():
    runs = reason_runs([0, 1, 2, 5, 6, 9], ["warmup", "warmup", "estimate", "estimate", "infeasible", "estimate"])
    assert runs == {"reasons": ["warmup", "estimate", "infeasible"], "start_iteration": [0, 2, 6, 9],
                    "code": [0, 1, 2, 1]}


# ---------------------------------------------------------------------------- the simulator


def test_the_simulator_passes_the_schedule_context():
    from dlfp.backends.sim.scheduler import RUNNING, Scheduler, SimRequest

    s = Scheduler(max_num_batched_tokens=8192, max_num_seqs=8, block_size=16, num_gpu_blocks=1000,
                  max_model_len=4096, async_scheduling=False)
    dec = SimRequest(0, "a", 0.0, 100, 10)
    dec.computed, dec.out, dec.status = 105, 5, RUNNING  # decoding: its context is 105 tokens
    mid = SimRequest(1, "b", 0.1, 1000, 10)
    mid.computed, mid.status = 256, RUNNING  # mid-prompt after 256 tokens
    s.running = [dec, mid]
    assert s._context() == ScheduleContext(256, 105)
    s.running = [dec]
    s.waiting.append(SimRequest(2, "c", 0.2, 50, 10))
    assert s._context() == ScheduleContext(0, 105)


@pytest.mark.parametrize("experiment", ["qwen3-8b-long-prompt", "qwen3-32b-tp2-long-prompt"])
def test_the_worst_decode_gap_stays_within_the_smallest_chunk_bound(experiment):
    from dlfp.analysis.metrics import itl_samples
    from dlfp.analysis.tables.controller import decision_reasons
    from dlfp.analysis.tables.dlfpg import worst_gap_bound_s
    from dlfp.backends.sim.runner import run_trial

    cfg = load_experiment(experiment)
    base, g = run_trial(cfg, "baseline", 801), run_trial(cfg, "dlfpg", 801)
    bound = worst_gap_bound_s(cfg)
    assert itl_samples(base).max() > 10 * bound  # the stall the controller exists for
    assert itl_samples(g).max() <= bound
    reasons = decision_reasons(g, g.iterations["iteration"].to_numpy())
    assert set(reasons) <= {"warmup", "estimate", "max_chunk", "trust_limit", "infeasible", "ttft_guard", "no_cap",
                            "no_prefill"}
    if experiment.startswith("qwen3-32b"):  # 8 decodes at 32B TP2: even 128 tokens deep in the prompt overrun
        assert (reasons == "infeasible").sum() > 0


def test_the_bound_is_one_smallest_chunk_at_the_deepest_context():
    from dlfp.analysis.tables.dlfpg import worst_gap_bound_s
    from dlfp.backends.sim.runner import build_engine_parts
    from dlfp.devices.batch import Batch

    cfg = load_experiment("qwen3-8b-long-prompt")
    dm = build_engine_parts(cfg)[2]
    decode_only, _ = dm.time_batch(Batch(decodes=[2048] * 16))
    shallow, _ = dm.time_batch(Batch(prefill=[(128, 0)], decodes=[2048] * 16, sampled=17))
    bound = worst_gap_bound_s(cfg)
    assert 1.25 * shallow < bound  # deeper context costs more attention than a chunk at the start
    assert bound < 1.25 * (decode_only + dm.time_batch(Batch(prefill=[(40944, 0)]))[0])
    assert math.isfinite(bound)


# ---------------------------------------------------------------------------- the vLLM scheduler patch


@pytest.mark.vllm
def test_the_vllm_scheduler_passes_context_times_by_the_timer_and_logs_reasons(tmp_path):
    pytest.importorskip("vllm")
    from dlfp.backends.vllm.scheduler import read_log
    from dlfp.backends.vllm.standalone import fake_step, make_request, standalone_scheduler

    class FakeTimer:  # stands in for the CUDA-event timer of dlfp.backends.vllm.cuda_timing
        def pop_elapsed_s(self):
            return 0.042

    log = tmp_path / "sched.jsonl"
    s = standalone_scheduler({"policy": "dlfpg", "signal": "device_completion",
                              "options": {"itl_target_s": 0.1, "min_chunk": 16, "max_chunk": 512,
                                          "initial_chunk": 64, "quantum": 16}},
                             log_path=str(log), max_num_batched_tokens=512)
    assert s._dlfp_timer is None  # no CUDA here: the host clock times completion
    s._dlfp_timer = FakeTimer()
    seen = []
    observe = s.dlfp_policy.observe
    s.dlfp_policy.observe = lambda obs: (seen.append(obs), observe(obs))
    s.add_request(make_request("a", 40, 20))
    for _ in range(3):
        fake_step(s)
    s.add_request(make_request("b", 300, 5, first_token=5000))
    fake_step(s)
    s.shutdown()
    mixed = seen[-1]
    # request a decodes with 42 tokens in its KV cache (40 prompt + 2 outputs before this step); b's first chunk
    # is the initial 64 tokens at context 0: 64 * 65 / 2 = 2,080 pairs
    assert (mixed.prefill_tokens, mixed.num_decodes, mixed.cap) == (64, 1, 64)
    assert mixed.prefill_pairs == 2080 and mixed.decode_context_tokens == 42
    assert all(o.device_time_s == 0.042 for o in seen)
    _, rows = read_log(str(log))
    assert [r["reason"] for r in rows] == [d.reason for d in s.dlfp_policy.decisions]
    assert rows[0]["reason"] == "no_cap" and rows[-1]["reason"] == "warmup"
    assert np.isclose(rows[-1]["device_time_s"], 0.042)


# ---------------------------------------------------------------------------- configuration a user writes


def test_an_arm_naming_only_the_policy_runs_on_completion_timing():
    from dlfp.config import PolicyConfig, build_policy

    pc = PolicyConfig(policy="dlfpg", options={"itl_target_s": 0.1})
    assert pc.signal == "device_completion" and build_policy(pc).signal == "device_completion"
    assert PolicyConfig(policy="dlfp").signal == "host_cadence"  # the paper's controller keeps the paper's signal


@pytest.mark.parametrize("fields, needle", [
    ({"target_s": 0.05}, "target_s is not used when policy=dlfpg"),
    ({"quantum": 64}, "quantum is not used when policy=dlfpg"),
    ({"options": {"itl_target_s": 0.1, "headroom": "0.3"}}, "expected a number, got the string '0.3'"),
    ({"options": {"itl_target_s": 0.1, "min_chunk": 8192, "max_chunk": 4096}},
     "min_chunk=8192 is larger than max_chunk=4096"),
    ({"options": {}}, "options.itl_target_s is required"),
])
def test_settings_dlfpg_would_ignore_or_misread_are_refused(fields, needle):
    from pydantic import ValidationError

    from dlfp.config import PolicyConfig

    with pytest.raises((ValidationError, ValueError)) as ei:
        PolicyConfig(**{"policy": "dlfpg", "options": {"itl_target_s": 0.1}, **fields})
    assert needle in str(ei.value)


def test_an_slo_override_reaches_the_objective_unless_the_arm_sets_it():
    cfg = load_experiment("qwen3-8b-long-prompt", {"slo.itl_s": 0.05, "slo.ttft_s": 3.0})
    assert cfg.arms["dlfpg"].options == {"itl_target_s": 0.05, "ttft_budget_s": 3.0}
    assert cfg.arms["dlfps"].options["ttft_slo_s"] == 3.0
    own = load_experiment("qwen3-8b-long-prompt", {"arms.dlfpg.options": {"itl_target_s": 0.2}, "slo.itl_s": 0.05})
    assert own.arms["dlfpg"].options["itl_target_s"] == 0.2


def test_an_iteration_that_prefilled_nothing_is_logged_as_such():
    pol = DLFPG(itl_target_s=TARGET)
    cap = pol.prefill_cap(3)
    pol.observe(Observation(0, 0.0, 0, 3, cap, device_time_s=0.01))
    assert pol.decisions[-1].reason == "no_prefill"


def test_a_corrupt_decision_log_is_refused_when_the_trial_loads(tmp_path):
    import json
    import shutil

    from dlfp.backends.sim.runner import run_trial
    from dlfp.traces.format import TraceError, load_trial, trial_dir, write_trial

    write_trial(run_trial(load_experiment("qwen3-8b-long-prompt"), "dlfpg", 801), tmp_path)
    path = trial_dir(tmp_path, "sim", "qwen3-8b-long-prompt", "dlfpg", 801)
    good = json.loads((path / "metadata.json").read_text())
    assert load_trial(path).metadata["decisions"] == good["decisions"]
    for corrupt, needle in [({"code": [99] * len(good["decisions"]["code"])}, "code names no reason"),
                            ({"start_iteration": good["decisions"]["start_iteration"][::-1]}, "not strictly"),
                            ({"reasons": None}, "reasons must be a list")]:
        shutil.copy(path / "metadata.json", tmp_path / "keep.json")
        (path / "metadata.json").write_text(json.dumps({**good, "decisions": {**good["decisions"], **corrupt}}))
        with pytest.raises(TraceError, match=f"metadata.json: field decisions .*{needle}"):
            load_trial(path)
        shutil.copy(tmp_path / "keep.json", path / "metadata.json")


def test_a_development_run_of_a_subset_keeps_the_other_experiments(tmp_path):
    import pandas as pd

    from dlfp.studies.controller_dev import COLUMNS, main_dev, write_dev

    row = dict(zip(COLUMNS, ["a", "dlfpg", 901, 0.1, 1.0, 5, 0.2]))
    write_dev(pd.DataFrame([row, {**row, "experiment": "b"}]), tmp_path)
    write_dev(pd.DataFrame([{**row, "experiment": "b", "slo_passes": 7}]), tmp_path)
    df = pd.read_csv(tmp_path / "dev.csv")
    assert list(df["experiment"]) == ["a", "b"] and list(df["slo_passes"]) == [5, 7]
    assert main_dev(["--jobs", "0"]) == 2
    (tmp_path / "file").write_text("x")
    assert main_dev(["--experiments", "qwen3-8b-r0.10", "--out", str(tmp_path / "file")]) == 2
