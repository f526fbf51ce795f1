"""dlfp.workload.generator: Poisson arrivals, agent profile, nonmatching token ids, fingerprints, trace replay."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dlfp.config import TraceReplay, Workload
from dlfp.traces.format import REQUEST_COLUMNS
from dlfp.workload.generator import (
    AGENT_QUANTILES_PATH,
    REPO_ROOT,
    TOKEN_ID_LOW,
    WorkloadError,
    agent_quantile_table,
    make_workload,
    nonmatching_rows,
    load_trace,
    resolve_trace_path,
    sample_agent_lengths,
)

WORKLOADS = Path(__file__).resolve().parents[1] / "data" / "workloads"
MOONCAKE = WORKLOADS / "mooncake_conversation_trace.jsonl"


def fixed(**kw) -> Workload:
    base = dict(kind="fixed", rate=2.0, num_requests=50, num_warmup=3, prompt_tokens=64, vocab_size=5000)
    base.update(kw)
    return Workload(**base)


# --------------------------------------------------------------------------- Poisson arrivals


def test_poisson_interarrival_mean_and_shape():
    wl = fixed(rate=2.0, num_requests=20000, num_warmup=0, prompt_tokens=16, vocab_size=151936)
    inst = make_workload(wl, 801)
    t = np.array([r.arrival_s for r in inst.requests])
    gaps = np.diff(np.concatenate([[0.0], t]))
    # mean gap 1/rate = 0.5 s; the standard error of the mean of 20,000 exponential gaps is 0.5/sqrt(20000)=0.0035.
    assert abs(gaps.mean() - 0.5) < 5 * 0.5 / np.sqrt(20000)
    # exponential: the coefficient of variation is 1 and a KS test does not reject Exp(mean 0.5).
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05
    assert stats.kstest(gaps, "expon", args=(0, 0.5)).pvalue > 1e-3
    assert np.all(gaps > 0)


def test_layout_warmups_first_sorted_fixed_output():
    inst = make_workload(fixed(num_requests=7, num_warmup=3, output_tokens=128), 5)
    reqs = inst.requests
    assert [r.warmup for r in reqs] == [True] * 3 + [False] * 7
    assert [r.request_id for r in reqs] == ["w0000", "w0001", "w0002"] + [f"r{i:04d}" for i in range(7)]
    t = [r.arrival_s for r in reqs]
    assert t == sorted(t) and t[0] > 0
    assert all(r.output_tokens == 128 and r.prompt_tokens == 64 for r in reqs)
    assert len(inst.measured) == 7 and len(inst.warmups) == 3
    assert all(r.prompt_token_ids.dtype == np.int64 for r in reqs)


def test_fixed_prompt_is_clipped_to_max():
    inst = make_workload(fixed(prompt_tokens=5000, max_prompt_tokens=4000), 1)
    assert {r.prompt_tokens for r in inst.requests} == {4000}


# --------------------------------------------------------------------------- determinism, fingerprint


def test_same_seed_same_instance_different_seed_differs():
    wl = Workload(kind="agent", rate=1.0, num_requests=20, num_warmup=2, max_prompt_tokens=8000)
    a, b, c = make_workload(wl, 801), make_workload(wl, 801), make_workload(wl, 802)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    for x, y in zip(a.requests, b.requests):
        assert x.arrival_s == y.arrival_s and np.array_equal(x.prompt_token_ids, y.prompt_token_ids)
    assert a.fingerprint != c.fingerprint
    assert [r.arrival_s for r in a.requests] != [r.arrival_s for r in c.requests]


def test_fingerprint_sees_one_token_and_one_arrival():
    from dataclasses import replace

    from dlfp.workload.requests import WorkloadInstance, fingerprint as _fingerprint

    inst = make_workload(fixed(num_requests=5, num_warmup=0), 3)
    assert _fingerprint(inst.requests) == inst.fingerprint
    ids = inst.requests[2].prompt_token_ids.copy()
    ids[-1] = TOKEN_ID_LOW if ids[-1] != TOKEN_ID_LOW else TOKEN_ID_LOW + 1
    tok = list(inst.requests)
    tok[2] = replace(tok[2], prompt_token_ids=ids)
    arr = list(inst.requests)
    arr[4] = replace(arr[4], arrival_s=arr[4].arrival_s + 1e-9)
    fps = {inst.fingerprint, _fingerprint(tuple(tok)), _fingerprint(tuple(arr))}
    assert len(fps) == 3
    assert isinstance(inst, WorkloadInstance)


def test_more_requests_keep_earlier_ones():
    """Streams are consumed in request order: extending a workload does not move its first requests."""
    short = make_workload(fixed(num_requests=10, num_warmup=0), 9)
    long = make_workload(fixed(num_requests=30, num_warmup=0), 9)
    assert [r.arrival_s for r in short.requests] == [r.arrival_s for r in long.requests[:10]]


# --------------------------------------------------------------------------- nonmatching token ids


def test_prompts_are_nonmatching_and_in_range():
    wl = Workload(kind="agent", rate=1.0, num_requests=300, num_warmup=5, prompt_scale=0.01, min_prompt_tokens=16,
                  vocab_size=1200)
    inst = make_workload(wl, 803)
    firsts = [int(r.prompt_token_ids[0]) for r in inst.requests]
    assert len(set(firsts)) == len(firsts)  # distinct first tokens -> no shared prefix at any block size
    first_blocks = {r.prompt_token_ids[:16].tobytes() for r in inst.requests}
    assert len(first_blocks) == len(inst.requests)
    allids = np.concatenate([r.prompt_token_ids for r in inst.requests])
    assert allids.min() >= TOKEN_ID_LOW and allids.max() < 1200


def test_too_many_requests_for_vocab_is_a_clear_error():
    with pytest.raises(WorkloadError, match="vocab_size"):
        make_workload(fixed(num_requests=1200, num_warmup=0, prompt_tokens=16, vocab_size=1001), 1)


def test_requests_frame_schema():
    inst = make_workload(fixed(num_requests=4, num_warmup=1), 2)
    df = inst.requests_frame()
    assert list(df.columns) == list(REQUEST_COLUMNS)
    assert {c: str(t) for c, t in df.dtypes.items()} == REQUEST_COLUMNS
    assert df["prompt_tokens"].tolist() == [64] * 5 and not df["finished"].any()
    assert df["warmup"].tolist() == [True, False, False, False, False]
    assert set(df["fingerprint"]) == {inst.fingerprint}
    assert len({r.fingerprint() for r in inst.requests}) == 5


# --------------------------------------------------------------------------- agent profile


def test_inverse_cdf_on_a_hand_made_table(tmp_path):
    table = tmp_path / "q.json"
    table.write_text(json.dumps({"probabilities": [0.0, 0.5, 1.0], "quantiles": [100, 200, 1000]}))
    u = np.random.default_rng(7).random(1000)
    expect = np.where(u < 0.5, 100 + 200 * u, 200 + 1600 * (u - 0.5))
    got = sample_agent_lengths(np.random.default_rng(7), 1000, table=table, lo=1)
    assert np.array_equal(got, np.rint(expect).astype(np.int64))
    half = sample_agent_lengths(np.random.default_rng(7), 1000, table=table, scale=0.5, lo=1)
    assert np.array_equal(half, np.rint(expect * 0.5).astype(np.int64))
    clipped = sample_agent_lengths(np.random.default_rng(7), 1000, table=table, lo=150, hi=900)
    assert np.array_equal(clipped, np.clip(np.rint(expect), 150, 900).astype(np.int64))


def test_bad_quantile_table(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"probabilities": [0.0, 0.6, 0.5, 1.0], "quantiles": [1, 2, 3, 4]}))
    with pytest.raises(WorkloadError, match="probabilities must rise"):
        sample_agent_lengths(np.random.default_rng(0), 3, table=bad)


def test_agent_table_matches_published_trace_facts():
    """The committed table carries the Mooncake facts stated in data/workloads/README.md."""
    p, q = agent_quantile_table()
    meta = json.loads(AGENT_QUANTILES_PATH.read_text())
    assert "Mooncake" in meta["source"] and meta["rows"] == 12031
    assert p[0] == 0 and p[-1] == 1 and np.all(np.diff(p) > 0) and np.all(np.diff(q) >= 0)
    assert np.interp(0.5, p, q) == 6909  # median 6,909 tokens
    assert q[-1] == 126195  # max 126,195 tokens
    assert round(meta["summary"]["mean"]) == 12035


def test_agent_lengths_follow_the_table_and_clip():
    wl = Workload(kind="agent", rate=1.0, num_requests=4000, num_warmup=0, max_prompt_tokens=40832,
                  min_prompt_tokens=16)
    L = np.array([r.prompt_tokens for r in make_workload(wl, 801).requests])
    p, q = agent_quantile_table()
    # 4,000 draws: the sample median sits within a few percent of the table's 6,909.
    assert abs(np.median(L) / 6909 - 1) < 0.06
    assert L.max() == 40832 and L.min() >= 16
    # the clipped share equals 1 - CDF(40,832) of the table within sampling error
    tail = 1 - np.interp(40832, q, p)
    assert abs((L == 40832).mean() - tail) < 4 * np.sqrt(tail * (1 - tail) / 4000)


def test_quantile_table_reproduced_from_trace():
    from dlfp.workload.profiles import derive_agent_quantiles

    fresh = derive_agent_quantiles(MOONCAKE)
    committed = json.loads(AGENT_QUANTILES_PATH.read_text())
    assert fresh["probabilities"] == committed["probabilities"]
    assert fresh["quantiles"] == committed["quantiles"]
    assert fresh["trace_sha256"] == committed["trace_sha256"]


# --------------------------------------------------------------------------- trace replay

MOONCAKE_ROWS = [  # timestamp ms, input, output, hash ids (block 0 shared by every row, like the real trace)
    (0, 1000, 10, [0, 1]),
    (1000, 600, 20, [0, 2]),
    (2000, 1024, 30, [0, 1, 3]),  # shares block 1 with row 0: not nonmatching
    (4000, 300, 40, [0, 4]),
    (5000, 700, 50, [0, 5, 6]),
]


@pytest.fixture
def mooncake_file(tmp_path) -> Path:
    p = tmp_path / "mc.jsonl"
    p.write_text("".join(json.dumps({"timestamp": t, "input_length": i, "output_length": o, "hash_ids": h}) + "\n"
                         for t, i, o, h in MOONCAKE_ROWS))
    return p


def trace_wl(path, n, warm=0, rate=1.2, **tr) -> Workload:
    return Workload(kind="trace", rate=rate, num_requests=n, num_warmup=warm, vocab_size=5000,
                    trace=TraceReplay(path=str(path), format=tr.pop("format", "mooncake"), **tr))


def test_nonmatching_rows_ignores_the_block_every_row_shares(mooncake_file):
    rows = load_trace(mooncake_file, "mooncake")
    assert [r.time_s for r in rows] == [0.0, 1.0, 2.0, 4.0, 5.0]
    assert nonmatching_rows(rows) == [0, 1, 3, 4]


def test_trace_nonmatching_time_scaling(mooncake_file):
    inst = make_workload(trace_wl(mooncake_file, 4, nonmatching=True), 1)
    # kept rows at 0, 1, 4, 5 s: trace rate 3 gaps / 5 s = 0.6/s; scaled to 1.2/s -> times halve
    assert [r.arrival_s for r in inst.requests] == [0.0, 0.5, 2.0, 2.5]
    assert [r.prompt_tokens for r in inst.requests] == [1000, 600, 300, 700]
    assert all(r.output_tokens == 128 for r in inst.requests)
    assert len({int(r.prompt_token_ids[0]) for r in inst.requests}) == 4


def test_trace_window_start_warmup_and_output_lengths(mooncake_file):
    inst = make_workload(trace_wl(mooncake_file, 2, warm=1, nonmatching=False, window=3, start=1,
                                  use_trace_output_lengths=True), 1)
    # rows 1..3 (times 1, 2, 4 s -> rate 2/3 per s -> factor (2/3)/1.2), first one is the warm-up
    assert [r.warmup for r in inst.requests] == [True, False, False]
    assert [r.prompt_tokens for r in inst.requests] == [600, 1024, 300]
    assert [r.output_tokens for r in inst.requests] == [20, 30, 40]
    np.testing.assert_allclose([r.arrival_s for r in inst.requests], [0.0, 1 / 1.8, 3 / 1.8])
    with pytest.raises(WorkloadError, match="window"):
        make_workload(trace_wl(mooncake_file, 2, window=4, nonmatching=False), 1)


def test_trace_clipping_and_too_few_requests(mooncake_file):
    inst = make_workload(trace_wl(mooncake_file, 3, nonmatching=False, max_prompt_tokens=800), 1)
    assert [r.prompt_tokens for r in inst.requests] == [800, 600, 800]
    with pytest.raises(WorkloadError, match="only 4 usable requests"):
        make_workload(trace_wl(mooncake_file, 5, nonmatching=True), 1)


def test_follow_hash_ids_gives_identical_blocks_for_equal_ids(mooncake_file):
    inst = make_workload(trace_wl(mooncake_file, 5, nonmatching=False, follow_hash_ids=True), 4)
    r = [x.prompt_token_ids for x in inst.requests]
    assert np.array_equal(r[0], r[2][:1000])  # blocks 0,1 shared; row 0 ends inside block 1
    for i in (1, 3, 4):
        assert np.array_equal(r[i][:300], r[0][:300])  # block 0 everywhere
    assert not np.array_equal(r[1][512:600], r[0][512:600])  # block 2 != block 1
    assert not np.array_equal(r[4][512:700], r[0][512:700])  # block 5 != block 1
    again = make_workload(trace_wl(mooncake_file, 5, nonmatching=False, follow_hash_ids=True), 4)
    assert again.fingerprint == inst.fingerprint


def test_azure_csv_replay(tmp_path):
    p = tmp_path / "az.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:48.6805900,396,109\n"
                 "2023-11-16 18:15:50.6805900,1200,7\n")
    inst = make_workload(trace_wl(p, 3, format="azure", rate=2.0), 1)
    # 2 gaps over 4 s = 0.5/s -> scaled to 2/s: times quarter
    np.testing.assert_allclose([r.arrival_s for r in inst.requests], [0.0, 0.5, 1.0])
    assert [r.prompt_tokens for r in inst.requests] == [374, 396, 1200]
    with pytest.raises(WorkloadError, match="follow_hash_ids"):
        make_workload(trace_wl(p, 3, format="azure", follow_hash_ids=True), 1)


def test_bad_trace_files_give_one_line_errors(tmp_path):
    with pytest.raises(WorkloadError, match="does not exist"):
        make_workload(trace_wl(tmp_path / "nope.jsonl", 1), 1)
    g = tmp_path / "g.jsonl"
    g.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n{"timestamp": 1, oops\n')
    with pytest.raises(WorkloadError, match="line 2: not valid JSON"):
        make_workload(trace_wl(g, 1), 1)
    m = tmp_path / "m.jsonl"
    m.write_text('{"timestamp": 0, "output_length": 1}\n')
    with pytest.raises(WorkloadError, match="missing field 'input_length'"):
        make_workload(trace_wl(m, 1), 1)
    a = tmp_path / "a.csv"
    a.write_text("TIMESTAMP,Tokens\n2023-11-16 18:15:46,3\n")
    with pytest.raises(WorkloadError, match="missing column"):
        make_workload(trace_wl(a, 1, format="azure"), 1)
    with pytest.raises(WorkloadError) as err:
        make_workload(trace_wl(g, 1), 1)
    assert "\n" not in str(err.value) and str(g) in str(err.value)


def test_relative_trace_path_resolves_against_repo_root():
    assert resolve_trace_path("data/workloads/x.jsonl") == (REPO_ROOT / "data/workloads/x.jsonl").resolve()
    assert resolve_trace_path("/abs/x.csv") == Path("/abs/x.csv")


def test_real_mooncake_replay_from_repo_relative_path():
    wl = Workload(kind="trace", rate=1.0, num_requests=100, num_warmup=5, max_prompt_tokens=40832,
                  trace=TraceReplay(path="data/workloads/mooncake_conversation_trace.jsonl", format="mooncake",
                                    max_prompt_tokens=40832))
    inst = make_workload(wl, 801)
    t = np.array([r.arrival_s for r in inst.requests])
    assert t[0] == 0 and abs((len(t) - 1) / t[-1] - 1.0) < 1e-9  # mean rate over the window is exactly 1.0/s
    rows = load_trace(MOONCAKE, "mooncake")
    keep = nonmatching_rows(rows)
    assert len(keep) == 7373  # every row shares hash id 0; ignoring it, 7,373 of 12,031 rows are nonmatching
    assert [r.prompt_tokens for r in inst.requests] == [min(rows[i].input_length, 40832) for i in keep[:105]]


# --------------------------------------------------------------------------- robustness (hostile trace files)


def _mc(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trace_path_that_is_a_directory_or_binary(tmp_path):
    d = tmp_path / "dir.jsonl"
    d.mkdir()
    with pytest.raises(WorkloadError) as ei:
        make_workload(trace_wl(d, 1), 1)
    assert str(ei.value) == f"workload.trace.path: trace file {d} is a directory"
    b = tmp_path / "bin.jsonl"
    b.write_bytes(b'{"timestamp": 0, "input_length": 5, "output_length": 1}\n\xff\xfe\x00\x81garbage\n')
    with pytest.raises(WorkloadError) as ei:
        load_trace(b, "mooncake")
    assert str(ei.value) == f"trace file {b} line 2: not UTF-8 text (a binary file?)"


def test_non_finite_timestamp_is_rejected_naming_line_and_field(tmp_path):
    p = tmp_path / "nan.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n'
                 '{"timestamp": NaN, "input_length": 5, "output_length": 1}\n')
    with pytest.raises(WorkloadError) as ei:
        load_trace(p, "mooncake")
    assert str(ei.value) == f"trace file {p} line 2: field timestamp is not a finite time"
    q = _mc(tmp_path / "inf.jsonl", [{"timestamp": float("inf"), "input_length": 5, "output_length": 1}])
    with pytest.raises(WorkloadError, match="line 1: field timestamp is not a finite time"):
        load_trace(q, "mooncake")


def test_negative_lengths_and_decreasing_times_are_rejected(tmp_path):
    neg = _mc(tmp_path / "neg.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1},
                                       {"timestamp": 1, "input_length": -7, "output_length": 1}])
    with pytest.raises(WorkloadError) as ei:
        load_trace(neg, "mooncake")
    assert str(ei.value) == f"trace file {neg} line 2: field input_length is negative (-7)"
    back = _mc(tmp_path / "back.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1},
                                         {"timestamp": 2000, "input_length": 5, "output_length": 1},
                                         {"timestamp": 1000, "input_length": 5, "output_length": 1}])
    with pytest.raises(WorkloadError) as ei:
        make_workload(trace_wl(back, 3, nonmatching=False), 1)
    assert str(ei.value) == f"trace file {back} line 3: field timestamp decreases (rows must be in time order)"
    az = tmp_path / "az.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                  "2023-11-16 18:15:46.68,374,44\n"
                  "2023-11-16 18:15:45.68,396,109\n")
    with pytest.raises(WorkloadError) as ei:
        load_trace(az, "azure")
    assert str(ei.value) == f"trace file {az} row 2: field TIMESTAMP decreases (rows must be in time order)"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,-3,44\n")
    with pytest.raises(WorkloadError) as ei:
        load_trace(az, "azure")
    assert str(ei.value) == f"trace file {az} row 1: field ContextTokens is negative (-3)"


def test_empty_trace_start_beyond_file_and_missing_seed_window(tmp_path, mooncake_file):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(WorkloadError, match=r"has only 0 usable requests after start=0"):
        make_workload(trace_wl(empty, 1), 1)
    with pytest.raises(WorkloadError, match=r"has only 0 usable requests after start=9"):
        make_workload(trace_wl(mooncake_file, 1, start=9), 1)
    with pytest.raises(WorkloadError, match=r"workload.trace.start_by_seed has no entry for seed 3"):
        make_workload(trace_wl(mooncake_file, 1, start_by_seed={1: 0}), 3)


def test_shared_traces_pass_the_row_checks():
    """The real traces are in time order with finite times and non-negative lengths (row counts from the files)."""
    assert len(load_trace(MOONCAKE, "mooncake")) == 12031
    for name, n in (("azure_llm_2023_code.csv", 8819), ("azure_llm_2023_conv.csv", 19366)):
        p = MOONCAKE.parent / name
        if p.exists():
            rows = load_trace(p, "azure")
            assert len(rows) == n and all(b.time_s >= a.time_s for a, b in zip(rows, rows[1:]))
