"""Operator-level device model: values worked by hand, the study's targets on its fit file, byte-exact regeneration."""
import math
from pathlib import Path

import pytest

from dlfp.devices import roofline as cm
from dlfp.devices import attention as att
from dlfp.devices import operators as ops
from dlfp.studies import device as study

LLAMA3 = ops.LayerShape("Llama-3-8B", n_head=32, n_kv_head=8, n_embd=4096, n_expanded_embd=14336,
                        vocab_size=128256, use_gated_mlp=True)
PHI2 = ops.LayerShape("phi-2", n_head=32, n_kv_head=32, n_embd=2560, n_expanded_embd=10240, vocab_size=51200,
                      use_gated_mlp=False)
A100 = cm.load_gpu("a100-sxm4-80gb")
RESULTS = Path(__file__).resolve().parents[1] / "data" / "results" / "device"


def test_qkv_gemm_flops_and_bytes_by_hand():
    m = ops.OperatorModel(LLAMA3, A100)
    assert m.gemm_flops("attn_pre_proj", 1024) == 2 * 1024 * 4096 * (4096 + 2 * 1024)
    assert m.gemm_bytes("attn_pre_proj", 1024) == 2 * (6144 * 4096 + 1024 * 4096 + 1024 * 6144)
    # TP=8: 4 query heads and one KV head per GPU
    assert LLAMA3.gemm_nk("attn_pre_proj", 8) == ((4 + 2 * 1) * 128, 4096)
    assert LLAMA3.gemm_nk("mlp_up_proj", 2) == (14336, 4096)  # gate+up fused: 2 * 14336 / 2
    assert PHI2.gemm_nk("mlp_up_proj", 1) == (10240, 2560)  # not gated
    assert LLAMA3.gemm_nk("mlp_down_proj", 4) == (4096, 3584)


def test_tile_quantisation_by_hand():
    c = ops.load_constants()
    m = ops.OperatorModel(LLAMA3, A100, c)
    tm, tn = c.gemm.tile_m, c.gemm.tile_n
    n, k = 6144, 4096
    assert m.gemm_quantised_flops("attn_pre_proj", 1) == 2 * tm * (math.ceil(n / tn) * tn) * k
    assert m.gemm_quantised_flops("attn_pre_proj", 1024) == m.gemm_flops("attn_pre_proj", 1024)  # whole tiles


def test_gemm_time_is_the_documented_formula():
    c = ops.load_constants()
    m = ops.OperatorModel(LLAMA3, A100, c)
    g = c.gemm
    t_c = 2 * 4096 * 6144 * 4096 / (312e12 * g.eff_compute)
    t_m = 2 * (6144 * 4096 + 4096 * 4096 + 4096 * 6144) / (2039e9 * g.eff_memory)
    want = g.launch_s + (t_c ** g.blend_p + t_m ** g.blend_p) ** (1 / g.blend_p)
    assert m.gemm_time("attn_pre_proj", 4096) == pytest.approx(want, rel=1e-12)


def test_elementwise_bytes_by_hand():
    m = ops.OperatorModel(LLAMA3, A100)
    assert m.elementwise_bytes("input_layernorm", 1000) == 2 * (2 * 1000 * 4096 + 4096)  # read, write, weight
    assert m.elementwise_bytes("add", 1000) == 3 * 2 * 1000 * 4096
    assert m.elementwise_bytes("mlp_act", 1000, tp=2) == 3 * 2 * 1000 * 7168  # gate+up read, out written
    assert m.elementwise_bytes("attn_rope", 1000) == 2 * 2 * 1000 * (32 + 8) * 128
    p = ops.OperatorModel(PHI2, A100)
    assert p.elementwise_bytes("mlp_act", 10) == 2 * 2 * 10 * 10240
    assert p.elementwise_bytes("input_layernorm", 10) == 2 * (2 * 10 * 2560 + 2 * 2560)  # LayerNorm: + bias


def test_ring_allreduce_by_hand():
    assert ops.ring_allreduce_bytes(1_000_000, 2) == 1_000_000
    assert ops.ring_allreduce_bytes(1_000_000, 4) == 1_500_000
    assert ops.ring_allreduce_bytes(800, 8) == 1400
    c = ops.load_constants()
    m = ops.OperatorModel(LLAMA3, A100, c)
    s = 64 * 2**20
    want2 = 2 * c.allreduce.latency_s + s / (300e9 * c.allreduce.eff_link)
    assert m.allreduce_time(s, 2, "a100_pairwise_nvlink") == pytest.approx(want2, rel=1e-12)
    # 4 GPUs of a pairwise-NVLink machine: the ring crosses PCIe 4.0 x16 (31.5 GB/s one way)
    want4 = 6 * c.allreduce.latency_s + 1.5 * s / (31.5e9 * c.allreduce.eff_link)
    assert m.allreduce_time(s, 4, "a100_pairwise_nvlink") == pytest.approx(want4, rel=1e-12)
    assert m.allreduce_time(s, 1) == 0.0


def test_shape_from_qwen3_spec():
    s = ops.LayerShape.from_model_spec(cm.load_model("qwen3-0.6b"))
    assert (s.hd, s.n_head, s.n_kv_head) == (128, 16, 8)
    assert s.gemm_nk("attn_pre_proj", 1) == ((16 + 16) * 128, 1024)  # q 2048 wide, hidden only 1024
    assert s.gemm_nk("attn_post_proj", 1) == (1024, 2048)


def test_errors_named():
    with pytest.raises(cm.CostModelError, match="field tp"):
        LLAMA3.gemm_nk("attn_pre_proj", 3)
    with pytest.raises(cm.CostModelError, match="field op"):
        LLAMA3.gemm_nk("nope", 1)
    with pytest.raises(cm.CostModelError, match="field gpu"):
        ops.OperatorModel(LLAMA3, cm.GPUSpec("x", "x", 1, 1, 1, 1, 1, 1))


def test_before_matches_device_model_linear_part_when_compute_bound():
    # one-layer Qwen3-style ModelSpec with no vocabulary: DeviceModel's linear time = sum of per-GEMM rooflines
    spec = cm.ModelSpec("one", 1, 4096, 32, 8, 128, 14336, 0, True, 4096)
    dm = cm.DeviceModel(spec, A100, 1, cm.DeviceAssumptions(device_model="roofline"))
    n = 8192
    lin = dm.breakdown(cm.Batch(prefill=[(n, 0)], sampled=0)).linear_s
    per_op = sum(study.before_time(LLAMA3, "a100-sxm4-80gb", op, n, 1) for op in ops.GEMM_OPS)
    gap = cm.DeviceAssumptions().kernel_gap_s
    assert per_op - 4 * gap == pytest.approx(lin, rel=1e-12)


def test_attention_tiles_by_hand():
    shape = ops.LayerShape.from_model_spec(cm.load_model("qwen3-8b"))
    am = att.AttentionModel(shape, A100)
    # chunk 256 after 1000 prior tokens: query blocks of 128 see 1128 and 1256 keys -> 18 and 20 blocks of 64
    assert am.prefill_tiles(256, 1000) == [18, 20] * 32
    assert am.prefill_bytes(256, 1000) == 1256 * 2 * 8 * 128 * 2 + 2 * 256 * 32 * 128 * 2
    assert att.makespan([3.0, 3.0, 2.0, 2.0, 2.0], 2) == 7.0
    assert am.decode_splits(16, 8192) == 1  # 16 x 8 = 128 CTAs already cover 108 SMs
    assert am.decode_splits(1, 8192) == 14
    # later chunks re-read a longer prefix: more time
    assert am.prefill_time(1024, 8192) > am.prefill_time(1024, 0)


@pytest.fixture(scope="module")
def fit():
    return study.fit_constants()


def test_yaml_holds_the_refitted_constants(fit):
    c = ops.load_constants()
    for k, v in fit["gemm"].items():
        assert getattr(c.gemm, k) == pytest.approx(v, rel=1e-3), k
    assert c.elementwise.blend_p == pytest.approx(fit["elementwise"]["blend_p"], rel=1e-3)
    for k, v in fit["elementwise"]["kernels"].items():
        assert c.elementwise.eff_bw[k] == pytest.approx(v["eff_bw"], rel=1e-3), k
        assert c.elementwise.fixed_s[k] == pytest.approx(v["fixed_s"], rel=1e-3), k
    assert c.allreduce.latency_s == pytest.approx(fit["allreduce"]["latency_s"], rel=1e-3)
    assert c.allreduce.eff_link == pytest.approx(fit["allreduce"]["eff_link"], rel=1e-3)
    h, own = c.for_gpu("h100-sxm"), fit["gpus"]["h100-sxm"]
    for k, v in own["gemm"].items():
        assert getattr(h.gemm, k) == pytest.approx(v, rel=1e-3), k
    assert h.elementwise.blend_p == pytest.approx(own["elementwise"]["blend_p"], rel=1e-3)
    for k, v in own["elementwise"]["kernels"].items():
        assert h.elementwise.eff_bw[k] == pytest.approx(v["eff_bw"], rel=1e-3), k
        assert h.elementwise.fixed_s[k] == pytest.approx(v["fixed_s"], rel=1e-3), k


def test_after_meets_target_above_512_tokens_on_fit_file(fit):
    comp, ar = study.predictions(study.constants_from_fit(fit))
    e = study.error_table(comp, ar)
    rows = e[(e.file == "a100/Meta-Llama-3-8B_mlp.csv") & (e.tp == 1) & e.band.isin(["513-4,096", ">4,096"])
             & e.family.isin(["projections", "elementwise"])]
    assert len(rows) == 4 and (rows.split == "fit").all()
    assert (rows.after_median <= 0.10).all()


def test_regenerates_shipped_tables_byte_for_byte(tmp_path):
    study.write_device_tables(tmp_path, figure=False)
    for name in ("fitted_constants", "operator_errors", "spot_check", "chunking"):
        for ext in ("csv", "md"):
            assert (tmp_path / f"{name}.{ext}").read_bytes() == (RESULTS / f"{name}.{ext}").read_bytes(), name
    for name in ("h100_prefill.md", "h100_profile_ratio.csv", "h100_errors.csv", "h100_speedup.csv"):
        assert (tmp_path / name).read_bytes() == (RESULTS / name).read_bytes(), name
