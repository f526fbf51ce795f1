"""Workloads a user writes by hand: request lists (inline or CSV), natively timed trace replay, and the checks
that go with them (the trace's own output lengths, the model's position limit)."""
from __future__ import annotations

import json

import pytest

from dlfp.config import ConfigError, ExperimentConfig, TraceReplay, Workload, check_runnable, load_experiment
from dlfp.workload.generator import make_workload
from dlfp.workload.requests import WorkloadError

ROWS = [(0.0, 100, 5), (0.25, 2000, 3), (0.25, 40, 7), (1.5, 300, 2)]


def request_wl(**kw) -> Workload:
    rows = [{"arrival_s": a, "prompt_tokens": n, "output_tokens": m} for a, n, m in ROWS]
    return Workload(kind="requests", num_requests=3, num_warmup=1, vocab_size=5000, requests=rows, **kw)


def test_an_inline_request_list_is_taken_as_given():
    inst = make_workload(request_wl(), 7)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.warmup) for r in inst.requests] == [
        (0.0, 100, 5, True), (0.25, 2000, 3, False), (0.25, 40, 7, False), (1.5, 300, 2, False)]
    assert [r.request_id for r in inst.requests] == ["w0000", "r0000", "r0001", "r0002"]
    assert [len(r.prompt_token_ids) for r in inst.requests] == [100, 2000, 40, 300]  # no clipping (min 16)
    assert len({int(r.prompt_token_ids[0]) for r in inst.requests}) == 4  # nonmatching


def test_a_csv_request_list_gives_the_same_workload(tmp_path):
    p = tmp_path / "reqs.csv"
    p.write_text("arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a},{n},{m}\n" for a, n, m in ROWS))
    csv = Workload(kind="requests", num_requests=3, num_warmup=1, vocab_size=5000, requests_csv=str(p))
    assert make_workload(csv, 7).fingerprint == make_workload(request_wl(), 7).fingerprint


@pytest.mark.parametrize("text, words", [
    ("arrival,prompt_tokens,output_tokens\n0,1,1\n", "columns"),
    ("arrival_s,prompt_tokens,output_tokens\n1.0,10,1\n0.5,10,1\n0.6,10,1\n0.7,10,1\n", "row 3"),
    ("arrival_s,prompt_tokens,output_tokens\n0,0,1\n0,1,1\n0,1,1\n0,1,1\n", "row 2"),
    ("arrival_s,prompt_tokens,output_tokens\n0,1,1\n", "1 rows"),
    ("arrival_s,prompt_tokens,output_tokens\n0,512.7,1\n0,1,1\n0,1,1\n0,1,1\n", "whole numbers"),
])
def test_bad_request_csvs_are_one_line_naming_the_file(tmp_path, text, words):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    wl = Workload(kind="requests", num_requests=3, num_warmup=1, vocab_size=5000, requests_csv=str(p))
    with pytest.raises(WorkloadError) as e:
        make_workload(wl, 1)
    msg = str(e.value)
    assert "\n" not in msg and words in msg and "requests_csv" in msg


def test_request_list_fields_are_checked():
    with pytest.raises(ValueError, match="exactly one of requests and requests_csv"):
        Workload(kind="requests", num_requests=1)
    with pytest.raises(ValueError, match="3 rows, but num_warmup \\+ num_requests = 5"):
        Workload(kind="requests", num_requests=5, requests=[{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}]
                 * 3)
    with pytest.raises(ValueError, match="rate is required for kind=agent"):
        Workload(kind="agent", num_requests=5)


@pytest.fixture
def trace_file(tmp_path):
    p = tmp_path / "mc.jsonl"
    rows = [(0, 1000, 10, [1]), (1000, 600, 20, [2]), (4000, 300, 4000, [3])]
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                         for t, i, o, h in rows))
    return p


def test_native_timing_keeps_the_trace_timestamps(trace_file):
    native = Workload(kind="trace", num_requests=3, vocab_size=5000,
                      trace=TraceReplay(path=str(trace_file), format="mooncake", timing="native"))
    assert [r.arrival_s for r in make_workload(native, 1).requests] == [0.0, 1.0, 4.0]
    scaled = Workload(kind="trace", rate=1.0, num_requests=3, vocab_size=5000,
                      trace=TraceReplay(path=str(trace_file), format="mooncake"))
    # 2 gaps over 4 s = 0.5/s, scaled to 1/s: times halve
    assert [r.arrival_s for r in make_workload(scaled, 1).requests] == [0.0, 0.5, 2.0]


def _cfg(wl: Workload, max_model_len: int) -> ExperimentConfig:
    base = load_experiment("qwen3-0.6b-tp1").model_dump()
    base.update(workload=wl.model_dump(exclude_none=True), max_model_len=max_model_len)
    return ExperimentConfig.model_validate(base)


def test_the_length_check_uses_the_traces_own_output_lengths(trace_file):
    tr = dict(path=str(trace_file), format="mooncake", use_trace_output_lengths=True, max_prompt_tokens=1000)
    # longest request 300 + 4000 = 4300 tokens (row 3); workload.output_tokens (20000) is not used
    wl = Workload(kind="trace", rate=1.0, num_requests=3, vocab_size=151936, output_tokens=20000,
                  max_prompt_tokens=1000, trace=TraceReplay(**tr))
    check_runnable(_cfg(wl, 4300))
    with pytest.raises(ConfigError, match="4300"):
        check_runnable(_cfg(wl, 4299))


def test_max_model_len_may_not_exceed_the_models_position_limit():
    with pytest.raises(ConfigError, match="max_position_embeddings \\(40960\\)"):
        load_experiment("qwen3-8b-r0.10", overrides={"max_model_len": 65536})


def test_the_long_prompt_example_is_a_request_list_that_fits_the_context():
    cfg = load_experiment("qwen3-8b-long-prompt")
    reqs = make_workload(cfg.workload, 801).requests
    assert len(reqs) == 17 and reqs[-1].prompt_tokens + reqs[-1].output_tokens == cfg.max_model_len == 40960
    decoders = reqs[:16]
    assert all(r.arrival_s < reqs[-1].arrival_s for r in decoders) and {r.output_tokens for r in decoders} == {1024}
