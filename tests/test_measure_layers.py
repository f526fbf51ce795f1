"""benchmarks/gpu/measure_layers.py on the CPU at tiny sizes: CSV columns, grid, and attention vs a naive reference."""
import csv
import importlib.util
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "measure_layers.py"


@pytest.fixture(scope="module")
def ml():
    spec = importlib.util.spec_from_file_location("measure_layers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def rows(ml, tmp_path_factory):
    out = ml.run(tmp_path_factory.mktemp("m") / "measure_layers.csv", device="cpu", tiny=True)
    with open(out, newline="") as fh:
        return list(csv.DictReader(fh))


def test_columns_and_identity(ml, rows):
    assert list(rows[0]) == ml.COLUMNS
    assert {"gpu_name", "sm_count", "sm_clock_mhz", "driver", "torch_version"} <= set(rows[0])
    assert all(r["torch_version"] == torch.__version__ and r["device"] == "cpu" for r in rows)


def test_grid_counts(ml, rows):
    kinds = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    n = ml.count_configs(ml.plan(True))
    # 2 shards x 4 GEMMs x 3 token counts; 2 x (2 chunks x 2 priors x 2 decode counts); 2 x (4 chunk cases + 1 decode)
    assert (n["gemm"], n["layer"], n["attention"]) == (24, 16, 10)
    assert kinds["gemm"] == 24 and kinds["layer"] == 16 and kinds["attention"] == 10
    assert all(float(r["median_ms"]) > 0 for r in rows if r["kind"] != "check")
    # the full GPU grid: 3 models x 4 GEMMs x 11 token counts, 3 x 8 x 5 x 4 layer batches
    assert ml.count_configs(ml.plan(False))["layer"] == 3 * 8 * 5 * 4


def test_tp2_shard_halves_heads_and_mlp(ml):
    cfg = ml.shard(ml.load_config("qwen3-32b"), 2)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]) == (32, 4, 12800)
    assert cfg["hidden_size"] == 5120


def test_attention_rows_match_naive_reference(rows):
    att = [r for r in rows if r["kind"] == "attention"]
    assert att and all(float(r["max_abs_err"]) < 1e-4 for r in att)


def test_lower_right_causal_attention_independent_check(ml):
    # 3 new queries after 2 cached tokens, one head, head dim 2: query i sees keys 0..2+i; computed by hand
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 3, 4, generator=g)
    k = torch.randn(1, 1, 5, 4, generator=g)
    v = torch.randn(1, 1, 5, 4, generator=g)
    got = ml.attention(q, k, v)
    for h in range(2):
        for i in range(3):
            keys = range(0, 2 + i + 1)
            s = [sum(q[0, h, i, d] * k[0, 0, j, d] for d in range(4)).item() / math.sqrt(4) for j in keys]
            mx = max(s)
            w = [math.exp(x - mx) for x in s]
            z = sum(w)
            want = [sum(w[j] / z * v[0, 0, j, d].item() for j in keys) for d in range(4)]
            assert got[0, h, i].tolist() == pytest.approx(want, abs=1e-5)
