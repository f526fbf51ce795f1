"""Measure one Qwen3 decoder layer on a GPU: projection GEMMs, mixed chunked-prefill batches, attention.

Meant for a machine with PyTorch (2.11) and a CUDA GPU (H200), no vLLM and no network. It reads the shipped
Hugging Face ``config.json`` files (``artifact/dlfp/models/hf/<model>/config.json``), builds ONE decoder layer
with random BF16 weights per model, and times with ``torch.cuda.Event`` after warm-up:

(a) ``gemm``: each projection GEMM alone (fused QKV, output, fused gate+up, down) over ``num_tokens`` rows;
(b) ``layer``: the full layer forward for a mixed batch: one prefill chunk of ``c`` tokens after ``p`` prior
    context tokens (KV cache pre-filled) plus ``d`` decodes at 8,192 context;
(c) ``attention``: the attention of the same chunks (and of the decodes) alone, through
    ``torch.nn.functional.scaled_dot_product_attention`` with a lower-right causal mask
    (``torch.nn.attention.bias.causal_lower_right``); SDPA picks its backend (on an H200 with PyTorch 2.11 the
    flash backend refused these non-square causal shapes, so the rows' ``note`` says whether GQA was passed).

Models: ``qwen3-0.6b``, ``qwen3-8b``, and ``qwen3-32b`` with TP=2-sharded shapes (query/KV heads and MLP size
divided by 2: one GPU's shard). The layer is a self-contained torch implementation of ``Qwen3DecoderLayer``
(RMSNorm, fused QKV, per-head q/k RMSNorm, rotary embedding, GQA attention, SwiGLU MLP): mixed batches with a
separate KV prefix per request need a variable-length attention call that the Hugging Face layer does not
expose without its cache objects. When ``transformers`` provides ``Qwen3DecoderLayer``, the implementation is
checked against it on a plain prefill (rows ``kind=check``).

Writes one CSV (``$OUT/measure_layers.csv`` or ``--out``): one row per timed configuration, times in
milliseconds (median, mean, min, std over repetitions), and on every row the GPU identity (name, SM count,
clocks, driver, torch and CUDA versions). ``--device cpu --tiny`` runs tiny shapes in fp32 on the CPU (wall-clock
timing) so the test suite can run it; it also writes ``kind=check`` rows comparing the attention output with a
naive float64 reference.

Usage:  python benchmarks/gpu/measure_layers.py [--out DIR] [--device cuda|cpu] [--tiny] [--reps N]
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
HF_DIR = REPO / "artifact" / "dlfp" / "models" / "hf"
CHUNKS = (256, 512, 1024, 2048, 3072, 4096, 6144, 8192)
PRIORS = (0, 4096, 8192, 16384, 32768)
DECODES = (0, 1, 4, 16)
DECODE_CONTEXT = 8192
GEMM_TOKENS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
MODELS = (("qwen3-0.6b", 1), ("qwen3-8b", 1), ("qwen3-32b", 2))
#: The shapes the torch backend's runs hit (0.6B and 8B, chunks of 512 to 8,192 tokens after 0 to 32,768 cached
#: ones, beside 0 or 16 decodes): ``--grid torch``, a few minutes fewer than the full grid.
TORCH_GRID = dict(models=(("qwen3-0.6b", 1), ("qwen3-8b", 1)), chunks=(512, 1024, 2048, 3072, 6144, 8192),
                  priors=(0, 8192, 32768), decodes=(0, 16), decode_context=DECODE_CONTEXT, gemm_tokens=GEMM_TOKENS)
TINY = dict(models=(("qwen3-tiny", 1), ("qwen3-tiny", 2)), chunks=(16, 48), priors=(0, 40), decodes=(0, 2),
            decode_context=64, gemm_tokens=(1, 16, 64))
COLUMNS = ["kind", "model", "tp_shard", "op", "num_tokens", "chunk", "prior", "decodes", "decode_context",
           "dtype", "reps", "median_ms", "mean_ms", "min_ms", "std_ms", "max_abs_err", "note",
           "device", "gpu_name", "sm_count", "sm_clock_mhz", "max_sm_clock_mhz", "mem_clock_mhz", "driver",
           "torch_version", "cuda_version", "host"]


def load_config(model: str) -> dict:
    """The shipped ``config.json`` of ``model`` (``artifact/dlfp/models/hf/<model>/config.json``)."""
    return json.loads((HF_DIR / model / "config.json").read_text())


def shard(cfg: dict, tp: int) -> dict:
    """One GPU's shard of a ``tp``-way tensor-parallel layer: heads and MLP size divided by ``tp``.

    Raises:
        ValueError: a dimension not divisible by ``tp``.
    """
    out = dict(cfg)
    for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        if cfg[k] % tp:
            raise ValueError(f"{k}={cfg[k]} not divisible by tp={tp}")
        out[k] = cfg[k] // tp
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool = True) -> torch.Tensor:
    """Lower-right causal attention of ``q`` [B, Hq, Lq, D] over ``k``, ``v`` [B, Hkv, Lk, D] (``Lk >= Lq``).

    Query ``i`` sees keys ``0 .. Lk - Lq + i`` (the chunk follows ``Lk - Lq`` cached tokens). ``gqa``: pass
    ``enable_gqa`` to SDPA; otherwise K/V heads are repeated to ``Hq`` first.
    """
    from torch.nn.attention.bias import causal_lower_right
    if not gqa and k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    mask = causal_lower_right(q.shape[-2], k.shape[-2])
    kw = {"enable_gqa": True} if gqa and k.shape[1] != q.shape[1] else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Float64 reference of :func:`attention` (explicit scores, mask, softmax); independent of SDPA."""
    q, k, v = q.double(), k.double(), v.double()
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    lq, lk = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    allowed = torch.arange(lk)[None, :] <= (torch.arange(lq)[:, None] + (lk - lq))
    s = s.masked_fill(~allowed.to(s.device), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def flash_usable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> bool:
    """Whether SDPA's flash backend accepts these inputs (causal, as the lower-right path dispatches it)."""
    from torch.backends.cuda import SDPAParams, can_use_flash_attention
    if not gqa and k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    try:
        params = SDPAParams(q, k, v, None, 0.0, True, gqa and k.shape[1] != q.shape[1])
    except TypeError:  # older signature without enable_gqa
        params = SDPAParams(q, k, v, None, 0.0, True)
    return bool(can_use_flash_attention(params, False))


class Layer:
    """One Qwen3 decoder layer with random weights (self-contained torch; see module docstring)."""

    def __init__(self, cfg: dict, device: str, dtype: torch.dtype, seed: int = 0):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.h, self.nq, self.nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.hd, self.inter = cfg.get("head_dim", self.h // self.nq), cfg["intermediate_size"]
        self.eps, self.theta = cfg.get("rms_norm_eps", 1e-6), float(cfg.get("rope_theta", 1e6))

        def w(*shape):
            return (torch.randn(*shape, generator=g) / math.sqrt(shape[-1])).to(device=device, dtype=dtype)

        self.w_qkv = w((self.nq + 2 * self.nkv) * self.hd, self.h)
        self.w_o = w(self.h, self.nq * self.hd)
        self.w_gate_up = w(2 * self.inter, self.h)
        self.w_down = w(self.h, self.inter)
        self.ln1 = torch.ones(self.h, device=device, dtype=dtype)
        self.ln2 = torch.ones(self.h, device=device, dtype=dtype)
        self.q_norm = torch.ones(self.hd, device=device, dtype=dtype)
        self.k_norm = torch.ones(self.hd, device=device, dtype=dtype)
        self.device, self.dtype, self.gqa = device, dtype, True

    def rms(self, x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * w

    def rope(self, x, pos):
        """Rotary embedding (half rotation, as Qwen3/Llama) of ``x`` [T, H, D] at positions ``pos`` [T]."""
        half = self.hd // 2
        inv = 1.0 / (self.theta ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
        ang = pos.float()[:, None] * inv[None, :]
        cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None, :], torch.cat([ang.sin()] * 2, -1)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        rot = torch.cat([-x2, x1], -1)
        return (x.float() * cos + rot.float() * sin).to(x.dtype)

    def gemms(self):
        """``{name: weight [N, K]}`` of the four projection GEMMs (``y = x @ W.T``)."""
        return {"qkv_proj": self.w_qkv, "o_proj": self.w_o, "gate_up_proj": self.w_gate_up,
                "down_proj": self.w_down}

    def caches(self, chunk: int, prior: int, decodes: int, context: int):
        """KV caches: the chunk's request ``[1, Hkv, prior + chunk, D]`` (K, V) and the decodes'
        ``[d, Hkv, context, D]``, random, prior part pre-filled."""
        g = torch.Generator(device="cpu").manual_seed(1)

        def r(*s):
            return torch.randn(*s, generator=g).to(self.device, self.dtype)
        kc, vc = r(1, self.nkv, prior + chunk, self.hd), r(1, self.nkv, prior + chunk, self.hd)
        kd = vd = None
        if decodes:
            kd, vd = r(decodes, self.nkv, context, self.hd), r(decodes, self.nkv, context, self.hd)
        return kc, vc, kd, vd

    def forward(self, x, chunk: int, prior: int, decodes: int, context: int, kv):
        """Layer forward of ``x`` [chunk + decodes, h]: chunk tokens first, then one token per decode."""
        kc, vc, kd, vd = kv
        res = x
        y = self.rms(x, self.ln1)
        qkv = y @ self.w_qkv.T
        t = x.shape[0]
        q, k, v = qkv.split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = self.rms(q.view(t, self.nq, self.hd), self.q_norm)
        k = self.rms(k.view(t, self.nkv, self.hd), self.k_norm)
        v = v.view(t, self.nkv, self.hd)
        pos = torch.cat([torch.arange(prior, prior + chunk, device=x.device),
                         torch.full((decodes,), context - 1, device=x.device)])
        q, k = self.rope(q, pos), self.rope(k, pos)
        outs = []
        if chunk:
            kc[0, :, prior:prior + chunk] = k[:chunk].transpose(0, 1)
            vc[0, :, prior:prior + chunk] = v[:chunk].transpose(0, 1)
            qc = q[:chunk].transpose(0, 1)[None]
            outs.append(attention(qc, kc, vc, self.gqa)[0].transpose(0, 1).reshape(chunk, -1))
        if decodes:
            kd[:, :, context - 1] = k[chunk:]
            vd[:, :, context - 1] = v[chunk:]
            qd = q[chunk:][:, :, None, :]
            outs.append(attention(qd, kd, vd, self.gqa)[:, :, 0].reshape(decodes, -1))
        a = torch.cat(outs) if len(outs) > 1 else outs[0]
        x = res + a @ self.w_o.T
        y = self.rms(x, self.ln2)
        gu = y @ self.w_gate_up.T
        gate, up = gu.chunk(2, dim=-1)
        return x + (F.silu(gate) * up) @ self.w_down.T


def timer(fn, device: str, warmup: int, reps: int) -> list[float]:
    """Milliseconds of ``fn()`` per repetition (CUDA events on CUDA, wall clock on CPU), after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    out = []
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def gpu_identity(device: str) -> dict:
    """Name, SM count, clocks (nvidia-smi when present), driver, torch and CUDA versions."""
    ident = {"device": device, "gpu_name": "cpu", "sm_count": "", "sm_clock_mhz": "", "max_sm_clock_mhz": "",
             "mem_clock_mhz": "", "driver": "", "torch_version": torch.__version__,
             "cuda_version": str(torch.version.cuda or ""), "host": platform.node()}
    if device.startswith("cuda"):
        p = torch.cuda.get_device_properties(torch.device(device))
        ident.update(gpu_name=p.name, sm_count=p.multi_processor_count)
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,driver_version",
                                "--format=csv,noheader,nounits", "-i", str(torch.cuda.current_device())],
                               capture_output=True, text=True, timeout=20).stdout.strip().split(",")
            ident.update(sm_clock_mhz=q[0].strip(), max_sm_clock_mhz=q[1].strip(), mem_clock_mhz=q[2].strip(),
                         driver=q[3].strip())
        except (OSError, IndexError, subprocess.SubprocessError):
            pass
    else:
        ident["gpu_name"] = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return ident


def plan(tiny: bool, grid: str = "full") -> dict:
    """The grid: models, chunks, priors, decodes, decode context, GEMM token counts (``grid``: full or torch)."""
    if tiny:
        return dict(TINY)
    if grid == "torch":
        return dict(TORCH_GRID)
    return dict(models=MODELS, chunks=CHUNKS, priors=PRIORS, decodes=DECODES, decode_context=DECODE_CONTEXT,
                gemm_tokens=GEMM_TOKENS)


def count_configs(p: dict) -> dict:
    """Number of timed configurations per kind."""
    m = len(p["models"])
    g = m * 4 * len(p["gemm_tokens"])
    lay = m * len(p["chunks"]) * len(p["priors"]) * len(p["decodes"])
    att = m * (len(p["chunks"]) * len(p["priors"]) + sum(1 for d in p["decodes"] if d))
    return {"gemm": g, "layer": lay, "attention": att, "total": g + lay + att}


def stats(ms: list[float]) -> dict:
    return {"reps": len(ms), "median_ms": statistics.median(ms), "mean_ms": statistics.fmean(ms),
            "min_ms": min(ms), "std_ms": statistics.pstdev(ms)}


def hf_check(cfg: dict, layer: Layer, device: str, dtype) -> tuple[float | str, str]:
    """Max |difference| between this layer and transformers' ``Qwen3DecoderLayer`` on a plain prefill."""
    try:
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding
    except Exception as e:  # noqa: BLE001 - optional check
        return "", f"transformers Qwen3DecoderLayer unavailable: {type(e).__name__}"
    try:
        c = Qwen3Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype", "dtype")})
        c._attn_implementation = "sdpa"
        hf = Qwen3DecoderLayer(c, 0).to(device=device, dtype=dtype).eval()
        nqd, nkd = layer.nq * layer.hd, layer.nkv * layer.hd
        with torch.no_grad():
            a = hf.self_attn
            a.q_proj.weight.copy_(layer.w_qkv[:nqd])
            a.k_proj.weight.copy_(layer.w_qkv[nqd:nqd + nkd])
            a.v_proj.weight.copy_(layer.w_qkv[nqd + nkd:])
            a.o_proj.weight.copy_(layer.w_o)
            hf.mlp.gate_proj.weight.copy_(layer.w_gate_up[:layer.inter])
            hf.mlp.up_proj.weight.copy_(layer.w_gate_up[layer.inter:])
            hf.mlp.down_proj.weight.copy_(layer.w_down)
            t = 24
            x = torch.randn(1, t, layer.h, generator=torch.Generator().manual_seed(3)).to(device, dtype)
            pos = torch.arange(t, device=device)[None]
            emb = Qwen3RotaryEmbedding(c).to(device)(x, pos)
            out = hf(x, attention_mask=None, position_ids=pos, position_embeddings=emb)
            out = out[0] if isinstance(out, tuple) else out
            kv = layer.caches(t, 0, 0, 1)
            mine = layer.forward(x[0], t, 0, 0, 1, kv)
        return float((out[0].float() - mine.float()).abs().max()), "vs transformers Qwen3DecoderLayer, prefill 24"
    except Exception as e:  # noqa: BLE001 - API differences between transformers versions
        return "", f"transformers check failed: {type(e).__name__}: {e}"[:200]


def run(out_path: Path, device: str = "cuda", tiny: bool = False, reps: int | None = None,
        warmup: int | None = None, grid: str = "full") -> Path:
    """Time the grid and write the CSV to ``out_path``; returns the path.

    Raises:
        RuntimeError: CUDA requested but unavailable.
    """
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("CUDA requested but torch.cuda.is_available() is False (use --device cpu --tiny)")
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    reps = reps or (2 if tiny else 10)
    warmup = warmup if warmup is not None else (1 if tiny else 3)
    p = plan(tiny, grid)
    n = count_configs(p)
    print(f"timed configurations: {n['total']} ({n['gemm']} GEMM, {n['layer']} layer, {n['attention']} attention); "
          f"{reps} repetitions after {warmup} warm-up each", flush=True)
    ident = gpu_identity(device)
    rows = []

    def add(**kw):
        r = {c: "" for c in COLUMNS}
        r.update(ident)
        r.update(dtype=str(dtype).replace("torch.", ""), **kw)
        rows.append(r)

    t_start = time.time()
    torch.manual_seed(0)
    with torch.inference_mode():
        for model, tp in p["models"]:
            cfg = shard(load_config(model), tp)
            layer = Layer(cfg, device, dtype)
            if device.startswith("cuda"):
                qt = torch.zeros(1, layer.nq, 256, layer.hd, device=device, dtype=dtype)
                kt = torch.zeros(1, layer.nkv, 512, layer.hd, device=device, dtype=dtype)
                layer.gqa = flash_usable(qt, kt, kt, True)
            note = "enable_gqa" if layer.gqa else "kv heads repeated"
            err, how = hf_check(load_config(model) if tp == 1 else cfg, layer, device, dtype)
            add(kind="check", model=model, tp_shard=tp, op="layer_vs_transformers", max_abs_err=err, note=how)
            # (a) GEMMs
            for name, wt in layer.gemms().items():
                for m in p["gemm_tokens"]:
                    x = torch.randn(m, wt.shape[1], device=device, dtype=dtype)
                    ms = timer(lambda: x @ wt.T, device, warmup, reps)
                    add(kind="gemm", model=model, tp_shard=tp, op=name, num_tokens=m, **stats(ms))
            # (c) attention alone, with a check against the naive reference on CPU
            for c in p["chunks"]:
                for pr in p["priors"]:
                    kc, vc, _, _ = layer.caches(c, pr, 0, 1)
                    q = torch.randn(1, layer.nq, c, layer.hd, device=device, dtype=dtype)
                    ms = timer(lambda: attention(q, kc, vc, layer.gqa), device, warmup, reps)
                    err = ""
                    if device == "cpu":
                        err = float((attention(q, kc, vc, layer.gqa).double() - naive_attention(q, kc, vc)).abs().max())
                    add(kind="attention", model=model, tp_shard=tp, op="prefill_chunk", num_tokens=c, chunk=c,
                        prior=pr, max_abs_err=err, note=note, **stats(ms))
            for d in p["decodes"]:
                if not d:
                    continue
                _, _, kd, vd = layer.caches(0, 0, d, p["decode_context"])
                q = torch.randn(d, layer.nq, 1, layer.hd, device=device, dtype=dtype)
                ms = timer(lambda: attention(q, kd, vd, layer.gqa), device, warmup, reps)
                err = float((attention(q, kd, vd, layer.gqa).double() - naive_attention(q, kd, vd)).abs().max()) \
                    if device == "cpu" else ""
                add(kind="attention", model=model, tp_shard=tp, op="decode", num_tokens=d, decodes=d,
                    decode_context=p["decode_context"], max_abs_err=err, note=note, **stats(ms))
            # (b) full layer, mixed batches
            for c in p["chunks"]:
                for pr in p["priors"]:
                    for d in p["decodes"]:
                        kv = layer.caches(c, pr, d, p["decode_context"])
                        x = torch.randn(c + d, layer.h, device=device, dtype=dtype)
                        ms = timer(lambda: layer.forward(x, c, pr, d, p["decode_context"], kv), device, warmup, reps)
                        add(kind="layer", model=model, tp_shard=tp, op="layer", num_tokens=c + d, chunk=c, prior=pr,
                            decodes=d, decode_context=p["decode_context"], note=note, **stats(ms))
                        kv = None  # free the caches before the next batch
            layer = None  # free the weights before the next model
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            print(f"  {model} tp_shard={tp} done at {time.time() - t_start:.0f} s", flush=True)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    with open(tmp, "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        wr.writeheader()
        wr.writerows(rows)
    os.replace(tmp, out_path)
    print(f"wrote {len(rows)} rows to {out_path} in {time.time() - t_start:.0f} s", flush=True)
    return out_path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="output directory (default $OUT or .)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and grid (for CPU tests)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions per configuration")
    ap.add_argument("--grid", choices=("full", "torch"), default="full",
                    help="full grid, or the torch backend's shapes (0.6B and 8B)")
    ap.add_argument("--estimate", action="store_true", help="print the number of configurations and exit")
    a = ap.parse_args(argv)
    if a.estimate:
        print(count_configs(plan(a.tiny, a.grid)))
        return 0
    run(Path(a.out) / "measure_layers.csv", device=a.device, tiny=a.tiny, reps=a.reps, grid=a.grid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
