"""The H100's own operator constants against Vidur's H100 rows, read straight from the CSVs, and the speed-up table."""
import csv
from pathlib import Path

import pytest

from dlfp.devices import operators as ops
from dlfp.devices.batch import Batch
from dlfp.devices.kernel_model import KernelDeviceModel
from dlfp.devices.roofline import DeviceModel, load_gpu, load_model
from dlfp.studies import h100_prefill as hp

VIDUR = Path(__file__).resolve().parents[1] / "data" / "gpu-profiles" / "vidur"
H100, A100 = load_gpu("h100-sxm"), load_gpu("a100-sxm4-80gb")
LLAMA2 = ops.LayerShape("Llama-2-7B", n_head=32, n_kv_head=32, n_embd=4096, n_expanded_embd=11008,
                        vocab_size=32000, use_gated_mlp=True)


def _gemm_ms(rel: str, tokens: int, tp: int = 1) -> float:
    """Sum of the four projection GEMMs' median times (ms) at ``tokens`` rows, mean over duplicate rows."""
    with open(VIDUR / rel, newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if int(r["num_tokens"]) == tokens and int(r["num_tensor_parallel_workers"]) == tp]
    assert rows
    return sum(float(r[f"time_stats.{op}.median"]) for r in rows for op in ops.GEMM_OPS) / len(rows)


def test_the_profiles_put_h100_gemms_about_3x_faster_than_a100():
    # phi-2 at 2,048 tokens, the same shape on both GPUs: (0.39875 + 0.139 + 0.45 + 0.4645) / (0.112 + 0.0445 +
    # 0.14775 + 0.15975) ms
    ratio = _gemm_ms("a100/phi-2_mlp.csv", 2048) / _gemm_ms("h100/phi-2_mlp.csv", 2048)
    assert ratio == pytest.approx(1.45225 / 0.464, rel=1e-9)
    assert ratio == pytest.approx(3.130, abs=5e-4)
    assert hp.row_ratio(2048) == pytest.approx(ratio, rel=1e-9)


def test_the_h100_constants_reproduce_a_fitted_row():
    # Llama-2-7B, TP=1, 4,096 tokens: 0.5885 + 0.194 + 0.993 + 0.438 = 2.2135 ms measured
    measured = _gemm_ms("h100/Llama-2-7b-hf_mlp.csv", 4096)
    assert measured == pytest.approx(2.2135, rel=1e-9)
    c = ops.load_constants()
    own, shared = (sum(ops.OperatorModel(LLAMA2, H100, cc).gemm_time(op, 4096) for op in ops.GEMM_OPS) * 1e3
                   for cc in (c, c.shared_only()))
    assert abs(own / measured - 1) <= 0.05  # in-sample median error of the band above 2,048 tokens: 0.026
    assert abs(own / measured - 1) < abs(shared / measured - 1)  # the A100-fitted constants: +9.7 %


def test_held_out_h100_projection_error_meets_the_studys_target():
    # target of dlfp.studies.device: median |predicted / measured - 1| <= 0.10 above 512 tokens
    c = ops.load_constants()
    e = hp.error_table(c.shared_only(), c)
    held = e[(e.family == "projections") & (e.split == "held-out") & e.band.isin(["513-2,048", "2,049-4,096"])]
    assert set(held.file) == {"h100/Llama-2-7b-hf_mlp.csv", "h100/phi-2_mlp.csv"}
    assert set(held.tp) == {1, 2, 4, 8} and len(held) == 8
    assert (held.after_median_abs <= 0.10).all()


def test_the_modelled_phi2_ratio_follows_the_measured_one():
    c = ops.load_constants()
    r = hp.profile_ratio_table(c.shared_only(), c).set_index("band").loc["2,049-4,096"]
    assert r.phi2_model_ratio_after == pytest.approx(r.phi2_measured_ratio_median, rel=0.05)


def test_only_the_h100_has_its_own_constants():
    c = ops.load_constants()
    assert c.for_gpu("a100-sxm4-80gb") is c and c.for_gpu("h200") is c
    h = c.for_gpu("h100-sxm")
    assert h.gemm != c.gemm and h.elementwise != c.elementwise
    assert (h.gemm.tile_m, h.gemm.tile_n, h.gemm.quantisation) == (c.gemm.tile_m, c.gemm.tile_n, c.gemm.quantisation)
    # the simulator's device model on the other GPUs is what the shared constants give
    b = Batch(prefill=[(2048, 0)], decodes=[1000] * 8, sampled=9)
    spec = load_model("qwen3-8b")
    shared = c.shared_only()
    for gpu in (A100, load_gpu("h200")):
        assert DeviceModel(spec, gpu).time_batch(b) == KernelDeviceModel(spec, gpu, constants=shared).time_batch(b)
    assert DeviceModel(spec, H100).time_batch(b) != KernelDeviceModel(spec, H100, constants=shared).time_batch(b)


def test_a_gpu_section_names_its_missing_field():
    import yaml
    d = yaml.safe_load(ops.CONSTANTS_PATH.read_text())
    del d["gpus"]["h100-sxm"]["gemm"]["eff_compute"]
    with pytest.raises(ops.CostModelError, match="field gpus.h100-sxm.gemm.eff_compute"):
        ops.constants_from_dict(d)
    d = yaml.safe_load(ops.CONSTANTS_PATH.read_text())
    d["gpus"]["h100-sxm"]["elementwise"]["kernels"]["add"]["eff_bw"] = 0
    with pytest.raises(ops.CostModelError, match="field gpus.h100-sxm.elementwise.kernels.add.eff_bw"):
        ops.constants_from_dict(d)


def test_speedup_table_by_hand():
    c = ops.load_constants()
    t = hp.speedup_table(c.shared_only(), c).set_index(["model", "prefill_tokens"])
    b = Batch(prefill=[(2048, 0)], decodes=[], sampled=1)
    spec = load_model("qwen3-8b")
    ta, th = DeviceModel(spec, A100).time_batch(b)[0], DeviceModel(spec, H100).time_batch(b)[0]
    r = t.loc[("qwen3-8b", 2048)]
    assert r.a100_ms == pytest.approx(ta * 1e3, abs=1e-4) and r.h100_after_ms == pytest.approx(th * 1e3, abs=1e-4)
    assert r.speedup_after == pytest.approx(ta / th, abs=1e-4)
    assert r.host_ms_for_public == pytest.approx((ta - 1.8 * th) / 0.8 * 1e3, abs=1e-3)
    # (t_A + host) / (t_H + host) is the public figure at that host time
    h = r.host_ms_for_public / 1e3
    assert (ta + h) / (th + h) == pytest.approx(hp.PUBLIC_SPEEDUP, rel=1e-4)
