"""The emulated device without vLLM: device-time models, host costs, token ids, the serial device thread."""
import threading
import time

import numpy as np
import pytest

from dlfp.devices import roofline as cm
from dlfp.backends.emu.device import (CostModelDeviceTime, DeviceRecord, EmuBatch, EmulatedDevice, LinearDeviceTime,
                                  device_time_fn_from_spec)
from dlfp.devices.host import HostCosts
from dlfp.traces.token_ids import token_id
from dlfp.traces.token_ids import token_ids as sim_token_ids


def test_batch_counts_and_linear_model_by_hand():
    b = EmuBatch(prefill_chunks=((100, 0), (28, 512)), decode_contexts=(10, 20, 30))
    assert (b.prefill_tokens, b.num_prefills, b.num_decodes, b.num_tokens) == (128, 2, 3, 131)
    f = LinearDeviceTime(base_s=0.005, per_token_s=1e-4, per_decode_s=1e-3)
    # 5 ms + 131 x 0.1 ms + 3 x 1 ms = 21.1 ms
    assert f(b) == pytest.approx(0.0211)
    assert device_time_fn_from_spec({"kind": "linear", "base_s": 0.005, "per_token_s": 1e-4,
                                     "per_decode_s": 1e-3})(b) == pytest.approx(0.0211)
    with pytest.raises(ValueError, match="kind"):
        device_time_fn_from_spec({"kind": "abacus"})
    with pytest.raises(ValueError, match="non-negative"):
        LinearDeviceTime(base_s=-1.0)


def test_cost_model_device_time_is_the_simulators_cost_model():
    b = EmuBatch(prefill_chunks=((2048, 1024),), decode_contexts=(3000, 5000), sampled=2)
    f = CostModelDeviceTime("qwen3-0.6b", "a100-sxm4-80gb", 1)
    want = cm.iteration_time("qwen3-0.6b", "a100-sxm4-80gb", 1,
                             cm.Batch(prefill=((2048, 1024),), decodes=(3000, 5000), sampled=2))
    assert f(b) == want and want > 0
    # a non-final chunk samples nothing: fewer LM-head rows -> not slower
    assert f(EmuBatch(prefill_chunks=((2048, 1024),), decode_contexts=(3000, 5000), sampled=2)) <= \
        f(EmuBatch(prefill_chunks=((2048, 1024),), decode_contexts=(3000, 5000), sampled=3))
    assert f.energy_j(b) == pytest.approx(cm.iteration_energy("qwen3-0.6b", "a100-sxm4-80gb", 1,
                                                              cm.Batch(prefill=((2048, 1024),), decodes=(3000, 5000),
                                                                       sampled=2)))
    with pytest.raises(cm.CostModelError, match="model"):
        CostModelDeviceTime("qwen9-1t", "a100-sxm4-80gb", 1)


def test_host_costs_launch_rules_by_hand():
    h = HostCosts(prep_base_s=1e-4, prep_per_req_s=1e-5, prep_per_token_s=1e-7, launch_graph_s=4e-5,
                  launch_piecewise_per_layer_s=1.5e-5, launch_eager_per_kernel_s=5e-6, cudagraph_max_tokens=512,
                  sample_launch_s=3e-5)
    launch = h.launch_rule(num_layers=28, kernels_per_layer=12)
    dec = EmuBatch(decode_contexts=(100,) * 8)
    mixed = EmuBatch(prefill_chunks=((200, 0),), decode_contexts=(100,) * 8)
    big = EmuBatch(prefill_chunks=((2048, 0),), decode_contexts=(100,) * 8)
    assert h.prep_s(8, dec.num_tokens) == pytest.approx(1e-4 + 8e-5 + 8e-7)
    assert launch(dec.num_tokens, dec.num_prefills) == pytest.approx(4e-5)  # one CUDA graph
    assert launch(mixed.num_tokens, mixed.num_prefills) == pytest.approx(28 * 1.5e-5)  # piecewise graph
    assert launch(big.num_tokens, big.num_prefills) == pytest.approx(28 * 12 * 5e-6)  # eager, > 512 tokens
    assert launch(512, 1) == pytest.approx(28 * 1.5e-5) and launch(513, 0) == pytest.approx(28 * 12 * 5e-6)
    with pytest.raises(ValueError, match="prep_base_s"):
        HostCosts(prep_base_s=-1.0)
    with pytest.raises(ValueError, match="schedule_bass_s"):
        HostCosts.from_dict({"schedule_bass_s": 1e-4})


def test_token_ids_match_the_simulator_and_depend_only_on_request_and_index():
    rids = np.array(["r0", "r0", "r1", "warm-3", "r0"], dtype=object)
    idx = np.array([0, 1, 0, 7, 127])
    want = sim_token_ids(rids.astype(str), idx, 151936)
    got = [token_id(r, int(i), 151936) for r, i in zip(rids, idx)]
    assert got == want.tolist()
    assert token_id("r0", 0, 32000) == token_id("r0", 0, 32000)
    assert len({token_id("r0", i, 32000) for i in range(100)}) > 90  # not constant
    assert all(0 <= token_id("x", i, 1000) < 1000 for i in range(200))
    with pytest.raises(ValueError):
        token_id("r0", -1, 1000)


def test_device_runs_batches_serially_in_order():
    done = []
    dev = EmulatedDevice(on_done=lambda r: done.append(r))
    try:
        recs = [DeviceRecord(seq=i, issue_s=time.monotonic()) for i in range(3)]
        t0 = time.monotonic()
        futs = [dev.submit(0.02, f"out{i}", r, not_before_s=t0 + (0.1 if i == 1 else 0)) for i, r in enumerate(recs)]
        assert [f.result(timeout=5) for f in futs] == ["out0", "out1", "out2"]
    finally:
        dev.shutdown()
    assert [r.seq for r in done] == [0, 1, 2]
    for a, b in zip(done, done[1:]):
        assert b.device_start_s >= a.device_end_s  # one batch at a time
    for r in done:
        assert r.modelled_s == 0.02 and r.device_end_s - r.device_start_s >= 0.02 - 1e-9
        assert r.signal_s >= r.device_end_s  # the completion is visible only after the device end
    assert done[2].device_start_s == done[1].device_end_s  # queued work starts at once: no host wake-up in between
    assert done[1].device_end_s >= t0 + 0.1  # cannot end before its launch ends
    with pytest.raises(RuntimeError, match="shut down"):
        dev.submit(0.01, None, DeviceRecord(seq=9, issue_s=0.0))


def test_device_thread_lets_the_caller_run_meanwhile():
    dev = EmulatedDevice()
    try:
        fut = dev.submit(0.2, "x", DeviceRecord(seq=0, issue_s=time.monotonic()))
        assert not fut.done()  # submit does not block: the host keeps scheduling while the device runs
        assert threading.active_count() >= 2
        assert fut.result(timeout=5) == "x"
    finally:
        dev.shutdown()


# ---- the runner's pure parts (no vLLM needed) ------------------------------------------------------------------
def _exp(**over):
    from dlfp.config import ExperimentConfig

    d = dict(name="emu-unit", model="qwen3-0.6b", gpu="a100-sxm4-80gb", tp=1, scheduling="async",
             max_num_batched_tokens=8192,
             workload=dict(kind="fixed", rate=1.0, num_requests=2, prompt_tokens=100, output_tokens=4),
             slo=dict(ttft_s=1.0, itl_s=0.1), arms={"baseline": dict(policy="nocap")})
    d.update(over)
    return ExperimentConfig.model_validate(d)


def test_emu_settings_use_the_simulators_kv_cache_and_host_costs():
    from dlfp.backends.emu.runner import emu_settings
    s = emu_settings(_exp(tp=2), "/tmp/x.jsonl")
    m, g = cm.load_model("qwen3-0.6b"), cm.load_gpu("a100-sxm4-80gb")
    assert s["num_gpu_blocks"] == cm.kv_cache_blocks(m, g, 2, gpu_memory_utilization=0.9, block_size=16)
    assert s["device"]["kind"] == "cost_model" and s["device"]["tp"] == 2 and s["tp"] == 2
    sh = HostCosts()  # the simulator's defaults: both backends charge the same model-runner costs
    assert s["host"]["prep_base_s"] == sh.prep_base_s and s["host"]["launch_graph_s"] == sh.launch_graph_s
    assert s["kernels_per_layer"] == 12  # DeviceAssumptions.kernels_per_layer
    assert HostCosts.from_dict(s["host"]) == sh  # round-trips into the executor


def test_emu_settings_reject_bad_options_naming_the_field():
    from dlfp.config import ConfigError
    from dlfp.backends.emu.runner import emu_settings

    with pytest.raises(ConfigError, match="backend_options.emu.speed"):
        emu_settings(_exp(backend_options={"emu": {"speed": 2}}))
    with pytest.raises(ConfigError, match="backend_options.emu"):
        emu_settings(_exp(backend_options={"emu": {"device": {"kind": "linear", "base_s": -1}}}))
    with pytest.raises(ConfigError, match="num_gpu_blocks"):
        emu_settings(_exp(backend_options={"emu": {"num_gpu_blocks": 0}}))
    with pytest.raises(ConfigError, match="model"):
        emu_settings(_exp(model="qwen9-1t"))


def test_join_device_log_fills_device_columns_and_checks_step():
    import pandas as pd

    from dlfp.backends.emu.runner import join_device_log
    from dlfp.traces.format import ITERATION_COLUMNS, empty_frame

    it = empty_frame(ITERATION_COLUMNS)
    it = pd.concat([it, pd.DataFrame({"iteration": [3, 4], "schedule_s": [0.0, 0.01], "prefill_tokens": [100, 0],
                                      "num_decodes": [2, 3]})], ignore_index=True)
    dev = [dict(seq=4, issue_s=100.001, device_start_s=100.002, device_end_s=100.030, prefill_tokens=100,
                num_decodes=2, energy_j=1.5),
           dict(seq=5, issue_s=100.011, device_start_s=100.030, device_end_s=100.040, prefill_tokens=0,
                num_decodes=3, energy_j=None)]
    out = join_device_log(it, dev, t0=100.0)
    assert out["device_start_s"].tolist() == pytest.approx([0.002, 0.030])
    assert out["device_time_s"].tolist() == pytest.approx([0.028, 0.010])
    assert out["energy_j"].iloc[0] == 1.5 and np.isnan(out["energy_j"].iloc[1])
    dev[1]["num_decodes"] = 4
    with pytest.raises(RuntimeError, match="does not match"):
        join_device_log(it, dev, t0=100.0)
    with pytest.raises(RuntimeError, match="no batch"):
        join_device_log(it, dev[:1], t0=100.0)
