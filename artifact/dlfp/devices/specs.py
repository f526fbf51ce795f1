"""Model and GPU specifications: the architectures (``models/*.yaml``, Hugging Face ``config.json`` values), the GPU
datasheets and fitted CPU profiles (``hardware/*.yaml``), and the KV-cache size vLLM would allocate.

Units: bytes, FLOP/s, GiB where a field says so, watts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from dlfp.paths import HARDWARE_DIR, MODELS_DIR

GIB = 1024**3


class CostModelError(ValueError):
    """Unknown model/GPU or a model/GPU/TP combination that cannot run; the message names the field."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (Qwen3 family), fields as in HF ``config.json``."""

    key: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    dtype_bytes: int = 2
    source: str = ""
    hf_name: str = ""

    @property
    def layer_params(self) -> int:
        """Linear-layer parameters of one decoder layer (q, k, v, o, gate, up, down); norms ignored."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_attention_heads * d * 2 + h * self.num_key_value_heads * d * 2
        mlp = 3 * h * self.intermediate_size
        return attn + mlp

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """All parameters (embedding counted once when tied), norms ignored."""
        lm = 0 if self.tie_word_embeddings else self.embedding_params
        return self.num_hidden_layers * self.layer_params + self.embedding_params + lm

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights (BF16: 2 bytes per parameter)."""
        return self.total_params * self.dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """KV-cache bytes per token per GPU over all layers: ``2 * L * kv_heads/tp * head_dim * dtype_bytes``.

        With ``tp`` larger than the KV-head count, vLLM replicates KV heads (one per GPU).
        """
        kvh = max(1, self.num_key_value_heads // tp)
        return 2 * self.num_hidden_layers * kvh * self.head_dim * self.dtype_bytes

    def check_tp(self, tp: int) -> None:
        """Raise ``CostModelError`` (naming field ``tp``) if the model cannot be split ``tp`` ways.

        vLLM needs ``num_attention_heads % tp == 0`` and either ``num_key_value_heads % tp == 0`` or
        ``tp % num_key_value_heads == 0`` (KV heads replicated), and the MLP split ``intermediate_size % tp``.
        """
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise CostModelError(f"field tp: must be a positive integer, got {tp!r}")
        nh, nkv = self.num_attention_heads, self.num_key_value_heads
        if nh % tp:
            raise CostModelError(f"field tp: {self.key} has {nh} attention heads, not divisible by tp={tp}")
        if nkv % tp and tp % nkv:
            raise CostModelError(f"field tp: {self.key} has {nkv} KV heads; tp={tp} neither divides nor is a multiple "
                                 f"of it")
        if self.intermediate_size % tp:
            raise CostModelError(f"field tp: {self.key} intermediate_size {self.intermediate_size} not divisible by "
                                 f"tp={tp}")


@dataclass(frozen=True)
class GPUSpec:
    """Datasheet numbers of one GPU (see ``hardware/gpus.yaml`` for units and sources)."""

    key: str
    name: str
    memory_gib: float
    bf16_dense_tflops: float
    hbm_bandwidth_gbs: float
    nvlink_bandwidth_gbs: float
    tdp_w: float
    idle_w: float
    source: str = ""
    idle_source: str = ""
    # kind "fitted" (a measured profile written by `dlfp calibrate`, e.g. hardware/cpu-calibrated.yaml):
    # the datasheet fields above are NaN and the device time comes from ``fitted`` (see FittedDeviceModel)
    kind: str = "datasheet"
    fitted: dict | None = None  # FittedCosts fields (seconds per unit)
    host: dict | None = None  # HostCosts fields measured with the profile (defaults for dlfp.backends.sim.runner)
    model: str | None = None  # the model the profile was fitted for
    dtype_bytes: int | None = None  # bytes per weight/KV element on this device (fp32 CPU: 4)
    kv_cache_gib: float | None = None  # KV-cache space (vLLM CPU: VLLM_CPU_KVCACHE_SPACE)
    machine: dict | None = None  # description of the measured machine
    fit: dict | None = None  # fit quality (residuals) and grid

    @property
    def peak_flops(self) -> float:
        return self.bf16_dense_tflops * 1e12

    @property
    def hbm_bw(self) -> float:
        return self.hbm_bandwidth_gbs * 1e9

    @property
    def link_bw_one_way(self) -> float:
        """NVLink bytes/s in one direction (datasheet figure is bidirectional)."""
        return self.nvlink_bandwidth_gbs * 1e9 / 2

    def describe(self) -> dict:
        """Plain dict for trace metadata."""
        return asdict(self)


def _load_yaml_dir(directory: Path) -> dict:
    out: dict = {}
    for p in sorted(Path(directory).glob("*.yaml")):
        data = yaml.safe_load(p.read_text()) or {}
        for k, v in data.items():
            out[k] = v
    return out


@lru_cache(maxsize=None)
def _models() -> dict:
    return _load_yaml_dir(MODELS_DIR)


@lru_cache(maxsize=None)
def _gpus() -> dict:
    return _load_yaml_dir(HARDWARE_DIR)


def known_models() -> list[str]:
    return sorted(_models())


def known_gpus() -> list[str]:
    return sorted(_gpus())


def load_model(key: str) -> ModelSpec:
    """The architecture ``key`` from ``models/*.yaml``.

    Raises:
        CostModelError: unknown key (message names field ``model`` and lists the known ones).
    """
    d = _models().get(key)
    if d is None:
        raise CostModelError(f"field model: unknown model {key!r}; known: {', '.join(known_models())}")
    return ModelSpec(key=key, **d)


def load_gpu(key: str) -> GPUSpec:
    """The GPU ``key`` from ``hardware/*.yaml``.

    Raises:
        CostModelError: unknown key (message names field ``gpu`` and lists the known ones).
    """
    d = _gpus().get(key)
    if d is None:
        raise CostModelError(f"field gpu: unknown GPU {key!r}; known: {', '.join(known_gpus())}")
    return GPUSpec(key=key, **d)


def kv_cache_blocks(model: ModelSpec, gpu: GPUSpec, tp: int, *, gpu_memory_utilization: float = 0.9,
                    block_size: int = 16, reserve_gib: float | None = None, max_num_batched_tokens: int = 8192,
                    max_num_seqs: int = 256) -> int:
    """KV-cache blocks per GPU, as vLLM 0.17.1 sizes them.

    A datasheet GPU: ``dlfp.devices.kv_sizing.profile_kv_sizing``, which follows vLLM's start-up profiling term by
    term (weights of one TP shard, activation peak of the profile run over ``max_num_batched_tokens`` tokens and
    ``max_num_seqs`` sampler rows, memory outside PyTorch's allocator) and divides what is left of
    ``memory_gib * gpu_memory_utilization`` by the bytes of one block of all layers. ``reserve_gib`` (GiB), when
    given, replaces the profiled terms after the weights: ``memory_gib * utilisation - weights/tp - reserve_gib``
    divided by ``block_size * kv_bytes_per_token(tp)`` (the rule used before; backend_options.sim.reserve_gib).

    A measured CPU profile (``kind: fitted`` with ``kv_cache_gib``): vLLM's CPU KV cache is a fixed space
    (``VLLM_CPU_KVCACHE_SPACE``) holding elements of the profile's ``dtype_bytes``.

    Raises:
        CostModelError: the weights (and profile run) do not fit (field ``gpu_memory_utilization``); a TP degree
            the model cannot split (field ``tp``); a GPU without an SM count (field ``gpu``).
    """
    if gpu.kind == "fitted" and gpu.kv_cache_gib is not None:
        # a measured CPU profile: vLLM's CPU KV cache is a fixed space (VLLM_CPU_KVCACHE_SPACE), elements of dtype_bytes
        scale = (gpu.dtype_bytes or model.dtype_bytes) / model.dtype_bytes
        return int(gpu.kv_cache_gib * GIB // (block_size * model.kv_bytes_per_token(tp) * scale))
    if reserve_gib is None:
        from dlfp.devices.kv_sizing import profile_kv_sizing

        return profile_kv_sizing(model, gpu, tp, gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
                                 max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs).num_blocks
    free = gpu.memory_gib * GIB * gpu_memory_utilization - model.weight_bytes / tp - reserve_gib * GIB
    if free <= 0:
        raise CostModelError(
            f"field gpu_memory_utilization: {model.key} weights ({model.weight_bytes / GIB / tp:.1f} GiB per GPU "
            f"at tp={tp}) do not fit in {gpu_memory_utilization} x {gpu.memory_gib} GiB of {gpu.key}")
    return int(free // (block_size * model.kv_bytes_per_token(tp)))
