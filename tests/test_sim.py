"""Simulator mechanism tests on small hand-built request lists."""
from dataclasses import dataclass

import numpy as np
import pytest

from dlfp import policies as ctl
from dlfp.devices import roofline as cm
from dlfp.backends.sim import HostCosts, SimEngine

# Round host costs so expected intervals are easy to state.
H = HostCosts(schedule_base_s=100e-6, schedule_per_req_s=0.0, prep_base_s=200e-6, prep_per_req_s=0.0,
              prep_per_token_s=0.0, launch_graph_s=10e-6, launch_piecewise_per_layer_s=1e-6,
              launch_eager_per_kernel_s=0.1e-6, sample_launch_s=0.0, update_base_s=50e-6, update_per_req_s=0.0,
              bookkeeping_base_s=0.0, bookkeeping_per_req_s=0.0, engine_loop_s=0.0, frontend_output_s=0.0,
              ingest_s=0.0)


@dataclass(frozen=True)
class Req:
    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def engine(policy=None, scheduling="sync", model="qwen3-0.6b", blocks=100_000, budget=8192, host=H, tp=1, **kw):
    dm = cm.device_model(model, "a100-sxm4-80gb", tp)
    return SimEngine(dm, policy or ctl.NoCap(), scheduling=scheduling, max_num_batched_tokens=budget,
                     num_gpu_blocks=blocks, host=host, **kw)


def test_sync_host_interval_is_device_time_plus_host_cost():
    res = engine(scheduling="sync").run([Req("a", 0.0, 500, 20), Req("b", 0.01, 3000, 10)])
    it = res.iterations
    inner = it.iloc[:-1]
    # host cost per step = schedule 100 us + prep 200 us + update 50 us; launch overlaps the device
    np.testing.assert_allclose(inner["host_interval_s"] - inner["device_time_s"], 350e-6, rtol=0, atol=1e-12)
    # device time of the first iteration = cost model of a 500-token prefill from empty cache
    first = cm.iteration_time("qwen3-0.6b", "a100-sxm4-80gb", 1, cm.Batch(prefill=[(500, 0)]))
    assert it["device_time_s"].iloc[0] == pytest.approx(first, rel=1e-12)
    assert res.finished.all()
    assert [len(t) for t in res.token_times] == [20, 10]


def test_async_host_interval_tracks_previous_batch():
    # a decodes; b's 6000-token prompt arrives and joins a mixed iteration
    res = engine(scheduling="async").run([Req("a", 0.0, 200, 60), Req("b", 0.02, 6000, 5)])
    it = res.iterations
    mixed = it.index[(it["prefill_tokens"] == 6000) & (it["num_decodes"] == 1)]
    assert len(mixed) == 1
    k = int(mixed[0])
    row, prev = it.loc[k], it.loc[k - 1]
    # the long mixed iteration's host interval is far shorter than its own device time
    assert row["device_time_s"] > 0.03
    assert row["host_interval_s"] < 0.2 * row["device_time_s"]
    # batch queue of depth 2: the next schedule() call comes right after the PREVIOUS batch completes and its
    # output is processed (50 us update), not after this batch
    assert row["schedule_s"] + row["host_interval_s"] == pytest.approx(prev["device_end_s"] + 50e-6, abs=1e-12)
    # and the iteration after the long one waits for it: its interval covers the long device time
    nxt = it.loc[k + 1]
    assert nxt["host_interval_s"] > 0.8 * row["device_time_s"]
    # the same requests under sync: every host interval exceeds its own device time
    it_sync = engine(scheduling="sync").run([Req("a", 0.0, 200, 60), Req("b", 0.02, 6000, 5)]).iterations
    assert (it_sync["host_interval_s"].iloc[:-1] > it_sync["device_time_s"].iloc[:-1]).all()


def test_async_schedules_decode_before_previous_token_is_known():
    # one request alone: after its prefill, the async scheduler schedules a decode at once (output placeholder),
    # so two batches overlap on the host: the decode is issued before the prefill's device work ends
    it = engine(scheduling="async").run([Req("a", 0.0, 2000, 4)]).iterations
    assert list(it["prefill_tokens"]) == [2000, 0, 0, 0]
    assert it["issue_s"].iloc[1] < it["device_end_s"].iloc[0]
    assert it["device_start_s"].iloc[1] == pytest.approx(it["device_end_s"].iloc[0], abs=1e-15)


def test_cap_binds_only_while_decoding():
    pol = ctl.FixedCap(1024)
    res = engine(pol, scheduling="sync").run([Req("a", 0.0, 4000, 30), Req("b", 0.02, 3000, 3)])
    it = res.iterations
    # isolated prefill of a: no decode -> no cap, the whole prompt in one step
    assert it["prefill_tokens"].iloc[0] == 4000 and it["cap"].isna().iloc[0]
    # b arrives while a decodes: chunks of at most 1024 tokens, each next to a's decode
    chunks = it[it["prefill_tokens"] > 0].iloc[1:]
    assert list(chunks["prefill_tokens"]) == [1024, 1024, 952]
    assert (chunks["num_decodes"] == 1).all() and (chunks["cap"] == 1024).all()
    assert chunks["guarded"].all()
    # decodes never starved: a decodes in every step from its first token until it finishes
    assert res.finished.all()


def test_dlfp_host_cadence_observed_at_next_schedule_call():
    pol = ctl.DLFP()
    res = engine(pol, scheduling="sync").run([Req("a", 0.0, 100, 40), Req("b", 0.01, 9000, 2)])
    it = res.iterations
    g = it[it["guarded"]]
    assert len(g) >= 2
    # first guarded cycle ran with the paper's initial cap; its observed interval is its host interval
    first = g.iloc[0]
    assert first["cap"] == 3072 and first["prefill_tokens"] == 3072
    assert first["observed_interval_s"] == first["host_interval_s"]
    assert first["cap_after"] == pol.next_cap(3072, first["host_interval_s"])
    assert len(pol.decisions) == len(it) - 1  # every iteration but the last (no next scheduler call)


def test_device_completion_signal_observed_for_every_iteration():
    pol = ctl.DLFP(signal="device_completion")
    res = engine(pol, scheduling="async").run([Req("a", 0.0, 100, 40), Req("b", 0.01, 9000, 2)])
    it = res.iterations
    assert len(pol.decisions) == len(it)
    g = it[it["guarded"]]
    np.testing.assert_array_equal(g["observed_interval_s"].to_numpy(), g["device_time_s"].to_numpy())


def test_preemption_when_kv_blocks_run_out():
    # 10 blocks of 16 tokens; two 60-token prompts take 4 blocks each, then grow during decode
    res = engine(scheduling="sync", blocks=10).run([Req("a", 0.0, 60, 40), Req("b", 0.0, 60, 40)])
    it = res.iterations
    assert res.num_preemptions == 1
    assert res.finished.all() and [len(t) for t in res.token_times] == [40, 40]
    # b was preempted when a needed its 6th block (a at 80 computed tokens, b with 21 outputs): b then recomputes
    # its 60 prompt + 21 output tokens as one prefill once a has finished and freed its blocks
    pref = it[it["prefill_tokens"] > 0]
    assert list(pref["prefill_tokens"]) == [120, 81]
    t_a_done = res.token_times[0][-1]
    assert pref["schedule_s"].iloc[1] >= t_a_done
    # b's tokens come out in order with a gap across the preemption
    gaps = np.diff(res.token_times[1])
    assert gaps.max() > 10 * np.median(gaps)


def test_async_preemption_completes_all_tokens():
    res = engine(scheduling="async", blocks=10).run([Req("a", 0.0, 60, 40), Req("b", 0.0, 60, 40)])
    assert res.num_preemptions >= 1
    assert res.finished.all() and [len(t) for t in res.token_times] == [40, 40]


def test_tp2_adds_allreduce_time_in_the_engine():
    reqs = [Req("a", 0.0, 200, 10)]
    it1 = engine(scheduling="sync").run(reqs).iterations
    it2 = engine(scheduling="sync", tp=2).run(reqs).iterations
    b1 = cm.device_model("qwen3-0.6b", "a100-sxm4-80gb", 1).breakdown(cm.Batch(decodes=[201]))
    b2 = cm.device_model("qwen3-0.6b", "a100-sxm4-80gb", 2).breakdown(cm.Batch(decodes=[201]))
    assert b2.allreduce_s > 0.4e-3  # 56 all-reduces x 8 us
    assert it1["device_time_s"].iloc[1] == pytest.approx(b1.total_s, rel=1e-12)
    assert it2["device_time_s"].iloc[1] == pytest.approx(b2.total_s, rel=1e-12)


def test_max_num_seqs_limits_running():
    reqs = [Req(f"r{i}", 0.0, 50, 5) for i in range(5)]
    it = engine(scheduling="sync", max_num_seqs=2).run(reqs).iterations
    assert it["num_prefills"].iloc[0] == 2
    assert (it["num_decodes"] + it["num_prefills"]).max() == 2
