"""Vidur GPU profiles shipped in data/gpu-profiles/vidur: checksums and the architectures their columns describe."""
import csv
import hashlib
from pathlib import Path

import pytest

from dlfp.devices.operators import LayerShape

ROOT = Path(__file__).resolve().parents[1] / "data" / "gpu-profiles" / "vidur"


def _manifest():
    return [line.split(None, 1) for line in (ROOT / "MANIFEST.sha256").read_text().splitlines() if line.strip()]


def test_manifest_lists_the_five_profiles_and_the_licence():
    names = sorted(n.strip() for _, n in _manifest())
    assert names == sorted(["a100/Meta-Llama-3-8B_mlp.csv", "a100/phi-2_mlp.csv", "h100/Llama-2-7b-hf_mlp.csv",
                            "h100/phi-2_mlp.csv", "network/a100_pairwise_nvlink_all_reduce.csv", "LICENSE"])


@pytest.mark.parametrize("digest,name", _manifest())
def test_sha256_matches_manifest(digest, name):
    assert hashlib.sha256((ROOT / name.strip()).read_bytes()).hexdigest() == digest


def test_readme_gives_provenance():
    text = (ROOT / "README.md").read_text()
    for s in ("microsoft/vidur", "7d47513", "data/profiling/", "MIT", "MLSys 2024", "Agrawal"):
        assert s in text


def _shape(rel):
    with open(ROOT / rel, newline="") as fh:
        rows = list(csv.DictReader(fh))
    shapes = {LayerShape.from_csv_row(r) for r in rows}
    assert len(shapes) == 1  # one architecture per file
    return shapes.pop()


def test_llama3_8b_shape():
    s = _shape("a100/Meta-Llama-3-8B_mlp.csv")
    assert (s.n_embd, s.n_head, s.n_kv_head, s.n_expanded_embd, s.use_gated_mlp) == (4096, 32, 8, 14336, True)
    assert s.hd == 128 and s.vocab_size == 128256


@pytest.mark.parametrize("rel", ["a100/phi-2_mlp.csv", "h100/phi-2_mlp.csv"])
def test_phi2_shape(rel):
    s = _shape(rel)
    assert (s.n_embd, s.n_head, s.n_expanded_embd, s.use_gated_mlp) == (2560, 32, 10240, False)
    assert s.norm == "layer_norm" and s.act == "gelu"


def test_llama2_7b_shape():
    s = _shape("h100/Llama-2-7b-hf_mlp.csv")
    assert (s.n_embd, s.n_head, s.n_kv_head, s.n_expanded_embd, s.use_gated_mlp) == (4096, 32, 32, 11008, True)


def test_allreduce_columns_and_gpu_counts():
    with open(ROOT / "network/a100_pairwise_nvlink_all_reduce.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["collective"] for r in rows} == {"all_reduce"}
    assert {int(r["num_workers"]) for r in rows} == {2, 4}
    assert min(int(r["size"]) for r in rows) == 2048
