"""Trace format: round trip, atomic writes, and validation errors that name the file and field."""
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlfp.traces import format as tr
from dlfp.traces.format import TraceError, Trial, find_trials, is_complete, load_trial, trial_dir, write_trial


def make_trial(seed=801, arm="dlfp") -> Trial:
    rq = pd.DataFrame(
        {
            "request_id": ["w0", "r1", "r2"],
            "arrival_s": [0.0, 1.0, 1.5],
            "prompt_tokens": [10, 2000, 300],
            "output_tokens": [2, 3, 2],
            "warmup": [True, False, False],
            "finished": [True, True, True],
            "fingerprint": ["f" * 64] * 3,
        }
    )
    tk = pd.DataFrame(
        {
            "request_id": ["w0", "w0", "r1", "r1", "r2", "r1", "r2"],
            "index": [0, 1, 0, 1, 0, 2, 1],
            "token_id": [5, 6, 7, 8, 9, 10, 11],
            "time_s": [0.1, 0.2, 1.3, 1.4, 1.6, 1.5, 1.7],
        }
    )
    it = pd.DataFrame(
        {
            "iteration": [0, 1, 2],
            "schedule_s": [0.0, 1.0, 1.5],
            "prefill_tokens": [10, 2000, 300],
            "num_prefills": [1, 1, 1],
            "num_decodes": [0, 0, 1],
            "cap": pd.array([None, None, 3072], dtype="Int64"),
            "cap_after": pd.array([None, None, 1536], dtype="Int64"),
            "guarded": [False, False, True],
            "signal": ["host_cadence"] * 3,
            "observed_interval_s": [np.nan, np.nan, 0.16],
            "host_interval_s": [1.0, 0.5, np.nan],
            "device_time_s": [0.01, 0.2, 0.05],
            "issue_s": [0.0, 1.0, 1.5],
            "device_start_s": [0.0, 1.0, 1.5],
            "device_end_s": [0.01, 1.2, 1.55],
            "energy_j": [np.nan, np.nan, np.nan],
        }
    )
    md = {
        "experiment": "toy", "arm": arm, "seed": seed, "backend": "sim",
        "versions": {"numpy": np.__version__}, "hardware": {"gpu": "a100"}, "git_commit": "abc",
        "workload_fingerprint": "f" * 64, "policy": {"name": "dlfp"}, "config": {"slo": {"ttft_s": 1, "itl_s": 1}},
        "energy": {"source": "none", "joules": None, "reason": "no meter"}, "clock": "simulated",
    }
    return Trial(rq, tk, it, md)


def assert_same(a: Trial, b: Trial):
    for name, cols in tr.FILES.items():
        pd.testing.assert_frame_equal(
            tr.coerce(getattr(a, name), cols).reset_index(drop=True),
            getattr(b, name).reset_index(drop=True),
            check_dtype=True,
        )


def test_round_trip(tmp_path):
    t = make_trial()
    d = write_trial(t, tmp_path)
    assert d == tmp_path / "sim" / "toy" / "dlfp" / "seed-801" == trial_dir(tmp_path, "sim", "toy", "dlfp", 801)
    assert sorted(p.name for p in d.iterdir()) == [
        "iterations.parquet", "metadata.json", "requests.parquet", "tokens.parquet"]
    back = load_trial(d)
    assert_same(t, back)
    assert back.iterations["cap"].isna().tolist() == [True, True, False]
    assert back.iterations["cap_after"].iloc[2] == 1536
    assert back.metadata["seed"] == 801 and back.metadata["format_version"] == tr.FORMAT_VERSION
    assert back.measured_requests["request_id"].tolist() == ["r1", "r2"]
    assert is_complete(d)
    assert find_trials(tmp_path) == [d]


def test_identical_trials_give_identical_bytes(tmp_path):
    a = write_trial(make_trial(), tmp_path / "a")
    b = write_trial(make_trial(), tmp_path / "b")
    for f in ("requests.parquet", "tokens.parquet", "iterations.parquet", "metadata.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes()


def test_existing_trial_not_overwritten_without_flag(tmp_path):
    d = write_trial(make_trial(), tmp_path)
    t2 = make_trial()
    t2.tokens.loc[0, "token_id"] = 999
    with pytest.raises(TraceError, match="trial exists"):
        write_trial(t2, tmp_path)
    assert load_trial(d).tokens["token_id"].iloc[0] == 5
    write_trial(t2, tmp_path, overwrite=True)
    assert load_trial(d).tokens["token_id"].iloc[0] == 999
    assert [p.name for p in d.parent.iterdir()] == ["seed-801"]  # no temporary or old copies left


def test_failed_write_leaves_no_trial(tmp_path, monkeypatch):
    calls = []
    real = tr._write_parquet

    def flaky(df, path, columns):
        calls.append(path.name)
        if len(calls) == 2:
            raise OSError("disk full")
        real(df, path, columns)

    monkeypatch.setattr(tr, "_write_parquet", flaky)
    with pytest.raises(OSError, match="disk full"):
        write_trial(make_trial(), tmp_path)
    d = trial_dir(tmp_path, "sim", "toy", "dlfp", 801)
    assert not d.exists()
    assert list(tmp_path.iterdir()) == []  # temporary directory and the folders made for it removed
    assert find_trials(tmp_path) == []
    assert not is_complete(d)


def test_failed_overwrite_keeps_old_trial(tmp_path, monkeypatch):
    d = write_trial(make_trial(), tmp_path)
    monkeypatch.setattr(tr, "_write_parquet", lambda df, path, columns: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        write_trial(make_trial(), tmp_path, overwrite=True)
    assert_same(make_trial(), load_trial(d))


def test_partial_directory_is_not_a_trial(tmp_path):
    d = write_trial(make_trial(), tmp_path)
    (d / "metadata.json").unlink()
    with pytest.raises(TraceError, match="metadata.json: missing"):
        load_trial(d)
    assert not is_complete(d)


def test_corrupted_parquet_named(tmp_path):
    d = write_trial(make_trial(), tmp_path)
    f = d / "tokens.parquet"
    f.write_bytes(f.read_bytes()[:40])  # truncated file
    with pytest.raises(TraceError, match=r"tokens\.parquet: unreadable Parquet"):
        load_trial(d)
    f.write_bytes(b"not a parquet file at all")
    with pytest.raises(TraceError, match=r"tokens\.parquet: unreadable Parquet"):
        load_trial(d)


def test_missing_column_named(tmp_path):
    d = write_trial(make_trial(), tmp_path)
    f = d / "requests.parquet"
    pq.write_table(pq.read_table(f).drop_columns(["arrival_s"]), f)
    with pytest.raises(TraceError, match=r"requests\.parquet: field arrival_s is missing"):
        load_trial(d)


def test_wrong_type_named(tmp_path):
    d = write_trial(make_trial(), tmp_path)
    f = d / "tokens.parquet"
    t = pq.read_table(f)
    t = t.set_column(t.schema.get_field_index("time_s"), "time_s", pa.array(["x"] * len(t)))
    pq.write_table(t, f)
    with pytest.raises(TraceError, match=r"tokens\.parquet: field time_s has type string, expected float64"):
        load_trial(d)


def test_non_monotonic_times_named(tmp_path):
    t = make_trial()
    t.requests["arrival_s"] = [0.0, 1.5, 1.0]
    with pytest.raises(TraceError, match=r"requests\.parquet: field arrival_s is not monotonic"):
        write_trial(t, tmp_path)
    t = make_trial()
    t.tokens.loc[3, "time_s"] = 1.25  # r1 token 1 before token 0 (1.3)
    with pytest.raises(TraceError, match=r"tokens\.parquet: field time_s is not monotonic"):
        write_trial(t, tmp_path)
    t = make_trial()
    t.iterations["schedule_s"] = [0.0, 1.5, 1.0]
    with pytest.raises(TraceError, match=r"iterations\.parquet: field schedule_s is not monotonic"):
        write_trial(t, tmp_path)


def test_non_monotonic_on_disk_names_file(tmp_path):
    d = write_trial(make_trial(), tmp_path)
    f = d / "requests.parquet"
    t = pq.read_table(f)
    t = t.set_column(t.schema.get_field_index("arrival_s"), "arrival_s", pa.array([0.0, 2.0, 1.5]))
    pq.write_table(t, f)
    with pytest.raises(TraceError, match=rf"{d}/requests\.parquet: field arrival_s is not monotonic"):
        load_trial(d)


def test_other_invariants(tmp_path):
    t = make_trial()
    t.tokens.loc[2, "time_s"] = 0.5  # r1's first token before its arrival (1.0)
    with pytest.raises(TraceError, match="token before its request's arrival"):
        write_trial(t, tmp_path)
    t = make_trial()
    t.tokens.loc[6, "index"] = 2  # r2 indices 0, 2
    with pytest.raises(TraceError, match="field index is not 0..n-1 in order for request r2"):
        write_trial(t, tmp_path)
    t = make_trial()
    t.tokens.loc[0, "request_id"] = "ghost"
    with pytest.raises(TraceError, match="request_id names requests absent"):
        write_trial(t, tmp_path)
    t = make_trial()
    del t.metadata["clock"]
    with pytest.raises(TraceError, match=r"metadata: missing key\(s\) \['clock'\]"):
        write_trial(t, tmp_path)


def test_metadata_numpy_values_serialise(tmp_path):
    t = make_trial(seed=np.int64(802))
    t.metadata["hardware"] = {"tp": np.int64(2), "tflops": np.float64(312.0), "nvml": np.bool_(False)}
    d = write_trial(t, tmp_path)
    md = json.loads((d / "metadata.json").read_text())
    assert md["seed"] == 802 and md["hardware"] == {"tp": 2, "tflops": 312.0, "nvml": False}


def test_times_survive_the_nanosecond_storage(tmp_path):
    # time columns are stored as integer microseconds: a round trip changes a value by at most 0.5 us
    t = make_trial()
    t.tokens["time_s"] = t.tokens["time_s"] + 1.0 / 3.0
    d = write_trial(t, tmp_path)
    back = load_trial(d)
    err = np.abs(back.tokens["time_s"].to_numpy() - t.tokens["time_s"].to_numpy())
    assert err.max() <= 0.5e-6 + 1e-12
    assert err.max() > 0  # 1/3 s is not a whole number of microseconds: the storage really rounds
    assert pq.read_schema(d / "tokens.parquet").field("time_s").type == pa.int64()
    # NaN (unknown) times stay NaN
    assert np.array_equal(np.isnan(back.iterations["device_time_s"].to_numpy()),
                          np.isnan(tr.coerce(t.iterations, tr.ITERATION_COLUMNS)["device_time_s"].to_numpy()))


def test_time_unit_is_labelled_and_honoured(tmp_path):
    d = write_trial(make_trial(), tmp_path)
    f = pq.read_schema(d / "tokens.parquet").field("time_s")
    assert f.metadata == {b"unit": b"us"}
    # an integer time column labelled in nanoseconds (or unlabelled: older files) is read as nanoseconds
    t = pq.read_table(d / "tokens.parquet")
    us = t.column("time_s").to_numpy()
    i = t.schema.get_field_index("time_s")
    t_ns = t.set_column(i, pa.field("time_s", pa.int64(), metadata={b"unit": b"ns"}), pa.array(us * 1000))
    pq.write_table(t_ns, d / "tokens.parquet")
    assert np.allclose(load_trial(d).tokens["time_s"].to_numpy(), us / 1e6)
    t_bad = t.set_column(i, pa.field("time_s", pa.int64(), metadata={b"unit": b"fortnight"}), t.column("time_s"))
    pq.write_table(t_bad, d / "tokens.parquet")
    with pytest.raises(TraceError, match=r"tokens.parquet: field time_s has unknown time unit"):
        load_trial(d)


def test_serial_device_end_times_must_not_decrease(tmp_path):
    t = make_trial()
    t.iterations.loc[2, "device_end_s"] = 1.1  # ends before iteration 1 (1.2 s) on the one modelled device
    with pytest.raises(TraceError) as ei:
        write_trial(t, tmp_path)
    assert str(ei.value) == ("(in memory)/iterations.parquet: field device_end_s is not monotonic "
                             "(decreases after row 1)")
    t.iterations.loc[1, "device_end_s"] = np.nan  # unknown end: skipped, 0.01 <= 1.1 holds
    assert write_trial(t, tmp_path).name == "seed-801"
    real = make_trial(seed=802)
    real.metadata["backend"] = "vllm"  # a real engine may overlap batches: not checked
    real.iterations.loc[2, "device_end_s"] = 1.1
    assert load_trial(write_trial(real, tmp_path)).iterations["device_end_s"].tolist() == [0.01, 1.2, 1.1]


def test_write_removes_stale_temporaries_of_the_same_trial(tmp_path):
    import os

    dest = trial_dir(tmp_path, "sim", "toy", "dlfp", 801)
    dest.parent.mkdir(parents=True)
    stale = dest.parent / ".seed-801.tmp-crashed"
    stale.mkdir()
    (stale / "requests.parquet").write_bytes(b"partial")
    os.utime(stale, (1_000_000_000, 1_000_000_000))  # 2001: older than this write
    other = dest.parent / ".seed-802.tmp-crashed"  # another trial's temporary is left alone
    other.mkdir()
    os.utime(other, (1_000_000_000, 1_000_000_000))
    write_trial(make_trial(), tmp_path)
    assert sorted(p.name for p in dest.parent.iterdir()) == [".seed-802.tmp-crashed", "seed-801"]
