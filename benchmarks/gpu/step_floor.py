"""The fixed work of one engine iteration on a GPU host: kernel launch, CUDA-graph replay, sampler, host Python.

Measures, on whatever machine it runs on (``--tiny``: small sizes, any CPU, for rehearsal and the test suite):

* ``eager_op``: host time to enqueue one small CUDA kernel eagerly (``--ops`` in-place adds, then one
  synchronisation), microseconds per kernel: what ``--enforce-eager`` pays per kernel;
* ``graph_replay``: a CUDA graph of ``n`` small kernels (``n`` in ``GRAPH_NODES``) captured once, then replayed:
  host time of ``replay()`` (launch) and CUDA-event device time per replay, microseconds: the launch cost of a
  FULL CUDA graph and the device time per captured kernel;
* ``sampler``: CUDA-event device time of vLLM 0.17.1's sampler ops on fp32 logits of ``--vocab`` columns for
  ``B`` rows (``SAMPLER_ROWS``): ``greedy`` (``logits.to(float32)``, ``argmax``: ``Sampler.greedy_sample``),
  ``top_p`` (``apply_top_k_top_p_pytorch`` with top-k 20 and top-p 0.95, softmax, ``random_sample``: the
  ``TopKTopPSampler.forward_native`` path, ``vllm/v1/sample/ops/topk_topp_sampler.py``), microseconds;
* ``python``: CPU time of pure-Python engine work, microseconds per call: ``schedule`` (one
  ``dlfp.backends.sim.scheduler.Scheduler.schedule`` call with 64 running decodes, the shape of vLLM's own
  pure-Python ``Scheduler.schedule``) and ``prepare`` (numpy index building for 64 requests, the shape of
  ``GPUModelRunner._prepare_inputs``). Run on two hosts, their ratio scales host costs measured on one to the
  other.

Writes ``step_floor.csv`` (``measure, param, value_us, reps``) and ``host.json`` into ``--out`` (default
``$OUT``). Medians of ``--reps`` after one warm-up.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "artifact"))

#: kernels per captured graph
GRAPH_NODES = (1, 64, 512)
#: sampler rows (decodes sampled in one iteration)
SAMPLER_ROWS = (1, 16, 64, 256)
#: Qwen3's vocabulary (``config.json`` of every Qwen3 dense model)
QWEN3_VOCAB = 151936


def _median(fn, reps: int) -> float:
    fn()
    return statistics.median(fn() for _ in range(reps))


def eager_op_us(dev: torch.device, ops: int, reps: int) -> float:
    """Host microseconds to enqueue one small in-place add (``ops`` of them, then one synchronisation)."""
    x = torch.zeros(16, device=dev)

    def once() -> float:
        t0 = time.perf_counter()
        for _ in range(ops):
            x.add_(1.0)
        t1 = time.perf_counter()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return (t1 - t0) / ops * 1e6
    return _median(once, reps)


def graph_replay_us(dev: torch.device, nodes: int, reps: int) -> tuple[float, float]:
    """(host launch us, device us) of replaying a captured graph of ``nodes`` small kernels; CPU: eager loop."""
    x = torch.zeros(16, device=dev)
    if dev.type != "cuda":
        def eager() -> float:
            t0 = time.perf_counter()
            for _ in range(nodes):
                x.add_(1.0)
            return (time.perf_counter() - t0) * 1e6
        v = _median(eager, reps)
        return v, v
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(nodes):
            x.add_(1.0)
    launch, device = [], []
    for i in range(reps + 1):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        t0 = time.perf_counter()
        g.replay()
        t1 = time.perf_counter()
        b.record()
        torch.cuda.synchronize()
        if i:
            launch.append((t1 - t0) * 1e6)
            device.append(a.elapsed_time(b) * 1e3)
    return statistics.median(launch), statistics.median(device)


def _device_us(dev: torch.device, fn, reps: int) -> float:
    """Median device microseconds of ``fn()`` (CUDA events; wall clock on the CPU)."""
    out = []
    for i in range(reps + 1):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            v = a.elapsed_time(b) * 1e3
        else:
            t0 = time.perf_counter()
            fn()
            v = (time.perf_counter() - t0) * 1e6
        if i:
            out.append(v)
    return statistics.median(out)


def _top_p(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """vLLM 0.17.1's ``apply_top_k_top_p_pytorch`` + softmax + ``random_sample`` (``forward_native``)."""
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    top_k = logits_sort.gather(1, (logits_sort.size(1) - k.to(torch.long)).unsqueeze(dim=1))
    logits_sort.masked_fill_(logits_sort < top_k, -float("inf"))
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    mask = probs_sum <= 1 - p.unsqueeze(dim=1)
    mask[:, -1] = False
    logits_sort.masked_fill_(mask, -float("inf"))
    logits = logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1).view(-1)


def sampler_rows(dev: torch.device, vocab: int, rows: int, reps: int) -> dict[str, float]:
    """Device microseconds of the greedy and the top-k/top-p sampler for ``rows`` rows of ``vocab`` logits."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    raw = torch.randn(rows, vocab, device=dev, dtype=dtype)
    k = torch.full((rows,), 20, device=dev, dtype=torch.int32)
    p = torch.full((rows,), 0.95, device=dev)
    greedy = _device_us(dev, lambda: raw.to(torch.float32).argmax(dim=-1), reps)
    top_p = _device_us(dev, lambda: _top_p(raw.to(torch.float32), k, p), reps)
    return {"greedy": greedy, "top_p": top_p}


def python_us(reps: int) -> dict[str, float]:
    """CPU microseconds per call of the pure-Python scheduler step and of numpy input preparation (64 requests)."""
    from dlfp.backends.sim.scheduler import RUNNING, Scheduler, SimRequest

    class _NoCap:
        def prefill_cap(self, num_decodes, **_kw):
            return None

    s = Scheduler(max_num_batched_tokens=8192, max_num_seqs=256, block_size=16, num_gpu_blocks=1 << 20,
                  max_model_len=1 << 20, async_scheduling=False)
    for i in range(64):
        r = SimRequest(i, f"r{i}", 0.0, 512, 1 << 30)
        r.computed, r.out, r.blocks, r.status = 512, 1, 33, RUNNING
        s.running.append(r)
    pol = _NoCap()

    def sched() -> float:
        t0 = time.process_time()
        for _ in range(200):
            entries, _ = s.schedule(0.0, pol)
            for r, _n, _c, _d, _smp in entries:
                r.out += 1
        return (time.process_time() - t0) / 200 * 1e6

    lens = np.full(64, 1, dtype=np.int64)
    ctx = np.arange(64, dtype=np.int64) * 37 + 512

    def prep() -> float:
        t0 = time.process_time()
        for _ in range(200):
            cu = np.cumsum(lens)
            req = np.repeat(np.arange(64), lens)
            pos = ctx[req] + np.arange(int(cu[-1])) - np.repeat(cu - lens, lens)
            slots = (pos // 16) * 16 + pos % 16
            np.concatenate([req, pos, slots]).astype(np.int32)
        return (time.process_time() - t0) / 200 * 1e6
    return {"schedule": _median(sched, reps), "prepare": _median(prep, reps)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tiny", action="store_true", help="small sizes on any device (rehearsal)")
    ap.add_argument("--reps", type=int, default=None)
    a = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() and not a.tiny else "cpu")
    reps = a.reps or (3 if a.tiny else 25)
    vocab = 4096 if a.tiny else QWEN3_VOCAB
    rows: list[tuple[str, str, float, int]] = [("eager_op", "add_", eager_op_us(dev, 200 if a.tiny else 2000, reps),
                                                 reps)]
    for n in GRAPH_NODES:
        launch, device = graph_replay_us(dev, n, reps)
        rows += [("graph_replay_launch", str(n), launch, reps), ("graph_replay_device", str(n), device, reps)]
    for b in SAMPLER_ROWS[:2] if a.tiny else SAMPLER_ROWS:
        for k, v in sampler_rows(dev, vocab, b, reps).items():
            rows.append((f"sampler_{k}", str(b), v, reps))
    for k, v in python_us(reps).items():
        rows.append(("python", k, v, reps))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "step_floor.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["measure", "param", "value_us", "reps"])
        w.writerows([(m, p, f"{v:.3f}", r) for m, p, v, r in rows])
    host = {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
            "logical_cpus": os.cpu_count(), "vocab": vocab}
    try:
        host["cpu_model"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                                 if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    (out / "host.json").write_text(json.dumps(host, indent=1) + "\n")
    for m, p, v, _r in rows:
        print(f"{m:22s} {p:>8s} {v:10.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
