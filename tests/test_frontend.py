"""The API server in front of the engine (``dlfp.devices.frontend``): its queue worked by hand, its place in the
simulated engine, its constants refitted from the committed ``vllm serve`` measurement, and its bad input."""
from __future__ import annotations

import json

import jinja2
import numpy as np
import pandas as pd
import pytest

from dlfp.backends.sim import runner as sim
from dlfp.config import ConfigError, ExperimentConfig
from dlfp.devices.frontend import ENDPOINTS, TOKENIZE_WINDOW_S, FrontEnd, FrontendCosts
from dlfp.devices.host import HostCosts
from dlfp.paths import REPO_ROOT
from dlfp.studies.frontend import cli, fit, serve, tokenizer
from reproduce_quotes import quoted_block, rendered

MEASURED = REPO_ROOT / "data" / "results" / "frontend"
COSTS = FrontendCosts(request_s=1e-3, tokenize_per_token_s=10e-6, output_s=0.5e-3, output_per_token_s=0.1e-3)


# --------------------------------------------------------------------------- the queue, worked by hand


def test_two_requests_queue_on_the_event_loop_then_on_the_tokenizer_thread():
    """Sent at 0 and 0.5 ms, 100 prompt tokens each. Event loop: A 0-1 ms, B 1-2 ms. Tokenizer: A ready at 1 + 2 ms
    window = 3 ms, done 4 ms; B ready at 4 ms, done 5 ms. Each reaches the engine ingest (0.2 ms) later."""
    fe = FrontEnd(COSTS, ingest_s=0.2e-3, frontend_output_s=0.3e-3)
    assert fe.request(0.0, 100) == pytest.approx(4.2e-3)
    assert fe.request(0.5e-3, 100) == pytest.approx(5.2e-3)
    # an output of 2 tokens processed by the engine at 1.5 ms waits for the loop (free at 2 ms):
    # 2 + 0.5 + 2 x 0.1 = 2.7 ms on the loop, at the client 0.3 ms later
    assert fe.output(1.5e-3, 2) == pytest.approx(3.0e-3)


def test_token_id_prompts_skip_the_tokenizer_and_its_window():
    fe = FrontEnd(FrontendCosts(request_s=1e-3, request_per_token_s=1e-6), ingest_s=0.0, frontend_output_s=0.0)
    assert fe.request(0.0, 1000) == pytest.approx(2e-3)  # 1 ms + 1000 x 1 us, no 2 ms window


# --------------------------------------------------------------------------- in the simulated engine


BURST4 = dict(kind="burst", prompts="fixed", prompt_tokens=64, num_requests=4)


def cfg(frontend: str | None, **workload) -> ExperimentConfig:
    opts = {} if frontend is None else {"sim": {"frontend": frontend}}
    return ExperimentConfig.model_validate(dict(
        name="fe", model="qwen3-0.6b", gpu="a100-sxm4-80gb", tp=1, scheduling="async", max_num_batched_tokens=2048,
        workload={"output_tokens": 4, **(workload or BURST4)}, slo=dict(ttft_s=1.0, itl_s=0.1), backend_options=opts,
        arms={"baseline": dict(policy="nocap")}))


def first_tokens(trial) -> pd.Series:
    first = trial.tokens.groupby("request_id")["time_s"].min()
    return first.reindex(trial.requests["request_id"]) - trial.requests["arrival_s"].to_numpy()


def test_a_lone_request_pays_the_front_end_once_in_and_once_out():
    """One request on an idle engine: its TTFT with the completions front end exceeds the one without by exactly
    request_s + 2 ms window + tokenize x P (in) + output_s + output_per_token_s (its first token out)."""
    one = dict(kind="burst", prompts="fixed", prompt_tokens=300, num_requests=1)
    with_fe, without = sim.run_trial(cfg("completions", **one), "baseline", 1), sim.run_trial(cfg("none", **one),
                                                                                               "baseline", 1)
    c = ENDPOINTS["completions"]
    extra = c.request_s + TOKENIZE_WINDOW_S + c.tokenize_per_token_s * 300 + c.output_s + c.output_per_token_s
    assert first_tokens(with_fe).iloc[0] - first_tokens(without).iloc[0] == pytest.approx(extra, abs=1e-9)


def test_a_burst_is_admitted_one_request_per_event_loop_slot():
    """64 requests at t = 0: the front end lets the i-th through no earlier than (i + 1) x request_s, so the last
    first token comes at least 64 request_s after the burst, and first tokens keep the send order."""
    burst = dict(kind="burst", prompts="fixed", prompt_tokens=64, num_requests=64)
    ttft = first_tokens(sim.run_trial(cfg("completions_ids", **burst), "baseline", 1)).to_numpy()
    c = ENDPOINTS["completions_ids"]
    assert ttft.max() >= 64 * (c.request_s + 64 * c.request_per_token_s)
    assert (pd.Series(ttft).diff().dropna() >= -1e-12).all()


def test_default_front_end_follows_the_device_profile():
    assert sim.frontend(cfg(None), sim.cm.load_gpu("a100-sxm4-80gb")) == ENDPOINTS["completions"]
    assert sim.frontend(cfg(None), sim.cm.load_gpu("cpu")) == ENDPOINTS["none"]


def test_an_unknown_endpoint_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"backend_options\.sim\.frontend: unknown endpoint 'grpc'"):
        sim.build_engine_parts(cfg("grpc"))


def test_negative_costs_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"frontend\.output_s"):
        FrontendCosts(output_s=-1.0)


# --------------------------------------------------------------------------- the constants, refitted


def refit() -> dict:
    return fit.fit(pd.read_csv(MEASURED / "requests.csv"), pd.read_csv(MEASURED / "phases.csv"),
                   cli.calibrated_transport())


def test_the_simulators_constants_are_the_committed_fit():
    """Every ``ENDPOINTS`` value and ``HostCosts``' two transports, refitted from the committed measurement
    (microseconds, two decimals)."""
    r = refit()
    for ep, costs in r["endpoints"].items():
        for name, v in costs.as_dict().items():
            assert getattr(ENDPOINTS[ep], name) == pytest.approx(round(v * 1e6, 2) * 1e-6, abs=1e-12), (ep, name)
    h = HostCosts()
    assert h.ingest_s == pytest.approx(round(r["ingest_s"] * 1e6, 2) * 1e-6, abs=1e-12)
    assert h.frontend_output_s == pytest.approx(round(r["frontend_output_s"] * 1e6, 2) * 1e-6, abs=1e-12)


def test_the_committed_report_regenerates_byte_for_byte():
    text, costs = cli.report(refit(), json.loads((MEASURED / "corpus.json").read_text()))
    assert (MEASURED / "frontend.md").read_text() == text
    assert json.loads((MEASURED / "costs.json").read_text()) == json.loads(json.dumps(costs))


def test_the_two_length_fit_is_numpys_least_squares():
    """The per-request line (exact sums, the same on every host) agrees with ``np.polyfit`` on the committed
    measurement to 1e-12 relative, and a hand-worked case: CPU 1 ms at 32 tokens and 3 ms at 2,048 (u = 0) gives
    2 ms / 2,016 tokens per token and 1 ms - 32 x that at zero tokens."""
    single = pd.read_csv(MEASURED / "requests.csv").query("phase == 'single'")
    u = fit._one_token_output_s(single)
    one = single[single.output_tokens == single.output_tokens.min()]
    for ep, (r0, r1) in fit.per_request(single, u).items():
        g = one[(one.endpoint == ep) & one.prompt_tokens.isin(fit.FIT_PROMPTS)]
        p1, p0 = np.polyfit(g.prompt_tokens.to_numpy(float), g.api_cpu_s.to_numpy(float) - u, 1)
        assert (r0, r1) == pytest.approx((max(0.0, p0), max(0.0, p1)), rel=1e-12, abs=1e-18), ep
    hand = pd.DataFrame({"endpoint": "x", "prompt_tokens": [32, 32, 2048], "output_tokens": 1,
                         "api_cpu_s": [0.9e-3, 1.1e-3, 3e-3]})
    r0, r1 = fit.per_request(hand, 0.0)["x"]
    assert r1 == pytest.approx(2e-3 / 2016) and r0 == pytest.approx(1e-3 - 32 * 2e-3 / 2016)


def test_a_fit_length_without_requests_is_refused_naming_endpoint_and_length():
    one = pd.DataFrame({"endpoint": "chat", "prompt_tokens": [32], "output_tokens": 1, "api_cpu_s": [1e-3]})
    with pytest.raises(ValueError, match="chat at 2048 prompt tokens"):
        fit.per_request(one, 0.0)


def test_held_out_checks_stay_within_fifteen_percent():
    """The fit predicts what it was not fitted to: text and chat TTFT overheads, the middle prompt length's CPU and
    the chat endpoint under load, each within 15 %."""
    chk = refit()["checks"]
    held = chk[chk.role == "held out"]
    assert len(held) == 10
    assert held["error"].abs().max() < 0.15


def test_prefill_free_overheads_grow_with_prompt_length_on_text_endpoints_only():
    """In the measurement itself: tokenizing 2,048 tokens adds milliseconds to a text prompt's TTFT overhead, while a
    token-id prompt's grows far less (only its JSON)."""
    r = pd.read_csv(MEASURED / "requests.csv")
    s = r[(r.phase == "single") & (r.output_tokens == 1)].assign(o=lambda d: d.client_ttft_s - d.queue_s - d.prefill_s)
    m = s.groupby(["endpoint", "prompt_tokens"])["o"].median()
    text_growth = m[("completions", 2048)] - m[("completions", 32)]
    ids_growth = m[("completions_ids", 2048)] - m[("completions_ids", 32)]
    assert text_growth > 5e-3 and text_growth > 3 * ids_growth


# --------------------------------------------------------------------------- the measurement's parts


def test_chatml_template_renders_a_user_turn_as_qwen3_does():
    env = jinja2.Environment()
    out = env.from_string(tokenizer.CHAT_TEMPLATE).render(messages=[{"role": "user", "content": "hi"}],
                                                          add_generation_prompt=True)
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_prometheus_sums_add_label_sets_and_skip_other_samples():
    text = ('# HELP x\nvllm:e2e_request_latency_seconds_sum{model_name="a"} 1.5\n'
            'vllm:e2e_request_latency_seconds_sum{model_name="b"} 0.25\n'
            'vllm:e2e_request_latency_seconds_bucket{le="1.0"} 3.0\nvllm:num_requests_running 2.0\n'
            'python_gc_objects_collected_total 9.0\n')
    assert serve._metric_sums(text) == {"vllm:e2e_request_latency_seconds_sum": 1.75}


# --------------------------------------------------------------------------- what REPRODUCE.md quotes


@pytest.mark.parametrize("name", ["frontend/frontend.md", "device/host_switch.md"])
def test_reproduce_quotes_the_tables_verbatim(name):
    assert quoted_block(name) == rendered(name)


def test_host_switch_table_renders_from_its_trials_and_its_shipped_setting_is_the_shipped_trace(tmp_path):
    """``host_switch.md`` regenerates byte for byte from its committed trials, and its "+ API server" row of a
    trial equals a fresh run of that trial with the shipped configuration (the setting the traces use)."""
    from dlfp.analysis.metrics import summarize
    from dlfp.config import load_experiment
    from dlfp.studies import host_switch

    shipped = REPO_ROOT / "data" / "results" / "device"
    trials = pd.read_csv(shipped / "host_switch_trials.csv")
    host_switch.write(host_switch.table(trials), trials, tmp_path)
    assert (tmp_path / "host_switch.md").read_text() == (shipped / "host_switch.md").read_text()
    row = trials[(trials.experiment == "qwen3-0.6b-tp1") & (trials.setting == "+ API server")
                 & (trials.arm == "dlfp") & (trials.seed == 801)].iloc[0]
    fresh = summarize(sim.run_trial(load_experiment("qwen3-0.6b-tp1"), "dlfp", 801))
    assert float(f"{fresh['itl_p99_s']:.6g}") == row.itl_p99_s
    assert float(f"{fresh['ttft_p50_s']:.6g}") == row.ttft_p50_s


def test_the_endpoint_is_an_override_from_the_command_line():
    """``--set backend_options.sim.frontend=...`` reaches the endpoint check although no YAML has a ``sim`` section."""
    from dlfp.config import load_experiment

    cfg = load_experiment("qwen3-0.6b-tp1", {"backend_options.sim.frontend": "chat"})
    assert sim.frontend(cfg, sim.cm.load_gpu(cfg.gpu)) == ENDPOINTS["chat"]
    with pytest.raises(ConfigError, match=r"backend_options\.sim\.frontend: unknown endpoint 'grpc'"):
        sim.build_engine_parts(load_experiment("qwen3-0.6b-tp1", {"backend_options.sim.frontend": "grpc"}))
    with pytest.raises(ConfigError, match="no field 'nope'"):
        load_experiment("qwen3-0.6b-tp1", {"nope.sim.frontend": "chat"})
