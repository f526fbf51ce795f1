"""Cost model: numbers worked by hand from config.json and datasheet values."""
import pytest

from dlfp.devices import roofline as cm

A100_FLOPS = 312e12  # datasheet BF16 dense
A100_BW = 2039e9  # datasheet HBM2e
A100_NVLINK_ONE_WAY = 600e9 / 2
ROOFLINE = cm.DeviceAssumptions(device_model="roofline")  # the per-part roofline these tests work by hand


def test_tiny_decode_time_by_hand():
    # qwen3-tiny: L=4, hidden=512, heads=8, kv=4, head_dim=64, inter=1536, vocab=32000 (tiny-qwen3/config.json)
    layer = 512 * 8 * 64 * 2 + 512 * 4 * 64 * 2 + 3 * 512 * 1536
    assert layer == 3_145_728
    # one decode with 100 tokens of context (99 cached + itself), one sampled row
    lin_flops = 2 * 4 * layer + 2 * 32000 * 512
    lin_bytes = (4 * layer + 32000 * 512) * 2 + 2 * 4 * 512 * 2
    t_lin = max(lin_flops / (A100_FLOPS * 0.70), lin_bytes / (A100_BW * 0.80))
    att_flops = 4 * 4 * 8 * 64 * 100
    att_bytes = (2 * 4 * 4 * 64 * 2) * (99 + 1)
    t_att = max(att_flops / (A100_FLOPS * 0.50), att_bytes / (A100_BW * 0.80))
    overhead = 4 * 12 * 1e-6 + 30e-6
    expected = t_lin + t_att + overhead
    assert expected == pytest.approx(1.13773e-4, rel=1e-4)  # worked value, seconds
    got = cm.iteration_time("qwen3-tiny", "a100-sxm4-80gb", 1, cm.Batch(decodes=[100]), ROOFLINE)
    assert got == pytest.approx(expected, rel=1e-12)


def test_prefill_is_compute_bound_and_causal():
    # 0.6B, one 4096-token chunk with no context: attention pairs = 4096*4097/2
    L, h, nh, d = 28, 1024, 16, 128
    layer = h * nh * d * 2 + h * 8 * d * 2 + 3 * h * 3072
    lin = 2 * L * layer * 4096 + 2 * 151936 * h * 1
    att = 4 * L * nh * d * (4096 * 4097 / 2)
    dm = cm.device_model("qwen3-0.6b", "a100-sxm4-80gb", 1, kind="roofline")
    b = dm.breakdown(cm.Batch(prefill=[(4096, 0)], sampled=1))
    assert b.linear_s == pytest.approx(lin / (A100_FLOPS * 0.7), rel=1e-9)
    assert b.attention_s == pytest.approx(att / (A100_FLOPS * 0.5), rel=1e-9)


def test_published_parameter_counts():
    # Model cards: 0.6B has 0.44B non-embedding params, 8B 6.95B, 32B 31.2B.
    for key, non_emb in (("qwen3-0.6b", 0.44e9), ("qwen3-8b", 6.95e9), ("qwen3-32b", 31.2e9)):
        m = cm.load_model(key)
        assert m.num_hidden_layers * m.layer_params == pytest.approx(non_emb, rel=0.01)


def test_tp_adds_two_allreduces_per_layer():
    dm1 = cm.device_model("qwen3-0.6b", "a100-sxm4-80gb", 1, kind="roofline")
    dm2 = cm.device_model("qwen3-0.6b", "a100-sxm4-80gb", 2, kind="roofline")
    batch = cm.Batch(decodes=[1000, 2000])  # 2 tokens
    b1, b2 = dm1.breakdown(batch), dm2.breakdown(batch)
    assert b1.allreduce_s == 0.0
    # 2 all-reduces x 28 layers x (8 us + ring bytes): message = 2 tokens x 1024 x 2 bytes, ring factor 2(tp-1)/tp = 1
    expected = 2 * 28 * (8e-6 + 2 * 1024 * 2 * 1.0 / A100_NVLINK_ONE_WAY)
    assert b2.allreduce_s == pytest.approx(expected, rel=1e-9)
    # weight reads halve; the parts add up
    assert b2.linear_s == pytest.approx(b1.linear_s / 2, rel=0.01)
    assert b2.total_s == pytest.approx(b2.linear_s + b2.attention_s + b2.allreduce_s + b2.overhead_s, rel=1e-12)


def test_kv_cache_blocks_by_hand_with_a_fixed_reserve():
    # the rule with an explicit reserve (backend_options.sim.reserve_gib); the profiled default: test_kv_sizing.py
    m, g = cm.load_model("qwen3-0.6b"), cm.load_gpu("a100-sxm4-80gb")
    weights = 595_984_384 * 2  # params x BF16
    free = 80 * 2**30 * 0.9 - weights - 2 * 2**30
    per_block = 16 * 2 * 28 * 8 * 128 * 2
    assert cm.kv_cache_blocks(m, g, 1, reserve_gib=2.0) == int(free // per_block)


def test_energy_between_idle_and_tdp():
    b = cm.device_model("qwen3-0.6b", "a100-sxm4-80gb", 1, kind="roofline").breakdown(cm.Batch(decodes=[500]))
    assert 60 * b.total_s < b.energy_j < 400 * b.total_s


def test_rejects_unknown_and_unsplittable():
    with pytest.raises(cm.CostModelError, match="field model.*known: qwen3-0.6b"):
        cm.load_model("llama-7b")
    with pytest.raises(cm.CostModelError, match="field gpu.*a100-sxm4-80gb"):
        cm.load_gpu("v100")
    with pytest.raises(cm.CostModelError, match="field tp"):
        cm.load_model("qwen3-0.6b").check_tp(3)
    with pytest.raises(cm.CostModelError, match="gpu_memory_utilization"):
        cm.kv_cache_blocks(cm.load_model("qwen3-32b"), cm.load_gpu("a100-sxm4-80gb"), 1, gpu_memory_utilization=0.75)
