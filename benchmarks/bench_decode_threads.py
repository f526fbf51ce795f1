"""How one decode-sized forward of the tiny CPU model depends on thread settings (a host diagnosis).

A Qwen3-tiny-shaped chain of fp32 matmuls (``dlfp/models/hf/qwen3-tiny/config.json``: 4 layers of q/k/v/o and
gate/up/down projections, then the LM head) over ``--batch`` decode rows, timed in a fresh process per setting
(OpenMP reads its environment once, at start): ``OMP_NUM_THREADS`` unset / 1 / 2, ``torch.set_num_threads``
1 / 2 and ``OMP_WAIT_POLICY`` unset / ``PASSIVE`` / ``ACTIVE``, each alone and beside a process that keeps one
CPU busy (as the engine's front end or a neighbour does on a small VM).
Prints one line per setting: median and 90th percentile of one forward, in milliseconds.

    python benchmarks/bench_decode_threads.py [--batch 8] [--iters 300]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, time
import torch
cfg, batch, iters, threads = json.loads(sys.argv[1])
if threads:
    torch.set_num_threads(threads)
h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
g = torch.Generator().manual_seed(0)
layers = [[torch.randn(h, n, generator=g) * 0.02 for n in (q, kv, kv)] + [torch.randn(q, h, generator=g) * 0.02,
          torch.randn(h, i, generator=g) * 0.02, torch.randn(h, i, generator=g) * 0.02,
          torch.randn(i, h, generator=g) * 0.02] for _ in range(cfg["num_hidden_layers"])]
head = torch.randn(h, v, generator=g) * 0.02
x0 = torch.randn(batch, h, generator=g)

def forward(x):
    for wq, wk, wv, wo, wg, wu, wd in layers:
        a = x @ wq
        x @ wk, x @ wv
        x = x + a @ wo
        x = x + (torch.nn.functional.silu(x @ wg) * (x @ wu)) @ wd
    return (x @ head).argmax(-1)

with torch.inference_mode():
    for _ in range(20):
        forward(x0)
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        forward(x0)
        ts.append(time.perf_counter() - t)
ts.sort()
print(json.dumps({"p50_ms": ts[len(ts) // 2] * 1e3, "p90_ms": ts[int(len(ts) * 0.9)] * 1e3,
                  "torch_threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads(),
                  "capability": torch.backends.cpu.get_cpu_capability()}))
"""

BURN = "import time\nwhile True:\n    pass\n"


def one(cfg: dict, batch: int, iters: int, omp: str | None, threads: int | None, busy: bool,
        wait: str | None = None) -> dict:
    """Time the chain in a fresh process with these settings (``wait``: ``OMP_WAIT_POLICY``); ``busy`` runs a
    one-CPU burner beside it. Returns the child's ``p50_ms``, ``p90_ms`` and torch's thread settings."""
    env = dict(os.environ)
    for k, v in (("OMP_NUM_THREADS", omp), ("OMP_WAIT_POLICY", wait)):
        env.pop(k, None)
        if v is not None:
            env[k] = v
    burner = subprocess.Popen([sys.executable, "-c", BURN]) if busy else None
    try:
        if burner is not None:
            time.sleep(0.2)
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([cfg, batch, iters, threads])], env=env,
                             capture_output=True, text=True, check=True).stdout
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8, help="decode rows per forward (default 8)")
    ap.add_argument("--iters", type=int, default=300, help="timed forwards per setting (default 300)")
    a = ap.parse_args(argv)
    from dlfp.hostinfo import host_identity, host_label
    from dlfp.paths import HF_MODELS_DIR

    cfg = json.loads((HF_MODELS_DIR / "qwen3-tiny" / "config.json").read_text())
    print(f"host: {host_label(host_identity())}; 1-minute load {os.getloadavg()[0]:.2f}")
    settings = ((None, None, None), ("1", None, None), ("2", None, None), (None, 1, None), (None, 2, None),
                ("1", 2, None), ("2", None, "PASSIVE"), ("2", None, "ACTIVE"))
    for busy in (False, True):
        for omp, threads, wait in settings:
            r = one(cfg, a.batch, a.iters, omp, threads, busy, wait)
            print(f"OMP_NUM_THREADS={omp or 'unset':5} torch.set_num_threads={threads or '-':2} "
                  f"OMP_WAIT_POLICY={wait or 'unset':7} "
                  f"{'+ 1 busy CPU' if busy else 'idle        '}: p50 {r['p50_ms']:7.2f} ms, p90 {r['p90_ms']:7.2f} "
                  f"ms (torch threads {r['torch_threads']}, interop {r['interop']}, {r['capability']})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
