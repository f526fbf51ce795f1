"""Device cost model: time and energy of one engine iteration on a modelled GPU.

Shared by the simulator (``dlfp.backends.sim``) and the emulated device (``dlfp.backends.emu``).
Everything comes from the model architecture (``models/*.yaml``, Hugging Face
``config.json`` values) and the GPU datasheet (``hardware/*.yaml``); nothing is
fitted to the DLFP paper's results.

An iteration (one forward pass over a batch) is split into parts; each part's
time is the roofline maximum of its compute time and its memory time, and the
parts add up (they run one after another inside every layer)::

    t = t_linear + t_attention + t_allreduce + t_overhead

* linear layers: ``2 * params_per_gpu * tokens`` FLOPs at ``linear_flops_eff`` of
  peak, against all weight bytes read once per iteration at ``mem_bw_eff`` of
  peak HBM bandwidth. The LM head runs only over sampled tokens (vLLM computes
  logits for the last position of each request only).
* attention: ``4 * heads/tp * head_dim`` FLOPs per (query, key) pair, causal
  pairs for prefill chunks (chunk x context), at ``attn_flops_eff``; against
  KV-cache bytes read (context of every request in the batch) plus KV written.
* tensor parallelism: two all-reduces per layer (after attention and after the
  MLP) of ``tokens * hidden * 2`` bytes each, ring all-reduce:
  ``latency + 2 (tp-1)/tp * bytes / (nvlink_bw/2)``.
* per-layer kernel overhead: ``kernels_per_layer * kernel_gap_s`` per layer plus
  a fixed per-iteration overhead (embedding, final norm, sampler, copies).

Efficiency fractions and overheads are documented assumptions (see
``DeviceAssumptions``), each with its reason. Energy is MODELLED: board power
moves linearly from idle to TDP with the iteration's roofline utilisation.
Units: seconds, bytes, FLOPs, joules, watts.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, fields
from functools import lru_cache

from dlfp.devices.batch import Batch, batch_counts
from dlfp.devices.specs import (CostModelError, GPUSpec, ModelSpec, known_gpus, known_models, kv_cache_blocks,
                                load_gpu, load_model)


#: Device models of a datasheet GPU (``DeviceAssumptions.device_model``).
DEVICE_MODELS = ("kernel", "roofline")


@dataclass(frozen=True)
class DeviceAssumptions:
    """Achieved fractions of peak and fixed overheads (assumptions, not fitted to the paper).

    * ``linear_flops_eff`` 0.70: large BF16 GEMMs in cuBLAS reach ~70-80 % of
      A100/H100 dense peak (NVIDIA cuBLAS/CUTLASS published GEMM benchmarks);
      the lower end is taken because transformer GEMMs are not all square.
    * ``attn_flops_eff`` 0.50: FlashAttention-2 forward reaches 50-73 % of A100
      peak (Dao 2023, FlashAttention-2 paper, Fig. 5/6); mid-range taken since
      chunks are short and paged.
    * ``mem_bw_eff`` 0.80: streaming kernels reach ~80-90 % of datasheet HBM
      bandwidth (e.g. BabelStream on A100 ~1.7 of 2.0 TB/s); 0.8 for GEMV-style
      weight reads with launch tails.
    * ``kernels_per_layer`` 12: kernels in one vLLM Qwen3 decoder layer (fused
      add+RMSNorm x2, qkv GEMM, q/k-norm, rotary, KV-cache write, attention,
      o GEMM, gate_up GEMM, SiLU-and-mul, down GEMM, spare).
    * ``kernel_gap_s`` 1.0e-6: device-side gap/tail per dependent kernel even
      inside a CUDA graph (NVIDIA blog "Getting Started with CUDA Graphs", 2019:
      ~3.4 us per 2.9 us kernel in a graph, i.e. ~0.5-1 us per kernel).
    * ``iteration_overhead_s`` 30e-6: embedding lookup, final norm, logits
      gather, sampler, device-to-host copy of sampled ids (~10-15 small kernels
      plus one copy, each a few microseconds).
    * ``allreduce_latency_s`` 8e-6: small-message all-reduce latency over
      NVLink (NCCL/vLLM custom all-reduce, order of 5-10 us per call in
      nccl-tests for <= 1 MB).
    * ``device_model`` ``"kernel"``: which model times an iteration on a datasheet GPU: ``"kernel"``
      (``dlfp.devices.kernel_model``, kernels costed by operator models held against measured GPU operator
      times) or ``"roofline"`` (this module's per-part roofline). None of the fields above is used by the kernel
      model, which costs the sampler from its measurement (``dlfp.devices.sampler``).
    """

    linear_flops_eff: float = 0.70
    attn_flops_eff: float = 0.50
    mem_bw_eff: float = 0.80
    kernels_per_layer: int = 12
    kernel_gap_s: float = 1.0e-6
    iteration_overhead_s: float = 30e-6
    allreduce_latency_s: float = 8e-6
    device_model: str = "kernel"

    def __post_init__(self) -> None:
        if self.device_model not in DEVICE_MODELS:
            raise CostModelError(f"field device_model: {self.device_model!r} unknown; "
                                 f"known: {', '.join(DEVICE_MODELS)}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "device_model":
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise CostModelError(f"field {f.name}: must be a finite non-negative number, got {v!r}")
        for n in ("linear_flops_eff", "attn_flops_eff", "mem_bw_eff"):
            if not 0 < getattr(self, n) <= 1:
                raise CostModelError(f"field {n}: must be in (0, 1], got {getattr(self, n)!r}")


@dataclass(frozen=True)
class Breakdown:
    """Iteration time split into parts (seconds) plus energy (joules, modelled, all GPUs)."""

    linear_s: float
    attention_s: float
    allreduce_s: float
    overhead_s: float
    total_s: float
    utilisation: float
    energy_j: float
    flops: float
    bytes: float


class DeviceModel:
    """Precomputed constants of (model, GPU, TP) for fast per-iteration costing.

    ``time(...)`` takes aggregate counts so the simulator avoids per-request
    objects; ``iteration_time``/``breakdown`` take a ``Batch``.
    A ``GPUSpec`` of ``kind == "fitted"`` (a measured profile) gives a
    :class:`FittedDeviceModel` instead.
    """

    def __new__(cls, model: ModelSpec, gpu: GPUSpec, tp: int = 1, assumptions: DeviceAssumptions | None = None):
        if cls is DeviceModel and getattr(gpu, "kind", "datasheet") == "fitted":
            return super().__new__(FittedDeviceModel)
        if cls is DeviceModel and (assumptions or DeviceAssumptions()).device_model == "kernel":
            from dlfp.devices import kernel_model

            if not kernel_model.supports(gpu):
                raise CostModelError(f"field gpu: no operator constants for {gpu.key!r} "
                                     f"(dlfp/devices/operators.yaml); use device_model: roofline")
            return super().__new__(kernel_model.KernelDeviceModel)
        return super().__new__(cls)

    def time_batch(self, batch: Batch) -> tuple[float, float]:
        """``time`` of a ``Batch`` (device time in s, utilisation)."""
        return self.time(*batch_counts(batch))

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int = 1, assumptions: DeviceAssumptions | None = None):
        model.check_tp(tp)
        a = assumptions or DeviceAssumptions()
        self.model, self.gpu, self.tp, self.a = model, gpu, tp, a
        L, h = model.num_hidden_layers, model.hidden_size
        db = model.dtype_bytes
        self.flops_s = gpu.peak_flops * a.linear_flops_eff
        self.attn_flops_s = gpu.peak_flops * a.attn_flops_eff
        self.bw = gpu.hbm_bw * a.mem_bw_eff
        # linear FLOPs per token per GPU (decoder layers), and per sampled token (LM head)
        self.lin_flops_tok = 2.0 * L * model.layer_params / tp
        self.head_flops_tok = 2.0 * model.embedding_params / tp
        # weight bytes read once per iteration (decoder layers + LM head matrix), per GPU
        self.weight_bytes = (L * model.layer_params + model.embedding_params) * db / tp
        # attention: FLOPs per (query, key) pair over all layers, per GPU
        self.attn_flops_pair = 4.0 * L * (model.num_attention_heads // tp) * model.head_dim
        self.kv_bytes_tok = model.kv_bytes_per_token(tp)  # per cached token, all layers
        self.act_bytes_tok = 2.0 * L * h * db  # hidden-state read+write per token per layer (small)
        self.overhead = L * a.kernels_per_layer * a.kernel_gap_s + a.iteration_overhead_s
        if tp > 1:
            self.ar_lat = 2 * L * a.allreduce_latency_s
            self.ar_bytes_tok = 2 * L * h * db * 2.0 * (tp - 1) / tp  # ring: 2(tp-1)/tp of the message
            self.link = gpu.link_bw_one_way
        else:
            self.ar_lat = 0.0
            self.ar_bytes_tok = 0.0
            self.link = 1.0
        self.idle_w, self.tdp_w = gpu.idle_w, gpu.tdp_w

    def time(self, tokens: int, sampled: int, attn_pairs: float, kv_read_tokens: float) -> tuple[float, float]:
        """Device time (s) and utilisation in [0, 1] of one iteration from aggregate counts.

        Args:
            tokens: all scheduled tokens (prefill chunk tokens + one per decode).
            sampled: LM-head rows (decodes + final prefill chunks).
            attn_pairs: causal (query, key) pairs summed over the batch.
            kv_read_tokens: cached tokens whose K/V are read (context of every request).
        """
        if tokens <= 0:
            return 0.0, 0.0
        lin_flops = self.lin_flops_tok * tokens + self.head_flops_tok * sampled
        lin_bytes = self.weight_bytes + self.act_bytes_tok * tokens
        t_lin = max(lin_flops / self.flops_s, lin_bytes / self.bw)
        att_flops = self.attn_flops_pair * attn_pairs
        att_bytes = self.kv_bytes_tok * (kv_read_tokens + tokens)
        t_att = max(att_flops / self.attn_flops_s, att_bytes / self.bw)
        t_ar = self.ar_lat + self.ar_bytes_tok * tokens / self.link
        total = t_lin + t_att + t_ar + self.overhead
        ideal = (lin_flops + att_flops) / self.gpu.peak_flops + (lin_bytes + att_bytes) / self.gpu.hbm_bw
        return total, min(1.0, ideal / total)

    def power_w(self, utilisation: float) -> float:
        """Modelled board power of ONE GPU (W): ``idle + (tdp - idle) * utilisation``."""
        return self.idle_w + (self.tdp_w - self.idle_w) * utilisation

    def breakdown(self, batch: Batch) -> Breakdown:
        """Per-part times (s) and modelled energy (J, all ``tp`` GPUs) of ``batch``."""
        tokens, sampled, pairs, kv = batch_counts(batch)
        if tokens <= 0:
            return Breakdown(0, 0, 0, 0, 0, 0, 0, 0, 0)
        lin_flops = self.lin_flops_tok * tokens + self.head_flops_tok * sampled
        lin_bytes = self.weight_bytes + self.act_bytes_tok * tokens
        att_flops = self.attn_flops_pair * pairs
        att_bytes = self.kv_bytes_tok * (kv + tokens)
        t_lin = max(lin_flops / self.flops_s, lin_bytes / self.bw)
        t_att = max(att_flops / self.attn_flops_s, att_bytes / self.bw)
        t_ar = self.ar_lat + self.ar_bytes_tok * tokens / self.link
        total, util = self.time(tokens, sampled, pairs, kv)
        return Breakdown(t_lin, t_att, t_ar, self.overhead, total, util,
                         total * self.power_w(util) * self.tp, lin_flops + att_flops, lin_bytes + att_bytes)


@dataclass(frozen=True)
class FittedCosts:
    """Coefficients of a measured profile (seconds per unit), fitted by ``dlfp.studies.calibration``.

    ``t = step_s + per_token_s * tokens + per_sampled_s * rows + per_attn_pair_s * attn_pairs
    + per_kv_token_s * kv_read_tokens + lm_head(rows)``: the parts of the GPU form (fixed per-step cost,
    per-token and per-sequence compute, attention over context, KV reads) added instead of taken as roofline
    maxima (eager CPU execution does not overlap compute and memory traffic).

    ``lm_head_rows`` / ``lm_head_s``: the measured time (s) of the LM head (``compute_logits``) by its row
    count, one row per scheduled request (vLLM computes logits for the last token of every request, also of
    a partial prefill chunk); linear in between and beyond the measured counts. The CPU's GEMM is not
    monotonic in its row count (3 rows take longer than 4), so no per-row coefficient can stand for it. With
    the table, ``rows`` is the number of scheduled requests; without it (a profile fitted to whole steps),
    ``rows`` is the number of sampled tokens and the head is inside ``per_sampled_s``.
    """

    step_s: float
    per_token_s: float
    per_sampled_s: float
    per_attn_pair_s: float
    per_kv_token_s: float
    lm_head_rows: tuple = ()
    lm_head_s: tuple = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name.startswith("lm_head"):
                if not isinstance(v, (list, tuple)) or not all(
                        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                        for x in v):
                    raise CostModelError(f"field fitted.{f.name}: must be a list of finite non-negative numbers")
                object.__setattr__(self, f.name, tuple(float(x) for x in v))
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise CostModelError(f"field fitted.{f.name}: must be a finite non-negative number, got {v!r}")
        r = self.lm_head_rows
        if len(r) != len(self.lm_head_s) or any(b <= a for a, b in zip(r, r[1:])):
            raise CostModelError("field fitted.lm_head_rows: must increase and match fitted.lm_head_s in length")

    def lm_head(self, rows: float) -> float:
        """The LM head's time (s) for ``rows`` rows: the table, linear in between and beyond; 0 without a table."""
        r, t = self.lm_head_rows, self.lm_head_s
        if not r:
            return 0.0
        if len(r) == 1:
            return t[0] * rows / r[0]
        if rows > r[-1]:  # beyond the table: the last slope, from the last point
            return t[-1] + (t[-1] - t[-2]) * (rows - r[-1]) / (r[-1] - r[-2])
        i = max(bisect_left(r, rows), 1)  # the segment [r[i-1], r[i]] holding rows (the first one below the table)
        return max(0.0, t[i - 1] + (t[i] - t[i - 1]) * (rows - r[i - 1]) / (r[i] - r[i - 1]))

    def time(self, tokens: float, rows: float, attn_pairs: float, kv_read_tokens: float) -> float:
        """Device time (s) of one step (see the class docstring); 0 for an empty step."""
        if tokens <= 0:
            return 0.0
        return (self.step_s + self.per_token_s * tokens + self.per_sampled_s * rows + self.per_attn_pair_s * attn_pairs
                + self.per_kv_token_s * kv_read_tokens + self.lm_head(rows))


class FittedDeviceModel(DeviceModel):
    """Device time from a measured (``kind: fitted``) profile; same interface as ``DeviceModel``.

    Energy is not modelled for such a profile (its ``tdp_w``/``idle_w`` are NaN, so energies are NaN).

    Raises:
        CostModelError: the profile was fitted for another model (field ``gpu``), ``tp != 1`` (field
            ``tp``), or bad coefficients (field ``fitted.*``).
    """

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int = 1, assumptions: DeviceAssumptions | None = None):
        model.check_tp(tp)
        if gpu.model is not None and gpu.model != model.key:
            raise CostModelError(f"field gpu: profile {gpu.key!r} was fitted for model {gpu.model!r}, "
                                 f"not {model.key!r}")
        if tp != 1:
            raise CostModelError(f"field tp: profile {gpu.key!r} was measured on one device; tp={tp} is not modelled")
        self.c = FittedCosts(**(gpu.fitted or {}))
        self.model, self.gpu, self.tp = model, gpu, tp
        self.a = assumptions or DeviceAssumptions()
        self.overhead = self.c.step_s
        self.idle_w, self.tdp_w = gpu.idle_w, gpu.tdp_w
        self._rows_are_requests = bool(self.c.lm_head_rows)

    def time(self, tokens: int, sampled: int, attn_pairs: float, kv_read_tokens: float) -> tuple[float, float]:
        """Device time (s) of one iteration from aggregate counts (see ``DeviceModel.time``); utilisation NaN.

        The aggregate counts do not say how many requests the batch has; ``sampled`` stands for them. Prefer
        ``time_scheduled`` / ``time_batch``, which count the requests.
        """
        return self.c.time(tokens, sampled, attn_pairs, kv_read_tokens), float("nan")

    def _rows(self, num_requests: int, sampled: int) -> int:
        """The row count of ``FittedCosts.time``: requests with an LM-head table, sampled tokens without."""
        return num_requests if self._rows_are_requests else sampled

    def time_scheduled(self, entries, feats) -> tuple[float, float]:
        """Device time (s) of a simulator schedule (``entries``, ``scheduled_features``); utilisation NaN."""
        tokens, sampled, pairs, kv = feats[0], feats[1], feats[2], feats[3]
        return self.c.time(tokens, self._rows(len(entries), sampled), pairs, kv), float("nan")

    def time_batch(self, batch: Batch) -> tuple[float, float]:
        """Device time (s) of a ``Batch``; its rows are its prefill chunks and decodes (with an LM-head table)."""
        tokens, sampled, pairs, kv = batch_counts(batch)
        return self.c.time(tokens, self._rows(len(batch.prefill) + len(batch.decodes), sampled), pairs, kv), \
            float("nan")

    def breakdown(self, batch: Batch) -> Breakdown:
        """Parts: ``linear_s`` = per-token + per-row terms and the LM head, ``attention_s`` = pair + KV terms,
        ``overhead_s`` = step."""
        tokens, sampled, pairs, kv = batch_counts(batch)
        if tokens <= 0:
            return Breakdown(0, 0, 0, 0, 0, 0, 0, 0, 0)
        c = self.c
        rows = self._rows(len(batch.prefill) + len(batch.decodes), sampled)
        lin = c.per_token_s * tokens + c.per_sampled_s * rows + c.lm_head(rows)
        att = c.per_attn_pair_s * pairs + c.per_kv_token_s * kv
        total = lin + att + c.step_s
        nan = float("nan")
        return Breakdown(lin, att, 0.0, c.step_s, total, nan, nan, nan, nan)


@lru_cache(maxsize=64)
def device_model(model: str, gpu: str, tp: int = 1, kind: str = "kernel") -> DeviceModel:
    """Cached ``DeviceModel`` for registry keys, with default assumptions and ``device_model=kind``."""
    return DeviceModel(load_model(model), load_gpu(gpu), tp, DeviceAssumptions(device_model=kind))


def iteration_time(model: str | ModelSpec, gpu: str | GPUSpec, tp: int, batch: Batch,
                   assumptions: DeviceAssumptions | None = None) -> float:
    """Device time (seconds) of one iteration of ``batch`` on ``tp`` GPUs of ``gpu``.

    ``model``/``gpu`` are registry keys (``qwen3-0.6b``, ``a100-sxm4-80gb``) or specs.

    Raises:
        CostModelError: unknown model or GPU, a TP degree the model cannot split, bad batch.
    """
    if isinstance(model, str) and isinstance(gpu, str) and assumptions is None:
        dm = device_model(model, gpu, tp)
    else:
        m = load_model(model) if isinstance(model, str) else model
        g = load_gpu(gpu) if isinstance(gpu, str) else gpu
        dm = DeviceModel(m, g, tp, assumptions)
    return dm.time_batch(batch)[0]


def iteration_energy(model: str, gpu: str, tp: int, batch: Batch) -> float:
    """Modelled energy (joules, all ``tp`` GPUs) of one iteration; see ``DeviceModel.power_w``."""
    return device_model(model, gpu, tp).breakdown(batch).energy_j


__all__ = [
    "Batch", "Breakdown", "CostModelError", "DeviceAssumptions", "DeviceModel", "FittedCosts", "FittedDeviceModel",
    "GPUSpec", "ModelSpec",
    "batch_counts", "device_model", "iteration_energy", "iteration_time", "known_gpus", "known_models",
    "kv_cache_blocks", "load_gpu", "load_model",
]
