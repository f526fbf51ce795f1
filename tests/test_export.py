"""``dlfp export --format bench-serve``: vLLM 0.17.1's own result-JSON field names, our metric values.

The field names are read from the installed ``vllm/benchmarks/serve.py`` (its saved dict literals,
``result_json[...]`` / ``result[...]`` assignments and the f-string metric keys); the values are
checked against ``dlfp.analysis.metrics`` on a committed real-engine trial.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from dlfp.analysis import metrics
from dlfp.analysis.export import BENCH_METRICS, export_bench_serve, main_export
from dlfp.traces.format import load_trial

REPO = Path(__file__).resolve().parents[1]
TRIAL = REPO / "data" / "traces" / "vllm" / "cpu-tiny" / "dlfp" / "seed-801"


def _serve_py() -> Path:
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not importable: cannot read the field names its benchmark writes")
    return Path(list(spec.submodule_search_locations)[0]) / "benchmarks" / "serve.py"


def vllm_result_fields(path: Path) -> tuple[set[str], list[re.Pattern]]:
    """Literal keys and f-string key patterns of the result dicts in vLLM's serve.py."""
    tree = ast.parse(path.read_text())
    literal: set[str] = set()
    patterns: list[re.Pattern] = []

    def key_of(node: ast.AST) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            literal.add(node.value)
        elif isinstance(node, ast.JoinedStr):
            parts = [re.escape(v.value) if isinstance(v, ast.Constant) else r"[a-z0-9_.]+" for v in node.values]
            patterns.append(re.compile("".join(parts) + "$"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id == "result" and isinstance(node.value, ast.Dict):
            for k in node.value.keys:
                key_of(k)
        for target in getattr(node, "targets", []):
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                    and target.value.id in ("result", "result_json"):
                key_of(target.slice)
    return literal, patterns


def test_every_field_is_one_vllm_writes():
    literal, patterns = vllm_result_fields(_serve_py())
    assert {"duration", "completed", "ttfts", "itls", "date", "model_id", "request_rate"} <= literal
    assert any(p.match("p99_itl_ms") for p in patterns) and any(p.match("median_ttft_ms") for p in patterns)
    out = export_bench_serve(TRIAL)
    unknown = [k for k in out if k not in literal and not any(p.match(k) for p in patterns)]
    assert not unknown, f"fields vLLM 0.17.1 does not write: {unknown}"
    for m in BENCH_METRICS:  # the summaries of every metric vLLM's process_one_metric handles
        assert f"process_one_metric(\"{m}\"" in _serve_py().read_text()


def test_values_equal_our_metrics():
    trial = load_trial(TRIAL)
    s = metrics.summarize(trial)
    out = export_bench_serve(TRIAL)
    for m in BENCH_METRICS:
        assert out[f"median_{m}_ms"] == pytest.approx(1000 * s[f"{m}_p50_s"])
        assert out[f"p90_{m}_ms"] == pytest.approx(1000 * s[f"{m}_p90_s"])
        assert out[f"p99_{m}_ms"] == pytest.approx(1000 * s[f"{m}_p99_s"])
        assert out[f"mean_{m}_ms"] == pytest.approx(1000 * s[f"{m}_mean_s"])
    assert (out["completed"], out["failed"], out["num_prompts"]) == (s["completed"], s["failed"], s["measured"])
    assert out["duration"] == pytest.approx(s["duration_s"])
    assert out["total_output_tokens"] == s["output_tokens"] == sum(out["output_lens"])
    assert out["request_throughput"] == pytest.approx(s["completed"] / s["duration_s"])
    # vLLM's own reduction of its per-request lists gives the same numbers (seconds -> ms)
    itls = np.concatenate([np.asarray(x, float) for x in out["itls"] if x])
    assert np.percentile(itls, 99) * 1000 == pytest.approx(out["p99_itl_ms"])
    assert np.std(itls) * 1000 == pytest.approx(out["std_itl_ms"])
    ttfts = [t for t, e in zip(out["ttfts"], out["errors"]) if not e]
    assert np.median(ttfts) * 1000 == pytest.approx(out["median_ttft_ms"])
    assert out["total_input_tokens"] == int(trial.measured_requests["prompt_tokens"].sum())


def test_main_export_writes_json_and_rejects_a_bad_trial(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main_export(["--format", "bench-serve", str(TRIAL), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data == json.loads(json.dumps(export_bench_serve(TRIAL)))
    bad = tmp_path / "nope"
    assert main_export(["--format", "bench-serve", str(bad), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"dlfp: error: {bad}: no such trial directory" and not (tmp_path / "x.json").exists()
