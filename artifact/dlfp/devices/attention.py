"""Attention time of a chunked-prefill batch: FlashAttention-2-style prefill of one chunk plus split-KV decodes.

MODEL PREDICTION: no public measurement of these kernels in the shapes of this artifact exists (Vidur's
attention tables are not in its public snapshot), so nothing here is fitted to attention times; the GPU
measurement script ``benchmarks/gpu/measure_layers.py`` is meant to check it.

Prefill of a chunk of ``c`` query tokens after ``p`` prior context tokens (lower-right causal: query ``j`` of
the chunk sees keys ``0 .. p + j``), on one of ``tp`` GPUs with ``n_q`` query heads each:

* work: the chunk is cut in query blocks of ``block_m`` rows (FlashAttention-2 forward, head dim 128:
  ``kBlockM = 128``, ``kBlockN = 64``; Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism and
  Work Partitioning", and ``flash_fwd_launch_template.h``). One CTA = one (query block, head) tile; it loops
  over ``ceil(keys / block_n)`` key blocks, each ``4 * block_m * block_n * head_dim`` FLOPs (QK^T and PV, masked
  blocks computed in full). A tile runs on one SM at ``eff_tile`` of the SM's share of peak
  (``peak_flops / sm_count``; ``eff_tile`` = 0.73, the best forward efficiency reported for A100 in the paper).
  Tiles are list-scheduled, longest first, onto the SMs; the compute time is the makespan (waves, including
  the partial last wave and the causal imbalance of tile lengths).
* memory: each chunk re-reads the whole KV prefix: ``(p + c) * 2 * n_kv * head_dim * dtype_bytes`` bytes
  (K and V, once per chunk: tiles of one KV head share it through L2), plus ``Q`` read and ``O`` written,
  ``2 * c * n_q * head_dim * dtype_bytes``; at ``eff_memory`` of datasheet HBM bandwidth.
* ``t = launch_s + blend(t_compute, t_memory, p)`` with ``launch_s``, ``eff_memory`` and the blend exponent of
  the projection GEMMs (``operators.yaml``, fitted on measured GEMMs: streaming reads and kernel launch are the
  same hardware paths; on a GPU with its own fitted GEMM section, that GPU's). ``eff_tile`` is the A100 figure on
  every GPU: no attention measurement of another GPU is in this artifact (on an H100 it is an assumption).

Decodes (``d`` requests at context ``L``): split-KV (flash-decoding) kernel, one CTA per (request, KV head,
split) with the query heads of a KV group packed into ``splitkv_block_m`` rows; enough splits
(``ceil(sm_count / (d * n_kv))``, at most ``ceil(L / splitkv_block_n)`` and 128) to cover the SMs once; time =
``launch_s`` (split kernel) + ``launch_s`` (combine kernel) + ``blend(compute waves, KV bytes / bandwidth)``
with KV bytes ``d * L * 2 * n_kv * head_dim * dtype_bytes``.

A mixed batch is costed as the prefill kernel plus the decode kernel (run one after the other). Units:
seconds, tokens, bytes, FLOPs.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from dlfp.devices.roofline import CostModelError, GPUSpec
from dlfp.devices.operators import CONSTANTS_PATH, LayerShape, OperatorConstants, blend, load_constants


@dataclass(frozen=True)
class AttentionConstants:
    """Kernel block sizes and tile efficiency (``attention`` section of ``operators.yaml``; sources there)."""

    block_m: int = 128
    block_n: int = 64
    eff_tile: float = 0.73
    splitkv_block_n: int = 128
    splitkv_block_m: int = 64


@lru_cache(maxsize=None)
def load_attention_constants(path: str | None = None) -> AttentionConstants:
    """The ``attention`` section of ``operators.yaml`` (or of the YAML at ``path``).

    Raises:
        CostModelError: a missing section or a non-positive value (message names the field).
    """
    d = yaml.safe_load(Path(path or CONSTANTS_PATH).read_text()).get("attention")
    if d is None:
        raise CostModelError("field attention: missing from operator constants")
    c = AttentionConstants(**d)
    for k, v in vars(c).items():
        if not (isinstance(v, (int, float)) and v > 0):
            raise CostModelError(f"field attention.{k}: must be positive, got {v!r}")
    return c


def makespan(durations: list[float], workers: int) -> float:
    """Finish time of list scheduling ``durations`` longest first onto ``workers`` identical workers."""
    if not durations:
        return 0.0
    if len(durations) <= workers:
        return max(durations)
    heap = [0.0] * workers
    for d in sorted(durations, reverse=True):
        heapq.heapreplace(heap, heap[0] + d)
    return max(heap)


class AttentionModel:
    """Attention kernel times (seconds) of ``shape`` on ``gpu`` (see module docstring; a model prediction).

    Args:
        shape: the layer; gpu: datasheet GPU with an SM count in the operator constants;
        constants: operator constants (``launch_s``, ``eff_memory``, ``blend_p`` of the GEMMs are reused; the GPU's
            own GEMM section where it has one, :meth:`dlfp.devices.operators.OperatorConstants.for_gpu`);
        attention: block sizes and tile efficiency.

    Raises:
        CostModelError: GPU without an SM count (field ``gpu``).
    """

    def __init__(self, shape: LayerShape, gpu: GPUSpec, constants: OperatorConstants | None = None,
                 attention: AttentionConstants | None = None):
        self.shape, self.gpu = shape, gpu
        self.c = (constants or load_constants()).for_gpu(gpu.key)
        self.a = attention or load_attention_constants()
        if gpu.key not in self.c.sm_count:
            raise CostModelError(f"field gpu: no SM count for {gpu.key!r} in operator constants")
        self.sms = int(self.c.sm_count[gpu.key])
        self.sm_flops = gpu.peak_flops / self.sms * self.a.eff_tile
        self.bw = gpu.hbm_bw * self.c.gemm.eff_memory

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """K and V bytes of one token in one layer on one GPU: ``2 * n_kv * head_dim * dtype_bytes``."""
        _, nkv = self.shape.heads(tp)
        return 2.0 * nkv * self.shape.hd * self.shape.dtype_bytes

    def prefill_tiles(self, c: int, p: int, tp: int = 1) -> list[int]:
        """Key blocks of every (query block, head) tile of a chunk of ``c`` after ``p`` (one entry per tile)."""
        nq, _ = self.shape.heads(tp)
        bm, bn = self.a.block_m, self.a.block_n
        per_head = []
        for i in range(math.ceil(c / bm)):
            rows = min(bm, c - i * bm)
            per_head.append(math.ceil((p + i * bm + rows) / bn))
        return per_head * nq

    def prefill_flops(self, c: int, p: int, tp: int = 1) -> float:
        """Tensor-core FLOPs executed (masked blocks included): ``4 * block_m * block_n * hd`` per key block."""
        a = self.a
        return 4.0 * a.block_m * a.block_n * self.shape.hd * sum(self.prefill_tiles(c, p, tp))

    def prefill_bytes(self, c: int, p: int, tp: int = 1) -> float:
        """HBM bytes: KV prefix and chunk ``(p + c) * kv_bytes_per_token`` + Q read and O write."""
        nq, _ = self.shape.heads(tp)
        return (p + c) * self.kv_bytes_per_token(tp) + 2.0 * c * nq * self.shape.hd * self.shape.dtype_bytes

    def prefill_time(self, c: int, p: int = 0, tp: int = 1) -> float:
        """Seconds of the prefill attention kernel for one chunk of ``c`` tokens after ``p`` prior tokens.

        Raises:
            CostModelError: ``c < 1`` or ``p < 0``.
        """
        if c < 1 or p < 0:
            raise CostModelError(f"field prefill: need chunk >= 1 and context >= 0, got ({c}, {p})")
        a = self.a
        tile_s = 4.0 * a.block_m * a.block_n * self.shape.hd / self.sm_flops
        t_c = makespan([k * tile_s for k in self.prefill_tiles(c, p, tp)], self.sms)
        t_m = self.prefill_bytes(c, p, tp) / self.bw
        return self.c.gemm.launch_s + blend(t_c, t_m, self.c.gemm.blend_p)

    def decode_splits(self, d: int, context: int, tp: int = 1) -> int:
        """Splits of the KV sequence per (request, KV head) so the CTAs cover the SMs once (at most 128)."""
        _, nkv = self.shape.heads(tp)
        return max(1, min(math.ceil(self.sms / (d * nkv)), math.ceil(context / self.a.splitkv_block_n), 128))

    def decode_time(self, d: int, context: int, tp: int = 1) -> float:
        """Seconds of the split-KV decode attention of ``d`` requests at ``context`` tokens (0 when ``d == 0``).

        Raises:
            CostModelError: negative ``d`` or ``context < 1`` with ``d > 0``.
        """
        if d < 0 or (d > 0 and context < 1):
            raise CostModelError(f"field decodes: need d >= 0 and context >= 1, got d={d}, context={context}")
        if d == 0:
            return 0.0
        t_c = self.decode_compute_time(d, math.ceil(context / self.a.splitkv_block_n), tp)
        t_m = d * context * self.kv_bytes_per_token(tp) / self.bw
        return 2 * self.c.gemm.launch_s + blend(t_c, t_m, self.c.gemm.blend_p)

    def decode_compute_time(self, d: int, kv_blocks: int, tp: int = 1) -> float:
        """Compute waves (s) of the split-KV decode of ``d`` requests whose context spans ``kv_blocks`` blocks of
        ``splitkv_block_n`` keys. It depends on the context only through ``kv_blocks`` (``ceil(ceil(L / s) / n)
        = ceil(ceil(L / n) / s)``), so callers may cache it by ``(d, kv_blocks)``."""
        a = self.a
        _, nkv = self.shape.heads(tp)
        splits = max(1, min(math.ceil(self.sms / (d * nkv)), kv_blocks, 128))
        blocks = math.ceil(kv_blocks / splits)
        cta_s = 4.0 * a.splitkv_block_m * a.splitkv_block_n * self.shape.hd * blocks / self.sm_flops
        return math.ceil(d * nkv * splits / self.sms) * cta_s

    def batch_time(self, c: int, p: int, d: int, context: int, tp: int = 1) -> float:
        """Seconds of one layer's attention for a chunk ``(c, p)`` (``c = 0``: none) plus ``d`` decodes."""
        return (self.prefill_time(c, p, tp) if c > 0 else 0.0) + self.decode_time(d, context, tp)


__all__ = ["AttentionConstants", "AttentionModel", "load_attention_constants", "makespan"]
