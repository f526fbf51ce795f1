"""The kernel-level device model: the simulator's default on datasheet GPUs. Checked against the operator
models it composes, against the study's chunking prediction, and for the physics it adds (small chunks cost
more per token than large ones)."""
from __future__ import annotations

import math

import pytest

from dlfp.devices import roofline as cm
from dlfp.devices.attention import AttentionModel
from dlfp.devices.batch import Batch, scheduled_features
from dlfp.devices.sampler import sampler_time
from dlfp.devices.kernel_model import KernelDeviceModel
from dlfp.devices.operators import ELEMENTWISE_OPS, GEMM_OPS, LayerShape, OperatorModel
from dlfp.studies import device as study


def _models(model="qwen3-8b", tp=1):
    spec, gpu = cm.load_model(model), cm.load_gpu("a100-sxm4-80gb")
    return spec, gpu, cm.DeviceModel(spec, gpu, tp)


def test_datasheet_gpus_get_the_kernel_model_unless_asked_for_the_roofline():
    spec, gpu, dm = _models()
    assert isinstance(dm, KernelDeviceModel)
    roof = cm.DeviceModel(spec, gpu, 1, cm.DeviceAssumptions(device_model="roofline"))
    assert type(roof) is cm.DeviceModel
    with pytest.raises(cm.CostModelError, match="device_model"):
        cm.DeviceAssumptions(device_model="magic")


def test_one_iteration_is_the_sum_of_its_kernels():
    spec, gpu, dm = _models()
    shape = LayerShape.from_model_spec(spec)
    om, am = OperatorModel(shape, gpu), AttentionModel(shape, gpu)
    batch = Batch(prefill=[(1000, 3000)], decodes=[500, 1500], sampled=2)
    tokens = 1002
    layer = (sum(om.gemm_time(op, tokens) for op in GEMM_OPS) + sum(om.elementwise_time(op, tokens)
             for op in ELEMENTWISE_OPS) + am.prefill_time(1000, 3000) + am.decode_time(2, 1000))
    want = spec.num_hidden_layers * layer + om.gemm_time("lm_head", 2) + sampler_time(2, gpu.hbm_bw)
    assert dm.time_batch(batch)[0] == pytest.approx(want, rel=1e-12)


def test_the_simulator_schedule_and_the_batch_give_the_same_time():
    spec, gpu, dm = _models()
    # (request, new_tokens, computed_before, is_decode, sampled): one chunk of 1,000 after 3,000, two decodes
    entries = [(None, 1000, 3000, False, False), (None, 1, 499, True, True), (None, 1, 1499, True, True)]
    got = dm.time_scheduled(entries, scheduled_features(entries))
    assert got == dm.time_batch(Batch(prefill=[(1000, 3000)], decodes=[500, 1500], sampled=2))


def test_it_reproduces_the_studys_chunking_prediction():
    """``studies.device.chunking_table`` composes the same operators itself; our model adds only the fixed
    per-iteration sampler."""
    spec, gpu, dm = _models()
    table = study.chunking_table(study.ops.load_constants()).set_index("chunk_tokens")
    for chunk in (256, 2048, 8192):
        total = 0.0
        iters = math.ceil(study.PROMPT / chunk)
        for i in range(iters):
            p = i * chunk
            c = min(chunk, study.PROMPT - p)
            b = Batch(prefill=[(c, p)], decodes=[study.DECODE_CONTEXT] * study.N_DECODES,
                      sampled=study.N_DECODES + (i == iters - 1))
            total += dm.time_batch(b)[0] - sampler_time(b.sampled, gpu.hbm_bw)
        assert total * 1e3 == pytest.approx(table.loc[chunk, "after_total_ms"], rel=1e-3)


def test_small_chunks_cost_more_per_token_than_large_ones():
    spec, gpu, dm = _models()
    per_token = []
    for chunk in (256, 1024, 4096):
        t = sum(dm.time_batch(Batch(prefill=[(chunk, p)], sampled=1))[0] for p in range(0, 8192, chunk))
        per_token.append(t / 8192)
    assert per_token[0] > per_token[1] > per_token[2]
    roof = cm.DeviceModel(spec, gpu, 1, cm.DeviceAssumptions(device_model="roofline"))
    roof_per_token = [sum(roof.time_batch(Batch(prefill=[(c, p)], sampled=1))[0] for p in range(0, 8192, c)) / 8192
                      for c in (256, 4096)]
    # the kernel model charges chunking more than the roofline does
    assert per_token[0] / per_token[2] > roof_per_token[0] / roof_per_token[1]


def test_tensor_parallel_adds_two_all_reduces_per_layer():
    spec, gpu, dm2 = _models("qwen3-32b", tp=2)
    shape = LayerShape.from_model_spec(spec)
    om = OperatorModel(shape, gpu)
    b = Batch(decodes=[1000] * 8)
    part = dm2.breakdown(b)
    want = spec.num_hidden_layers * 2 * om.allreduce_time(8 * spec.hidden_size * spec.dtype_bytes, 2)
    assert part.allreduce_s == pytest.approx(want) and part.total_s == pytest.approx(dm2.time_batch(b)[0])


def test_the_model_switch_table_by_hand():
    import pandas as pd

    from dlfp.studies import model_switch as ms

    rows = []
    for model, k in (("roofline", 1.0), ("kernel", 2.0)):
        for seed, base in ((801, 0.010), (802, 0.020)):
            rows += [("x", model, "baseline", seed, base, 1.0), ("x", model, "dlfp", seed, base * (1 + 0.5 * k), 1.2),
                     ("x", model, "fixed-512", seed, base, 3.0 * k), ("x", model, "fixed-8192", seed, base, 1.5)]
    trials = pd.DataFrame(rows, columns=["experiment", "device_model", "arm", "seed", "itl_p99_s", "ttft_p99_s"])
    tab = ms.table(trials).set_index("device_model")
    assert tab.loc["roofline", "dlfp_itl_p99_change_pct"] == pytest.approx(50.0)
    assert tab.loc["kernel", "dlfp_itl_p99_change_pct"] == pytest.approx(100.0)
    assert tab.loc["kernel", "dlfp_ttft_p99_change_pct"] == pytest.approx(20.0)
    assert tab.loc["roofline", "ttft_p99_cap512_over_cap8192"] == pytest.approx(2.0)
    assert tab.loc["kernel", "ttft_p99_cap512_over_cap8192"] == pytest.approx(4.0)
    assert tab.loc["kernel", "baseline_itl_p99_ms"] == pytest.approx(15.0)


@pytest.mark.parametrize("d, context", [(1, 1), (3, 63), (3, 64), (3, 65), (16, 8192), (200, 40000)])
def test_the_cached_decode_time_equals_the_attention_models(d, context):
    spec, gpu, dm = _models()
    assert dm._decode_time(d, context) == pytest.approx(dm.att.decode_time(d, context), rel=1e-15)
