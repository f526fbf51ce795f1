"""A Qwen3 decoder-only model in plain PyTorch with random weights, for mixed chunked-prefill batches.

Built from a shipped Hugging Face ``config.json`` (``dlfp/models/hf/<model>/config.json``), no checkpoint: every
projection weight is drawn from ``N(0, 1 / fan_in)`` (unit-scale activations), the embedding from
``N(0, initializer_range^2)`` (Hugging Face's initialisation), norm weights are ones, all with a fixed seed. A
forward pass does the work of the real model (same shapes, same kernels); greedy decoding from its logits gives
varied token ids (not one repeated token), identical across arms only as far as the arithmetic is
batch-invariant.

One iteration (``Qwen3.forward``) runs the scheduled requests of a batch together: prefill chunks first, then one
token per decode, as vLLM's ``GPUModelRunner`` lays them out. Per layer (``transformers``'
``Qwen3DecoderLayer``): RMSNorm, fused QKV projection, per-head q/k RMSNorm, rotary embedding (half rotation,
``rope_theta``), grouped-query attention over each request's own KV cache, output projection, residual,
RMSNorm, SwiGLU MLP (fused gate+up), residual. Then the final RMSNorm and the LM head over the sampled rows only
(vLLM's ``logits_indices``) and a greedy argmax in float32.

The KV cache is one flat pool per model, ``[layers, 2, pool_tokens, kv_heads, head_dim]``; each request owns a
contiguous range of ``prompt + output`` tokens of it from its first chunk until it finishes (``KVPool``). Each
layer writes the batch's new K/V with one ``index_copy_``. A prefill chunk of ``n`` new tokens after ``c`` cached
ones attends with one ``scaled_dot_product_attention`` call over the ``c + n`` keys of its range, with a
lower-right causal mask (``torch.nn.attention.bias.causal_lower_right``; FlashAttention on CUDA). The decodes of
an iteration attend together: their keys are gathered into a padded ``[decodes, longest context]`` batch with a
padding mask (one gather and one attention call per layer, whatever the number of decodes). vLLM's paged decode
kernel reads the KV cache in place; the gather here reads it, writes the padded copy and reads that again.

Unlike vLLM this runs eagerly (no CUDA graphs, no fused kernels): each iteration launches about
``layers x (20 + prefill chunks)`` kernels, which puts a per-step floor under small batches that vLLM does not
have.
Units: tokens; shapes in the docstrings.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from dlfp.paths import HF_MODELS_DIR as HF_DIR



class ModelTooLarge(ValueError):
    """The model's weights plus its minimum KV cache do not fit the device's free memory (sizes in the message)."""


def load_hf_config(model: str) -> dict:
    """The shipped ``config.json`` of ``model`` (``dlfp/models/hf/<model>/config.json``).

    Raises:
        ValueError: no shipped config for ``model`` (lists the known ones).
    """
    path = HF_DIR / model / "config.json"
    if not path.is_file():
        known = sorted(p.name for p in HF_DIR.iterdir() if (p / "config.json").is_file())
        raise ValueError(f"model {model!r}: no config.json under {HF_DIR}; known: {', '.join(known)}")
    return json.loads(path.read_text())


@dataclass(frozen=True)
class Shape:
    """The dimensions of a Qwen3 model that the forward pass needs (names as in ``config.json``)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float
    theta: float
    tied: bool

    @classmethod
    def from_config(cls, cfg: dict) -> "Shape":
        heads = int(cfg["num_attention_heads"])
        return cls(hidden=int(cfg["hidden_size"]), intermediate=int(cfg["intermediate_size"]),
                   layers=int(cfg["num_hidden_layers"]), heads=heads, kv_heads=int(cfg["num_key_value_heads"]),
                   head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads), vocab=int(cfg["vocab_size"]),
                   eps=float(cfg.get("rms_norm_eps", 1e-6)), theta=float(cfg.get("rope_theta", 1e6)),
                   tied=bool(cfg.get("tie_word_embeddings", False)))

    def weight_bytes(self, dtype_bytes: int) -> int:
        """Bytes of every weight (embedding, layers, final norm and an untied LM head)."""
        h, d = self.hidden, self.head_dim
        layer = (h * (self.heads + 2 * self.kv_heads) * d + self.heads * d * h + 3 * h * self.intermediate
                 + 2 * h + 2 * d)
        emb = self.vocab * h * (1 if self.tied else 2)
        return dtype_bytes * (self.layers * layer + emb + h)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V per token over all layers."""
        return dtype_bytes * 2 * self.layers * self.kv_heads * self.head_dim


@dataclass
class Entry:
    """One request's part of an iteration: ``tokens`` new positions after ``computed`` cached ones.

    ``slot`` indexes the request's row of the output-token buffer; ``prompt`` holds its prompt ids (int64 CPU
    tensor, shape ``[prompt_tokens]``); ``base`` is the first pool token of its KV range; ``samples``: the last
    position's logits are sampled (the token at position ``computed + tokens``); ``decode``: a one-token step of a
    request whose prompt is computed.
    """

    slot: int
    prompt: torch.Tensor
    computed: int
    tokens: int
    samples: bool
    base: int
    decode: bool = False


class KVPool:
    """First-fit allocator of contiguous token ranges in a pool of ``tokens`` KV slots (host-side bookkeeping).

    Raises:
        RuntimeError: from ``alloc`` when no free range is long enough.
    """

    def __init__(self, tokens: int):
        self.tokens = int(tokens)
        self.free: list[list[int]] = [[0, self.tokens]]  # sorted [start, end) ranges

    def alloc(self, n: int) -> int:
        """The start of a free range of ``n`` tokens, now taken."""
        for i, (a, b) in enumerate(self.free):
            if b - a >= n:
                if b - a == n:
                    del self.free[i]
                else:
                    self.free[i][0] = a + n
                return a
        raise RuntimeError(f"KV pool of {self.tokens} tokens has no free range of {n} tokens")

    def release(self, start: int, n: int) -> None:
        """Give ``[start, start + n)`` back, merging it with its free neighbours."""
        self.free.append([start, start + n])
        self.free.sort()
        merged: list[list[int]] = []
        for a, b in self.free:
            if merged and merged[-1][1] == a:
                merged[-1][1] = b
            else:
                merged.append([a, b])
        self.free = merged


#: ``(enable_gqa, decode_mode)`` combinations ``Qwen3`` can run; the first is the default on the CPU.
ATTENTION_MODES = ((True, "padded"), (False, "padded"), (True, "per_request"), (False, "per_request"))


def mode_name(gqa: bool, decode_mode: str) -> str:
    """The name of an attention mode in options, traces and tables, e.g. ``gqa-padded``, ``repeat-per_request``."""
    return f"{'gqa' if gqa else 'repeat'}-{decode_mode}"


#: The names of ``ATTENTION_MODES``, in the same order.
ATTENTION_NAMES = tuple(mode_name(*m) for m in ATTENTION_MODES)


class Qwen3:
    """Random-weight Qwen3 on one device (see module docstring).

    Args:
        cfg: a ``config.json`` dict.
        device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"``.
        dtype: weight and activation dtype (BF16 on CUDA, float32 on CPU).
        max_positions: length of the rotary table (``max_model_len``).
        max_slots: rows of the output-token buffer (``max_num_seqs``); max_outputs: its columns.
        seed: weight seed.
    """

    def __init__(self, cfg: dict, device: str, dtype: torch.dtype, *, max_positions: int, max_slots: int,
                 max_outputs: int, seed: int = 0):
        s = self.shape = Shape.from_config(cfg)
        self.device, self.dtype = torch.device(device), dtype
        g = torch.Generator(device=self.device).manual_seed(seed)

        def w(rows: int, cols: int) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=g, device=self.device, dtype=torch.float32)
                    / math.sqrt(cols)).to(dtype)

        def ones(n: int) -> torch.Tensor:
            return torch.ones(n, device=self.device, dtype=dtype)

        h, d = s.hidden, s.head_dim
        # the embedding at Hugging Face's initialisation (normal, std = config's initializer_range): with unit-scale
        # embeddings the residual stream is the input token's own embedding and greedy decoding repeats one token
        std = float(cfg.get("initializer_range", 0.02))
        self.embed = (torch.randn(s.vocab, h, generator=g, device=self.device, dtype=torch.float32) * std).to(dtype)
        self.layers = [dict(qkv=w((s.heads + 2 * s.kv_heads) * d, h), o=w(h, s.heads * d),
                            gate_up=w(2 * s.intermediate, h), down=w(h, s.intermediate),
                            ln1=ones(h), ln2=ones(h), q_norm=ones(d), k_norm=ones(d)) for _ in range(s.layers)]
        self.norm = ones(h)
        self.lm_head = self.embed if s.tied else w(s.vocab, h)
        half = d // 2
        inv = 1.0 / (s.theta ** (torch.arange(half, device=self.device, dtype=torch.float32) / half))
        ang = torch.arange(max_positions + 1, device=self.device, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos = torch.cat([ang.cos(), ang.cos()], -1)  # [positions, head_dim]
        self.sin = torch.cat([ang.sin(), ang.sin()], -1)
        # out[slot, j]: the j-th output token of the request in ``slot``, written by the sampler on the device, read
        # by the request's next decode (and by a recomputed prefill) without a round trip through the host
        self.out = torch.zeros(max_slots, max_outputs + 1, device=self.device, dtype=torch.int64)

        # how attention runs (``ATTENTION_MODES``): grouped-query heads passed to SDPA (``enable_gqa``) or repeated
        # first, and the decodes padded into one call or one call each; ``choose_attention`` measures which is fastest
        self.gqa = self._gqa_usable()
        self.decode_mode = "padded"
        self.kv: torch.Tensor | None = None  # the KV pool (``reserve``)

    def set_attention(self, name: str) -> None:
        """Run attention in the mode ``name`` (one of ``ATTENTION_NAMES``).

        Raises:
            ValueError: an unknown name, or a GQA mode where SDPA refuses ``enable_gqa``.
        """
        if name not in ATTENTION_NAMES:
            raise ValueError(f"attention mode {name!r}; expected one of {', '.join(ATTENTION_NAMES)}")
        gqa, decode_mode = ATTENTION_MODES[ATTENTION_NAMES.index(name)]
        if gqa and not self._gqa_usable():
            raise ValueError(f"attention mode {name} needs enable_gqa, which SDPA refuses here")
        self.gqa, self.decode_mode = gqa, decode_mode

    def _gqa_usable(self) -> bool:
        """Whether SDPA takes ``enable_gqa`` with a lower-right causal mask here; otherwise K/V heads are repeated."""
        s = self.shape
        if s.heads == s.kv_heads:
            return False
        from torch.nn.attention.bias import causal_lower_right
        q = torch.zeros(1, s.heads, 2, s.head_dim, device=self.device, dtype=self.dtype)
        k = torch.zeros(1, s.kv_heads, 3, s.head_dim, device=self.device, dtype=self.dtype)
        try:
            F.scaled_dot_product_attention(q, k, k, attn_mask=causal_lower_right(2, 3), enable_gqa=True)
        except (RuntimeError, TypeError, NotImplementedError):
            return False
        return True

    def to_device(self, values) -> torch.Tensor:
        """An int64 tensor of ``values`` on the device without blocking the host (pinned, non-blocking copy on
        CUDA: a plain ``torch.tensor(..., device="cuda")`` would wait for the stream to drain)."""
        t = torch.as_tensor(values, dtype=torch.int64)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def reserve(self, tokens: int) -> None:
        """Allocate the KV pool: ``[layers, 2, tokens, kv_heads, head_dim]`` (kept while its size is unchanged)."""
        s = self.shape
        if self.kv is None or self.kv.shape[2] != tokens:
            self.kv = None
            self.kv = torch.empty(s.layers, 2, tokens, s.kv_heads, s.head_dim, device=self.device, dtype=self.dtype)

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.shape.eps)).to(x.dtype) * w

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of ``x`` [T, H, D] with ``cos``/``sin`` [T, 1, D] (half rotation)."""
        half = self.shape.head_dim // 2
        xf = x.float()
        rot = torch.cat([-xf[..., half:], xf[..., :half]], -1)
        return (xf * cos + rot * sin).to(x.dtype)

    def inputs(self, entries: list[Entry]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and positions ``[T]`` of a batch, on the device (host copies are non-blocking).

        A prompt position's id comes from the request's prompt; a later position's (a decode, or a prefill
        recomputed after preemption) from the output buffer, which the previous iteration's sampler wrote on the
        device: so an iteration can be launched before the previous one's tokens reach the host.
        """
        ids, pos = [], []
        for e in entries:
            lo, hi = e.computed, e.computed + e.tokens
            p = e.prompt.shape[0]
            if lo < p:
                ids.append(e.prompt[lo:min(hi, p)].to(self.device, non_blocking=True))
            if hi > p:
                ids.append(self.out[e.slot, max(lo, p) - p:hi - p])
            pos.append((lo, hi))
        idx = self.to_device(torch.cat([torch.arange(lo, hi) for lo, hi in pos]))
        return (torch.cat(ids) if len(ids) > 1 else ids[0]), idx

    @torch.inference_mode()
    def forward(self, entries: list[Entry]) -> torch.Tensor:
        """Run one iteration and return the greedy token of every sampled entry, in entry order ([S] int64, device).

        Entries are the prefill chunks first, then the decodes (the scheduler's order puts running requests first;
        the order only decides the rows). Writes each entry's K/V into its pool range at positions
        ``computed .. computed + tokens - 1`` and the sampled tokens into the output buffer.

        Raises:
            ValueError: an empty batch, or no KV pool (``reserve`` first).
        """
        if not entries:
            raise ValueError("forward: empty batch")
        if self.kv is None:
            raise ValueError("forward: no KV pool; call reserve(tokens) first")
        from torch.nn.attention.bias import causal_lower_right

        s = self.shape
        ids, pos = self.inputs(entries)
        t = ids.shape[0]
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        dev = self.device
        slots = self.to_device(np.concatenate([np.arange(e.base + e.computed, e.base + e.computed + e.tokens)
                                                for e in entries]))
        spans, start = [], 0
        for e in entries:
            spans.append((start, start + e.tokens))
            start += e.tokens
        chunks = [(e, a, b) for e, (a, b) in zip(entries, spans) if not e.decode]
        dec = [(e, a) for e, (a, _b) in zip(entries, spans) if e.decode]
        per_request = self.decode_mode == "per_request"
        if per_request:  # each decode attends alone over its own range, like a one-token chunk without a mask
            chunks = chunks + [(e, a, a + 1) for e, a in dec]
            dec = []
        if dec:
            gather, mask, rows_dec = self._decode_batch(dec)
        nq, nkv, d = s.heads * s.head_dim, s.kv_heads * s.head_dim, s.head_dim
        gqa, rep = self.gqa, s.heads // s.kv_heads
        kw = {"enable_gqa": True} if gqa else {}

        def heads(kx: torch.Tensor) -> torch.Tensor:
            return kx.repeat_interleave(rep, dim=-3) if rep > 1 and not gqa else kx

        x = self.embed[ids]
        for li, lw in enumerate(self.layers):
            y = self._rms(x, lw["ln1"])
            q, k, v = (y @ lw["qkv"].T).split([nq, nkv, nkv], dim=-1)
            q = self._rope(self._rms(q.view(t, s.heads, d), lw["q_norm"]), cos, sin)
            k = self._rope(self._rms(k.view(t, s.kv_heads, d), lw["k_norm"]), cos, sin)
            kp, vp = self.kv[li, 0], self.kv[li, 1]  # [pool, kv_heads, head_dim]
            kp.index_copy_(0, slots, k)
            vp.index_copy_(0, slots, v.reshape(t, s.kv_heads, d))
            att = torch.empty(t, nq, device=dev, dtype=x.dtype)
            for e, a, b in chunks:
                hi = e.computed + e.tokens
                ke = heads(kp[e.base:e.base + hi].permute(1, 0, 2)[None])
                ve = heads(vp[e.base:e.base + hi].permute(1, 0, 2)[None])
                mask_c = causal_lower_right(e.tokens, hi) if e.tokens > 1 else None
                o = F.scaled_dot_product_attention(q[a:b].transpose(0, 1)[None], ke, ve, attn_mask=mask_c, **kw)
                att[a:b] = o[0].transpose(0, 1).reshape(e.tokens, nq)
            if dec:
                kd = heads(kp[gather].permute(0, 2, 1, 3))  # [d, kv_heads, lmax, head_dim]
                vd = heads(vp[gather].permute(0, 2, 1, 3))
                o = F.scaled_dot_product_attention(q[rows_dec][:, :, None, :], kd, vd, attn_mask=mask, **kw)
                att[rows_dec] = o[:, :, 0, :].reshape(len(dec), nq)
            x = x + att @ lw["o"].T
            y = self._rms(x, lw["ln2"])
            gate, up = (y @ lw["gate_up"].T).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ lw["down"].T
        return self._sample(x, [(e, b) for e, (_a, b) in zip(entries, spans) if e.samples])

    def _decode_batch(self, dec: list) -> tuple:
        """The padded gather of the decodes' keys: pool indices ``[d, longest context]``, a boolean padding mask
        ``[d, 1, 1, longest]`` (``None`` for one decode) and the decodes' rows in the batch, all on the device."""
        ctx = np.array([e.computed + 1 for e, _ in dec])
        lmax = int(ctx.max())
        grid = np.minimum(np.arange(lmax)[None, :], ctx[:, None] - 1)
        gather = self.to_device(np.array([e.base for e, _ in dec])[:, None] + grid)
        pad = self.to_device(np.arange(lmax)[None, :] < ctx[:, None]).bool() if len(dec) > 1 else None
        return gather, (None if pad is None else pad[:, None, None, :]), self.to_device([a for _e, a in dec])

    def _sample(self, x: torch.Tensor, sampled: list) -> torch.Tensor:
        """Greedy ids of the sampled rows (final norm, LM head, float32 argmax), written to the output buffer."""
        if not sampled:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        hs = self._rms(x[self.to_device([b - 1 for _e, b in sampled])], self.norm)
        tok = (hs @ self.lm_head.T).float().argmax(-1)
        cols = [min(e.computed + e.tokens - e.prompt.shape[0], self.out.shape[1] - 1) for e, _b in sampled]
        self.out[self.to_device([e.slot for e, _b in sampled]), self.to_device(cols)] = tok
        return tok


def choose_attention(model: Qwen3, chunk: int = 2048, prior: int = 8192, decodes: int = 16,
                     context: int = 4096, reps: int = 3) -> dict:
    """Time every mode of ``ATTENTION_MODES`` that runs on this device on two batches (a chunk of ``chunk`` tokens
    after ``prior`` cached ones beside ``decodes`` decodes at ``context``; the decodes alone), keep the fastest by
    their summed time, and return ``{mode: milliseconds}`` with the choice under ``"chosen"``.

    On CUDA with CUDA events after one warm-up, on the CPU with the wall clock. Uses pool positions from 0 and
    output slot 0, so call it before a run. Raises ``ValueError`` when the pool is smaller than the batches.
    """
    import time

    need = chunk + prior + decodes * (context + 1) + 2
    if model.kv is None or model.kv.shape[2] < need:
        raise ValueError(f"choose_attention: the KV pool needs {need} tokens")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.shape.vocab, (prior + chunk,), generator=gen)
    dprompt = torch.randint(0, model.shape.vocab, (context,), generator=gen)
    if model.device.type == "cuda":
        prompt, dprompt = prompt.pin_memory(), dprompt.pin_memory()
    base = prior + chunk + 1
    decs = [Entry(0, dprompt, context - 1, 1, False, base + i * (context + 1), decode=True) for i in range(decodes)]
    mixed = [Entry(0, prompt, prior, chunk, False, 0)] + decs
    cuda = model.device.type == "cuda"

    def timed(batch: list[Entry]) -> float:
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            model.forward(batch)
            e.record()
            e.synchronize()
            return s.elapsed_time(e)
        t0 = time.perf_counter()
        model.forward(batch)
        return (time.perf_counter() - t0) * 1e3

    can_gqa = model.gqa
    out: dict = {}
    for (gqa, mode), name in zip(ATTENTION_MODES, ATTENTION_NAMES):
        if gqa and not can_gqa:
            continue
        model.gqa, model.decode_mode = gqa, mode
        ms = 0.0
        for batch in (mixed, decs):
            timed(batch)
            ms += sorted(timed(batch) for _ in range(reps))[reps // 2]
        out[name] = round(ms, 3)
    best = min(out, key=out.get)
    model.set_attention(best)
    out["chosen"] = best
    return out


def dtype_for(device: str) -> torch.dtype:
    """BF16 on CUDA (the paper's setting), float32 on CPU (this CPU has no BF16 kernels)."""
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def check_fits(shape: Shape, dtype: torch.dtype, free_bytes: int, min_kv_tokens: int, model: str) -> None:
    """Refuse a model whose weights and the KV cache of its longest request exceed ``free_bytes``.

    Raises:
        ModelTooLarge: one line with the weight, KV and free sizes in GiB.
    """
    nbytes = torch.tensor([], dtype=dtype).element_size()
    need_w = shape.weight_bytes(nbytes)
    need_kv = shape.kv_bytes_per_token(nbytes) * min_kv_tokens
    if need_w + need_kv > free_bytes:
        gib = 2 ** 30
        raise ModelTooLarge(f"model {model}: weights {need_w / gib:.1f} GiB + KV cache of the longest request "
                            f"{need_kv / gib:.1f} GiB exceed the device's free memory {free_bytes / gib:.1f} GiB")


__all__ = ["ATTENTION_MODES", "ATTENTION_NAMES", "Entry", "HF_DIR", "KVPool", "ModelTooLarge", "Qwen3", "Shape",
           "check_fits", "choose_attention", "dtype_for", "load_hf_config", "mode_name"]
