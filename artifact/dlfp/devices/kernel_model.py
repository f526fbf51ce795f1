"""Kernel-level device model: one iteration's device time summed over the kernels vLLM launches.

Where ``dlfp.devices.roofline.DeviceModel`` takes one roofline maximum per part of the iteration, this model
adds up the kernels of every decoder layer, each costed by the operator models that were held against measured
GPU operator times (``dlfp.devices.operators``, error tables in ``data/results/device/``):

    t = layers x (4 projection GEMMs + 5 elementwise kernels + attention + 2 all-reduces if TP > 1)
        + LM head GEMM over the sampled rows + the sampler over them

* projections and elementwise kernels at the batch's token count (``OperatorModel.gemm_time`` /
  ``elementwise_time``: a fixed launch time, tile quantisation and a smooth roofline blend; fitted on A100
  profiles and held out on the other Vidur files; the H100 has its own constants, fitted on its profiles);
* attention (``dlfp.devices.attention``, a model prediction): every prefill chunk re-reads its KV prefix,
  its (query block x head) tiles are spread over the SMs, the decodes use split-KV at their mean context;
* all-reduce of ``tokens x hidden x dtype_bytes`` after attention and after the MLP (ring over NVLink);
* the sampler (``dlfp.devices.sampler``: greedy sampling measured on an H200, by rows, its growth scaled by HBM
  bandwidth).

Small chunks therefore cost more per token than large ones (fixed kernel times, partial waves, KV re-reads):
the chunking cost the roofline cannot see. Per-token parts are cached by token count, attention by chunk.

Utilisation (for the energy model) is the roofline's: ideal time at peak FLOP/s plus ideal time at peak HBM
bandwidth over the modelled time, at most 1. Units: seconds, tokens, bytes, FLOPs.
"""
from __future__ import annotations

import math
from functools import lru_cache

from dlfp.devices.attention import AttentionModel
from dlfp.devices.batch import Batch, batch_counts
from dlfp.devices.operators import (ELEMENTWISE_OPS, GEMM_OPS, LayerShape, OperatorConstants, OperatorModel,
                                    blend, load_constants)
from dlfp.devices.roofline import Breakdown, DeviceAssumptions, DeviceModel
from dlfp.devices.sampler import sampler_time
from dlfp.devices.specs import GPUSpec, ModelSpec


def supports(gpu: GPUSpec) -> bool:
    """Whether the operator constants know this GPU (its SM count); else the roofline model is used."""
    return gpu.kind == "datasheet" and gpu.key in load_constants().sm_count


class KernelDeviceModel(DeviceModel):
    """``DeviceModel`` interface, kernel-level times (see module docstring).

    ``time(...)`` from aggregate counts treats the prefill tokens as one chunk; ``time_scheduled(entries,
    features)`` (the simulator) and ``time_batch(batch)`` (the emulator) see every chunk.

    Constructed directly (not through ``DeviceModel``), it takes ``constants``: operator constants other than
    ``operators.yaml``'s (e.g. without a GPU's own fitted sections, to compare), resolved per GPU as always.

    Raises:
        CostModelError: a model/TP combination that cannot run, or a GPU without operator constants.
    """

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int = 1, assumptions: DeviceAssumptions | None = None,
                 constants: OperatorConstants | None = None):
        super().__init__(model, gpu, tp, assumptions)
        self.shape = LayerShape.from_model_spec(model)
        self.ops = OperatorModel(self.shape, gpu, constants)
        self.att = AttentionModel(self.shape, gpu, constants)
        self.layers = model.num_hidden_layers
        self._ar_bytes_tok = model.hidden_size * model.dtype_bytes
        self._per_token = lru_cache(maxsize=None)(self._per_token_uncached)
        self._head = lru_cache(maxsize=None)(lambda n: self.ops.gemm_time("lm_head", n, self.tp) if n else 0.0)
        self._prefill = lru_cache(maxsize=None)(lambda c, p: self.att.prefill_time(c, p, self.tp))
        self._decode_compute = lru_cache(maxsize=None)(lambda d, n: self.att.decode_compute_time(d, n, self.tp))
        self._kv_bytes_tok = self.att.kv_bytes_per_token(tp)
        self._sampler = lru_cache(maxsize=None)(lambda n: sampler_time(n, gpu.hbm_bw))

    def _per_token_uncached(self, tokens: int) -> float:
        """One layer's projections, elementwise kernels and all-reduces at ``tokens`` rows (s)."""
        tp = self.tp
        t = sum(self.ops.gemm_time(op, tokens, tp) for op in GEMM_OPS)
        t += sum(self.ops.elementwise_time(op, tokens, tp) for op in ELEMENTWISE_OPS)
        if tp > 1:
            t += 2 * self.ops.allreduce_time(tokens * self._ar_bytes_tok, tp)
        return t

    def _total(self, tokens: int, sampled: int, attn_pairs: float, kv_read_tokens: float,
               attention_s: float) -> tuple[float, float]:
        total = self.layers * (self._per_token(tokens) + attention_s) + self._head(sampled) + self._sampler(sampled)
        lin_flops = self.lin_flops_tok * tokens + self.head_flops_tok * sampled
        ideal = ((lin_flops + self.attn_flops_pair * attn_pairs) / self.gpu.peak_flops
                 + (self.weight_bytes + self.act_bytes_tok * tokens + self.kv_bytes_tok * (kv_read_tokens + tokens))
                 / self.gpu.hbm_bw)
        return total, min(1.0, ideal / total)

    def _attention(self, chunks, num_decodes: int, decode_context_sum: float) -> float:
        """One layer's attention (s): each prefill chunk ``(c, p)`` plus the decodes at their mean context."""
        t = sum(self._prefill(c, p) for c, p in chunks)
        if num_decodes:
            t += self._decode_time(num_decodes, max(1, math.ceil(decode_context_sum / num_decodes)))
        return t

    def _decode_time(self, d: int, context: int) -> float:
        """``AttentionModel.decode_time`` with its compute waves cached by KV blocks (the same value)."""
        t_c = self._decode_compute(d, -(-context // self.att.a.splitkv_block_n))
        t_m = d * context * self._kv_bytes_tok / self.att.bw
        return 2 * self.ops.c.gemm.launch_s + blend(t_c, t_m, self.ops.c.gemm.blend_p)

    def time(self, tokens: int, sampled: int, attn_pairs: float, kv_read_tokens: float) -> tuple[float, float]:
        """Device time from aggregate counts, the prefill taken as one chunk after the mean prior context.

        Prefer ``time_scheduled`` or ``time_batch``, which see each chunk.
        """
        if tokens <= 0:
            return 0.0, 0.0
        return self._total(tokens, sampled, attn_pairs, kv_read_tokens,
                           self._attention([(tokens, int(kv_read_tokens))], 0, 0.0))

    def time_scheduled(self, entries, features: tuple) -> tuple[float, float]:
        """Device time of a simulator schedule (``dlfp.devices.batch.scheduled_features`` entries and output)."""
        tokens, sampled, pairs, kv, _ptok, npf, nd = features
        if tokens <= 0:
            return 0.0, 0.0
        chunks = [(k, c) for _r, k, c, dec, _s in entries if not dec] if npf else ()
        # the decodes' context (c + 1 each) from the features: kv sums every entry's c (exact integers)
        dec_ctx = kv - sum(c for _k, c in chunks) + nd if nd else 0.0
        return self._total(tokens, sampled, pairs, kv, self._attention(chunks, nd, dec_ctx))

    def time_batch(self, batch: Batch) -> tuple[float, float]:
        """Device time of a ``Batch`` (prefill chunks after their context, decodes at their context)."""
        tokens, sampled, pairs, kv = batch_counts(batch)
        if tokens <= 0:
            return 0.0, 0.0
        return self._total(tokens, sampled, pairs, kv,
                           self._attention(batch.prefill, len(batch.decodes), float(sum(batch.decodes))))

    def breakdown(self, batch: Batch) -> Breakdown:
        """Per-part times (s) of ``batch`` and its modelled energy (J, all ``tp`` GPUs)."""
        tokens, sampled, pairs, kv = batch_counts(batch)
        if tokens <= 0:
            return Breakdown(0, 0, 0, 0, 0, 0, 0, 0, 0)
        total, util = self.time_batch(batch)
        ar = 2 * self.ops.allreduce_time(tokens * self._ar_bytes_tok, self.tp) if self.tp > 1 else 0.0
        att = self.layers * self._attention(batch.prefill, len(batch.decodes), float(sum(batch.decodes)))
        linear = total - att - self.layers * ar - self._sampler(sampled)
        flops = self.lin_flops_tok * tokens + self.head_flops_tok * sampled + self.attn_flops_pair * pairs
        nbytes = self.weight_bytes + self.act_bytes_tok * tokens + self.kv_bytes_tok * (kv + tokens)
        return Breakdown(linear, att, self.layers * ar, self._sampler(sampled), total, util,
                         total * self.power_w(util) * self.tp, flops, nbytes)
