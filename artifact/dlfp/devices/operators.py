"""Operator-level time model of one decoder layer on a datasheet GPU.

One decoder layer is split into the operators that Vidur profiles (``data/gpu-profiles/vidur/``):

* projection GEMMs ``attn_pre_proj`` (fused QKV), ``attn_post_proj`` (output projection), ``mlp_up_proj``
  (fused gate+up when the MLP is gated) and ``mlp_down_proj``. A GEMM of ``M`` tokens, ``N`` output and ``K``
  input features (per GPU) takes::

      t = launch_s + (t_c ** p + t_m ** p) ** (1 / p)
      t_c = 2 * M_q * N_q * K / (peak_flops * eff_compute)          tensor-core time
      t_m = dtype_bytes * (N*K + M*K + M*N) / (hbm_bw * eff_memory)  HBM time (weights + activations)

  ``M_q``, ``N_q`` are ``M``, ``N`` rounded up to the output tile (``tile_m`` x ``tile_n``); with quantisation
  ``wave`` the tile count is further rounded up to whole waves over the GPU's SMs. ``p`` (the p-norm blend)
  is a smooth maximum: ``p -> inf`` is the roofline ``max(t_c, t_m)``, ``p = 1`` their sum.
* elementwise and normalisation kernels ``input_layernorm``, ``attn_rope``, ``post_attention_layernorm``,
  ``mlp_act``, ``add``: explicit bytes read + written (see :meth:`OperatorModel.elementwise_bytes`) at an
  achieved fraction of HBM bandwidth, blended with a per-kernel fixed time the same way
  (``t = (fixed_s ** p + (bytes / (hbm_bw * eff_bw)) ** p) ** (1 / p)``).
* all-reduce of a message of ``S`` bytes over ``n`` GPUs, ring algorithm::

      t = 2 (n - 1) * latency_s + 2 (n - 1) / n * S / (link_bw * eff_link)

  where ``link_bw`` is the one-way bandwidth of the slowest link in the ring (NVLink between GPUs of one
  NVLink group, PCIe across groups for a pairwise-NVLink machine).

Datasheet numbers (peak BF16 FLOP/s, HBM and NVLink bandwidth) come from ``dlfp/hardware/gpus.yaml``
(:class:`dlfp.devices.roofline.GPUSpec`); SM counts, link and fitted constants from ``operators.yaml`` beside this
module, each with its source. Fitted constants were fitted by ``dlfp.studies.device`` on the files named in
the YAML only; the other files are held out. Units: seconds, bytes, FLOPs, tokens.

The shared ``gemm`` and ``elementwise`` sections were fitted on A100 profiles and reach another GPU only through
its datasheet peaks. A GPU whose own measured profiles exist may carry its own fitted ``gemm`` (the four fitted
numbers; tiles and quantisation stay shared) and ``elementwise`` sections under ``gpus.<key>``;
:meth:`OperatorConstants.for_gpu` puts them in place of the shared ones, for the operators and for the attention
model (which reuses the GEMMs' launch time, memory efficiency and blend). Today only ``h100-sxm`` has them
(fitted on Vidur's H100 files); every other GPU, the H200 included, uses the shared (A100) constants.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Mapping

import yaml

from dlfp.devices.roofline import CostModelError, GPUSpec, ModelSpec

CONSTANTS_PATH = Path(__file__).resolve().parent / "operators.yaml"
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
KERNELS = ("rms_norm", "layer_norm", "rope", "silu_and_mul", "gelu", "add")
ELEMENTWISE_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
QUANTISATIONS = ("none", "tile", "wave")


@dataclass(frozen=True)
class LayerShape:
    """Shape of one decoder layer, in the column names of Vidur's profiles.

    Attributes:
        name: label (e.g. ``Meta-Llama-3-8B``).
        n_head: query heads; n_kv_head: key/value heads; n_embd: hidden size; n_expanded_embd: MLP
            intermediate size; vocab_size: vocabulary (not used by layer operators); use_gated_mlp: gate and
            up projections fused into one GEMM of ``2 * n_expanded_embd`` outputs (SwiGLU) when true.
        head_dim: per-head size; ``n_embd // n_head`` when ``None`` (Llama, phi-2); Qwen3 sets it (128).
        dtype_bytes: bytes per weight/activation element (BF16/FP16: 2).
    """

    name: str
    n_head: int
    n_kv_head: int
    n_embd: int
    n_expanded_embd: int
    vocab_size: int
    use_gated_mlp: bool
    head_dim: int | None = None
    dtype_bytes: int = 2
    norm: str = ""
    act: str = ""

    def __post_init__(self) -> None:
        # kernel kinds: the profiled gated models (Llama) and Qwen3 use RMSNorm and SiLU-and-mul; the
        # non-gated phi-2 uses LayerNorm and GELU (its Hugging Face config.json). Explicit values win.
        if not self.norm:
            object.__setattr__(self, "norm", "rms_norm" if self.use_gated_mlp else "layer_norm")
        if not self.act:
            object.__setattr__(self, "act", "silu_and_mul" if self.use_gated_mlp else "gelu")
        if self.norm not in ("rms_norm", "layer_norm") or self.act not in ("silu_and_mul", "gelu"):
            raise CostModelError(f"field norm/act: unknown kernel kinds {self.norm!r}/{self.act!r}")

    def kernel(self, op: str) -> str:
        """Kernel kind of elementwise ``op``: ``rms_norm|layer_norm``, ``rope``, ``silu_and_mul|gelu``, ``add``.

        Raises:
            CostModelError: unknown ``op``.
        """
        if op in ("input_layernorm", "post_attention_layernorm"):
            return self.norm
        if op == "mlp_act":
            return self.act
        if op == "attn_rope":
            return "rope"
        if op == "add":
            return "add"
        raise CostModelError(f"field op: unknown elementwise kernel {op!r}; known: {', '.join(ELEMENTWISE_OPS)}")

    @property
    def hd(self) -> int:
        """Head dimension (elements)."""
        return self.head_dim if self.head_dim is not None else self.n_embd // self.n_head

    @classmethod
    def from_csv_row(cls, row: Mapping, name: str = "") -> "LayerShape":
        """Shape from a Vidur ``*_mlp.csv`` row (columns ``n_head ... use_gated_mlp``; strings or numbers).

        Raises:
            CostModelError: a shape column is missing (message names it).
        """
        try:
            gated = row["use_gated_mlp"]
            gated = gated if isinstance(gated, bool) else str(gated).strip().lower() == "true"
            return cls(name=name, n_head=int(row["n_head"]), n_kv_head=int(row["n_kv_head"]),
                       n_embd=int(row["n_embd"]), n_expanded_embd=int(row["n_expanded_embd"]),
                       vocab_size=int(row["vocab_size"]), use_gated_mlp=bool(gated))
        except KeyError as e:
            raise CostModelError(f"field {e.args[0]}: missing from the profile row") from None

    @classmethod
    def from_model_spec(cls, spec: ModelSpec) -> "LayerShape":
        """Shape of a Qwen3 ``ModelSpec`` (gated SiLU MLP, explicit ``head_dim``)."""
        return cls(name=spec.key, n_head=spec.num_attention_heads, n_kv_head=spec.num_key_value_heads,
                   n_embd=spec.hidden_size, n_expanded_embd=spec.intermediate_size, vocab_size=spec.vocab_size,
                   use_gated_mlp=True, head_dim=spec.head_dim, dtype_bytes=spec.dtype_bytes)

    def heads(self, tp: int) -> tuple[int, int]:
        """``(query heads, KV heads)`` on one of ``tp`` GPUs; KV heads are replicated when ``tp > n_kv_head``.

        Raises:
            CostModelError: ``tp`` not a positive integer dividing ``n_head`` and ``n_expanded_embd``.
        """
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise CostModelError(f"field tp: must be a positive integer, got {tp!r}")
        if self.n_head % tp or self.n_expanded_embd % tp:
            raise CostModelError(f"field tp: {self.name} heads {self.n_head} / MLP {self.n_expanded_embd} "
                                 f"not divisible by tp={tp}")
        return self.n_head // tp, max(1, self.n_kv_head // tp)

    def gemm_nk(self, op: str, tp: int = 1) -> tuple[int, int]:
        """``(N, K)`` (output, input features) of projection ``op`` on one of ``tp`` GPUs.

        ``op`` is one of ``GEMM_OPS`` or ``lm_head`` (``N = vocab_size / tp``, ``K = n_embd``).

        Raises:
            CostModelError: unknown ``op`` or bad ``tp``.
        """
        nq, nkv = self.heads(tp)
        hd, h = self.hd, self.n_embd
        inter = self.n_expanded_embd // tp
        if op == "attn_pre_proj":
            return (nq + 2 * nkv) * hd, h
        if op == "attn_post_proj":
            return h, nq * hd
        if op == "mlp_up_proj":
            return (2 if self.use_gated_mlp else 1) * inter, h
        if op == "mlp_down_proj":
            return h, inter
        if op == "lm_head":
            return self.vocab_size // tp, h
        raise CostModelError(f"field op: unknown projection {op!r}; known: {', '.join(GEMM_OPS)}")


@dataclass(frozen=True)
class GemmConstants:
    """GEMM constants (see module docstring). ``eff_*`` are fractions of datasheet peak; ``launch_s`` seconds."""

    eff_compute: float
    eff_memory: float
    launch_s: float
    blend_p: float
    tile_m: int = 128
    tile_n: int = 128
    quantisation: str = "tile"


@dataclass(frozen=True)
class ElementwiseConstants:
    """Per kernel kind (``LayerShape.kernel``): achieved HBM fraction ``eff_bw``, fixed time ``fixed_s`` (s); shared
    blend exponent ``blend_p``."""

    eff_bw: Mapping[str, float]
    fixed_s: Mapping[str, float]
    blend_p: float


@dataclass(frozen=True)
class AllReduceConstants:
    """Ring all-reduce: per-step ``latency_s`` (s) and achieved fraction ``eff_link`` of one-way link bandwidth."""

    latency_s: float
    eff_link: float


@dataclass(frozen=True)
class OperatorConstants:
    """All constants of ``operators.yaml``: per-GPU SM counts, links, GEMM, elementwise, all-reduce.

    ``gpu_gemm`` / ``gpu_elementwise``: a GPU's own fitted sections by GPU key (``gpus.<key>.gemm`` /
    ``.elementwise`` of the YAML), used in place of the shared ``gemm`` / ``elementwise`` by :meth:`for_gpu`.
    """

    sm_count: Mapping[str, int]
    pcie_gbs: float
    topologies: Mapping[str, Mapping]
    gemm: GemmConstants
    elementwise: ElementwiseConstants
    allreduce: AllReduceConstants
    gpu_gemm: Mapping[str, GemmConstants] = field(default_factory=dict)
    gpu_elementwise: Mapping[str, ElementwiseConstants] = field(default_factory=dict)

    def for_gpu(self, key: str) -> "OperatorConstants":
        """These constants as GPU ``key`` sees them: its own ``gemm`` / ``elementwise`` in place of the shared ones.

        A GPU without sections of its own gets ``self`` unchanged.
        """
        if key not in self.gpu_gemm and key not in self.gpu_elementwise:
            return self
        return replace(self, gemm=self.gpu_gemm.get(key, self.gemm),
                       elementwise=self.gpu_elementwise.get(key, self.elementwise), gpu_gemm={}, gpu_elementwise={})

    def shared_only(self) -> "OperatorConstants":
        """These constants without any GPU's own sections (every GPU on the shared, A100-fitted ones)."""
        return replace(self, gpu_gemm={}, gpu_elementwise={})


def _check_positive(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise CostModelError(f"field {name}: must be a finite positive number, got {v!r}")


def _gemm_section(g: Mapping, prefix: str, shared: GemmConstants | None = None) -> GemmConstants:
    """A ``gemm`` section; a GPU's own (``shared`` given) keeps the shared tiles and quantisation."""
    try:
        if shared is None:
            out = GemmConstants(eff_compute=g["eff_compute"], eff_memory=g["eff_memory"], launch_s=g["launch_s"],
                                blend_p=g["blend_p"], tile_m=g.get("tile_m", 128), tile_n=g.get("tile_n", 128),
                                quantisation=g.get("quantisation", "tile"))
        else:
            out = replace(shared, eff_compute=g["eff_compute"], eff_memory=g["eff_memory"], launch_s=g["launch_s"],
                          blend_p=g["blend_p"])
    except KeyError as ex:
        raise CostModelError(f"field {prefix}.{ex.args[0]}: missing from operator constants") from None
    if out.quantisation not in QUANTISATIONS:
        raise CostModelError(f"field {prefix}.quantisation: {out.quantisation!r} not in {QUANTISATIONS}")
    for n in ("eff_compute", "eff_memory", "launch_s", "blend_p", "tile_m", "tile_n"):
        _check_positive(f"{prefix}.{n}", getattr(out, n))
    return out


def _elementwise_section(e: Mapping, prefix: str, shared: ElementwiseConstants | None = None) -> ElementwiseConstants:
    """An ``elementwise`` section; a GPU's own (``shared`` given) keeps the shared kernel kinds it does not name."""
    try:
        kernels = e["kernels"]
        eff = {k: v["eff_bw"] for k, v in kernels.items()}
        fixed = {k: v["fixed_s"] for k, v in kernels.items()}
        out = ElementwiseConstants(eff_bw={**(shared.eff_bw if shared else {}), **eff},
                                   fixed_s={**(shared.fixed_s if shared else {}), **fixed}, blend_p=e["blend_p"])
    except KeyError as ex:
        raise CostModelError(f"field {prefix}.{ex.args[0]}: missing from operator constants") from None
    for op in out.eff_bw:
        _check_positive(f"{prefix}.kernels.{op}.eff_bw", out.eff_bw[op])
        _check_positive(f"{prefix}.kernels.{op}.fixed_s", out.fixed_s[op])
    _check_positive(f"{prefix}.blend_p", out.blend_p)
    return out


def constants_from_dict(d: Mapping) -> OperatorConstants:
    """Constants from the mapping of ``operators.yaml`` (a GPU's own ``gemm`` / ``elementwise`` under ``gpus``).

    Raises:
        CostModelError: a missing or non-positive field (message names it), or an unknown quantisation.
    """
    try:
        g, e, a, gpus = d["gemm"], d["elementwise"], d["allreduce"], d["gpus"]
        ar = AllReduceConstants(latency_s=a["latency_s"], eff_link=a["eff_link"])
        sm_count = {k: v["sm_count"] for k, v in gpus.items()}
        pcie = d["links"]["pcie4_x16_gbs"]
    except KeyError as ex:
        raise CostModelError(f"field {ex.args[0]}: missing from operator constants") from None
    gemm = _gemm_section(g, "gemm")
    ew = _elementwise_section(e, "elementwise")
    gpu_gemm = {k: _gemm_section(v["gemm"], f"gpus.{k}.gemm", gemm) for k, v in gpus.items() if "gemm" in v}
    gpu_ew = {k: _elementwise_section(v["elementwise"], f"gpus.{k}.elementwise", ew)
              for k, v in gpus.items() if "elementwise" in v}
    _check_positive("allreduce.latency_s", ar.latency_s)
    _check_positive("allreduce.eff_link", ar.eff_link)
    return OperatorConstants(sm_count=sm_count, pcie_gbs=pcie, topologies=d.get("topologies", {}), gemm=gemm,
                             elementwise=ew, allreduce=ar, gpu_gemm=gpu_gemm, gpu_elementwise=gpu_ew)


@lru_cache(maxsize=None)
def load_constants(path: str | None = None) -> OperatorConstants:
    """Constants of ``operators.yaml`` (or the YAML at ``path``); see :func:`constants_from_dict`."""
    return constants_from_dict(yaml.safe_load(Path(path or CONSTANTS_PATH).read_text()))


def blend(a: float, b: float, p: float) -> float:
    """Smooth maximum ``(a**p + b**p) ** (1/p)`` of two non-negative times (``p >= 1``; computed stably)."""
    m = max(a, b)
    if m <= 0:
        return 0.0
    return m * ((a / m) ** p + (b / m) ** p) ** (1.0 / p)


def ring_allreduce_bytes(message_bytes: float, n: int) -> float:
    """Bytes each GPU sends (and receives) in a ring all-reduce: ``2 (n - 1) / n * message_bytes``."""
    return 2.0 * (n - 1) / n * message_bytes


class OperatorModel:
    """Operator times (seconds) of one decoder layer of ``shape`` on ``gpu``.

    Args:
        shape: the layer (:class:`LayerShape`).
        gpu: datasheet GPU (``dlfp.devices.roofline.load_gpu``); its ``key`` must have an SM count in the constants.
        constants: defaults to ``operators.yaml``; the GPU's own sections, if any, replace the shared ones
            (:meth:`OperatorConstants.for_gpu`), so ``self.c`` holds the constants this GPU uses.

    Raises:
        CostModelError: a GPU without an SM count in the constants (field ``gpu``).
    """

    def __init__(self, shape: LayerShape, gpu: GPUSpec, constants: OperatorConstants | None = None):
        self.shape, self.gpu = shape, gpu
        self.c = (constants or load_constants()).for_gpu(gpu.key)
        if gpu.key not in self.c.sm_count:
            raise CostModelError(f"field gpu: no SM count for {gpu.key!r} in operator constants; "
                                 f"known: {', '.join(sorted(self.c.sm_count))}")
        self.sms = int(self.c.sm_count[gpu.key])

    # ---- projections -------------------------------------------------------------------------------------
    def gemm_flops(self, op: str, tokens: int, tp: int = 1) -> float:
        """Useful FLOPs ``2 M N K`` of projection ``op`` at ``tokens`` rows on one of ``tp`` GPUs."""
        n, k = self.shape.gemm_nk(op, tp)
        return 2.0 * tokens * n * k

    def gemm_bytes(self, op: str, tokens: int, tp: int = 1) -> float:
        """HBM bytes of projection ``op``: weights ``N K`` + input ``M K`` + output ``M N`` elements."""
        n, k = self.shape.gemm_nk(op, tp)
        return float(self.shape.dtype_bytes * (n * k + tokens * k + tokens * n))

    def gemm_quantised_flops(self, op: str, tokens: int, tp: int = 1) -> float:
        """FLOPs the tensor cores execute once the output is cut in tiles (and waves, per constants)."""
        g = self.c.gemm
        n, k = self.shape.gemm_nk(op, tp)
        if g.quantisation == "none":
            return 2.0 * tokens * n * k
        tm, tn = math.ceil(tokens / g.tile_m), math.ceil(n / g.tile_n)
        tiles = tm * tn
        if g.quantisation == "wave":
            tiles = math.ceil(tiles / self.sms) * self.sms
        return 2.0 * tiles * g.tile_m * g.tile_n * k

    def gemm_time(self, op: str, tokens: int, tp: int = 1) -> float:
        """Seconds of projection ``op`` over ``tokens`` rows on one of ``tp`` GPUs (module docstring form).

        Raises:
            CostModelError: unknown op, bad tp, or ``tokens < 1``.
        """
        if tokens < 1:
            raise CostModelError(f"field tokens: must be >= 1, got {tokens!r}")
        g = self.c.gemm
        t_c = self.gemm_quantised_flops(op, tokens, tp) / (self.gpu.peak_flops * g.eff_compute)
        t_m = self.gemm_bytes(op, tokens, tp) / (self.gpu.hbm_bw * g.eff_memory)
        return g.launch_s + blend(t_c, t_m, g.blend_p)

    # ---- elementwise --------------------------------------------------------------------------------------
    def elementwise_bytes(self, op: str, tokens: int, tp: int = 1) -> float:
        """HBM bytes read + written by kernel ``op`` over ``tokens`` rows on one of ``tp`` GPUs.

        ``b`` = dtype bytes, ``M`` = tokens, ``h`` = hidden, ``I`` = MLP size / tp, ``hd`` = head dim:

        * ``input_layernorm``, ``post_attention_layernorm``: read ``M h``, write ``M h``, read the weight ``h``
          (and the bias ``h`` for LayerNorm): ``b (2 M h + h)`` (RMSNorm), ``b (2 M h + 2 h)`` (LayerNorm).
        * ``attn_rope``: rotate q and k in place: ``2 b M (n_q + n_kv) hd`` (heads per GPU).
        * ``mlp_act``: gated (SiLU(gate) * up): read ``2 M I``, write ``M I``; otherwise read and write ``M I``.
        * ``add`` (residual): read two ``M h`` tensors, write one: ``3 b M h``.

        Raises:
            CostModelError: unknown op or bad tp.
        """
        s, b, m = self.shape, self.shape.dtype_bytes, tokens
        nq, nkv = s.heads(tp)
        h, inter = s.n_embd, s.n_expanded_embd // tp
        if op in ("input_layernorm", "post_attention_layernorm"):
            return float(b * (2 * m * h + (h if s.norm == "rms_norm" else 2 * h)))
        if op == "attn_rope":
            return float(2 * b * m * (nq + nkv) * s.hd)
        if op == "mlp_act":
            return float(b * m * inter * (3 if s.use_gated_mlp else 2))
        if op == "add":
            return float(3 * b * m * h)
        raise CostModelError(f"field op: unknown elementwise kernel {op!r}; known: {', '.join(ELEMENTWISE_OPS)}")

    def elementwise_time(self, op: str, tokens: int, tp: int = 1) -> float:
        """Seconds of kernel ``op``: ``blend(fixed_s, bytes / (hbm_bw * eff_bw), p)``, constants of its kernel kind.

        Raises:
            CostModelError: unknown op, bad tp, ``tokens < 1``.
        """
        if tokens < 1:
            raise CostModelError(f"field tokens: must be >= 1, got {tokens!r}")
        e = self.c.elementwise
        k = self.shape.kernel(op)
        if k not in e.eff_bw:
            raise CostModelError(f"field elementwise.kernels.{k}: no constants for kernel kind {k!r}")
        t_m = self.elementwise_bytes(op, tokens, tp) / (self.gpu.hbm_bw * e.eff_bw[k])
        return blend(e.fixed_s[k], t_m, e.blend_p)

    def time(self, op: str, tokens: int, tp: int = 1) -> float:
        """Seconds of any projection or elementwise operator (dispatch on ``op``)."""
        if op in GEMM_OPS:
            return self.gemm_time(op, tokens, tp)
        return self.elementwise_time(op, tokens, tp)

    # ---- all-reduce ---------------------------------------------------------------------------------------
    def allreduce_link_bw(self, n: int, topology: str | None = None) -> float:
        """One-way bytes/s of the slowest link of an ``n``-GPU ring.

        ``topology`` ``None``: all GPUs on NVLink (one-way = half the datasheet bidirectional figure). A named
        topology of the constants with ``nvlink_group`` ``g``: NVLink within groups of ``g`` GPUs, PCIe 4.0 x16
        across them, so a ring over more than ``g`` GPUs is limited by PCIe.

        Raises:
            CostModelError: unknown topology (field ``topology``).
        """
        nvlink = self.gpu.link_bw_one_way
        if topology is None:
            return nvlink
        t = self.c.topologies.get(topology)
        if t is None:
            raise CostModelError(f"field topology: unknown {topology!r}; known: {', '.join(sorted(self.c.topologies))}")
        return nvlink if n <= int(t["nvlink_group"]) else self.c.pcie_gbs * 1e9

    def allreduce_time(self, message_bytes: float, n: int, topology: str | None = None) -> float:
        """Seconds of a ring all-reduce of ``message_bytes`` over ``n`` GPUs (0 for ``n == 1``).

        Raises:
            CostModelError: ``n < 1`` or negative bytes.
        """
        if n < 1 or message_bytes < 0:
            raise CostModelError(f"field n: need n >= 1 and bytes >= 0, got n={n!r}, bytes={message_bytes!r}")
        if n == 1:
            return 0.0
        a = self.c.allreduce
        bw = self.allreduce_link_bw(n, topology) * a.eff_link
        return 2 * (n - 1) * a.latency_s + ring_allreduce_bytes(message_bytes, n) / bw


__all__ = [
    "AllReduceConstants", "CONSTANTS_PATH", "ELEMENTWISE_OPS", "ElementwiseConstants", "GEMM_OPS", "GemmConstants",
    "KERNELS", "LayerShape", "OperatorConstants", "OperatorModel", "QUANTISATIONS", "blend", "constants_from_dict",
    "load_constants", "ring_allreduce_bytes",
]
