"""What one iteration of the torch backend's Qwen3 costs on this device, by batch shape and attention mode.

For each model (``qwen3-0.6b``, ``qwen3-8b``; ``--tiny``: ``qwen3-tiny`` on the CPU) and each attention mode of
``dlfp.backends.torch.model.ATTENTION_MODES``, runs the batches of ``SHAPES`` (decodes alone; a prefill chunk of
3,072, 6,144 or 8,192 tokens after 0 or 32,768 cached ones beside 16 decodes) and records per batch, median of
``--reps`` after one warm-up:

* ``launch_ms``: host time for ``Qwen3.forward`` to return (every kernel enqueued, nothing waited for);
* ``device_ms``: CUDA-event time from before the first kernel to after the last (wall clock on the CPU);
* ``wall_ms``: host time from the call to the output synchronised.

Plus one row per model of the host's cost to enqueue one small CUDA kernel (``op_us``: 2,000 in-place adds).
Writes ``step_costs.csv`` into ``--out`` (default ``$OUT``). Times in milliseconds (``op_us`` in microseconds).
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "artifact"))

from dlfp.backends.torch.model import (ATTENTION_MODES, Entry, Qwen3, dtype_for, load_hf_config,  # noqa: E402
                                       mode_name)

#: name -> (chunk tokens, cached tokens before the chunk, decodes, decode context)
SHAPES = {
    "decode16@2k": (0, 0, 16, 2048),
    "decode8@8k+1@40k": (0, 0, 8, 8192),
    "chunk3072+16": (3072, 0, 16, 2048),
    "chunk6144+16": (6144, 0, 16, 2048),
    "chunk3072@32k+16": (3072, 32768, 16, 2048),
    "chunk6144@32k+16": (6144, 32768, 16, 2048),
    "chunk8192@32k+16": (8192, 32768, 16, 2048),
}
TINY_SHAPES = {"decode4@256": (0, 0, 4, 256), "chunk128+4": (128, 0, 4, 256), "chunk128@512+4": (128, 512, 4, 256)}
COLUMNS = ["model", "mode", "shape", "chunk", "prior", "decodes", "decode_context", "long_decode_context",
           "launch_ms", "device_ms", "wall_ms", "op_us", "gpu_name", "torch_version"]


def batch(shape: tuple, vocab: int, pin: bool, long_ctx: int) -> list[Entry]:
    """Entries of one shape: the chunk at pool position 0, each decode in its own range after it."""
    chunk, prior, d, ctx = shape
    g = torch.Generator().manual_seed(0)
    out, base = [], 0
    if chunk:
        p = torch.randint(0, vocab, (prior + chunk,), generator=g)
        out.append(Entry(0, p.pin_memory() if pin else p, prior, chunk, True, 0))
        base = prior + chunk + 1
    ctxs = [ctx] * d + ([long_ctx] if long_ctx else [])
    for i, c in enumerate(ctxs):
        p = torch.randint(0, vocab, (c,), generator=g)
        out.append(Entry(1 + i, p.pin_memory() if pin else p, c - 1, 1, False, base, decode=True))
        base += c + 1
    return out


def measure(model: Qwen3, entries: list[Entry], reps: int) -> tuple[float, float, float]:
    cuda = model.device.type == "cuda"
    launch, dev, wall = [], [], []
    for i in range(reps + 1):
        if cuda:
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            s.record()
            model.forward(entries)
            e.record()
            t1 = time.perf_counter()
            e.synchronize()
            t2 = time.perf_counter()
            d = s.elapsed_time(e)
        else:
            t0 = time.perf_counter()
            model.forward(entries)
            t1 = t2 = time.perf_counter()
            d = (t2 - t0) * 1e3
        if i:
            launch.append((t1 - t0) * 1e3)
            dev.append(d)
            wall.append((t2 - t0) * 1e3)
    return statistics.median(launch), statistics.median(dev), statistics.median(wall)


def op_us(device: str, n: int = 2000) -> float:
    """Host microseconds to enqueue one small in-place add (median of 3 runs of ``n``)."""
    x = torch.zeros(16, device=device)
    runs = []
    for _ in range(3):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        runs.append((time.perf_counter() - t0) / n * 1e6)
    if device == "cuda":
        torch.cuda.synchronize()
    return statistics.median(runs)


def run(out: Path, tiny: bool, reps: int) -> Path:
    device = "cpu" if tiny else "cuda"
    models = ("qwen3-tiny",) if tiny else ("qwen3-0.6b", "qwen3-8b")
    shapes = TINY_SHAPES if tiny else SHAPES
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    rows = []
    t_start = time.time()
    with torch.inference_mode():
        for name in models:
            m = Qwen3(load_hf_config(name), device, dtype_for(device), max_positions=65536, max_slots=32,
                      max_outputs=8)
            m.reserve(200_000 if not tiny else 8192)
            can_gqa = m.gqa
            rows.append({"model": name, "mode": "", "shape": "host_op", "op_us": round(op_us(device), 2),
                         "gpu_name": gpu, "torch_version": torch.__version__})
            for gqa, mode in ATTENTION_MODES:
                if gqa and not can_gqa:
                    continue
                m.gqa, m.decode_mode = gqa, mode
                for sname, shape in shapes.items():
                    long_ctx = 40000 if sname.endswith("+1@40k") else 0
                    entries = batch(shape, m.shape.vocab, device == "cuda", long_ctx)
                    la, de, wa = measure(m, entries, reps)
                    rows.append({"model": name, "mode": mode_name(gqa, mode), "shape": sname,
                                 "chunk": shape[0], "prior": shape[1], "decodes": shape[2],
                                 "decode_context": shape[3], "long_decode_context": long_ctx,
                                 "launch_ms": round(la, 3), "device_ms": round(de, 3), "wall_ms": round(wa, 3),
                                 "gpu_name": gpu, "torch_version": torch.__version__})
                    print(f"{name} {rows[-1]['mode']} {sname}: launch {la:.1f} ms, device {de:.1f} ms", flush=True)
            del m
            if device == "cuda":
                torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "step_costs.csv"
    tmp = path.with_name(".step_costs.csv.tmp")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n", restval="")
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)
    print(f"wrote {len(rows)} rows to {path} in {time.time() - t_start:.0f} s", flush=True)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tiny", action="store_true", help="the tiny model on the CPU")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    run(Path(a.out), a.tiny, a.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
