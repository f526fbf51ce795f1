"""KV-cache size of a GPU as vLLM 0.17.1 profiles it, term by term.

vLLM 0.17.1 sizes the KV cache once, at start-up (``vllm/v1/worker/gpu_worker.py``,
``Worker.determine_available_memory``)::

    kv_bytes = requested - (weights + peak_activation + non_torch_increase)
    requested = ceil(total_memory * gpu_memory_utilization)          (vllm/v1/worker/utils.py, request_memory)
    num_blocks = kv_bytes // page_bytes // num_layers                (vllm/v1/core/kv_cache_utils.py, get_num_blocks)
    page_bytes = 2 * block_size * kv_heads_per_gpu * head_dim * dtype_bytes
                                                 (vllm/v1/kv_cache_interface.py, AttentionSpec.real_page_size_bytes)

and logs ``num_blocks * block_size`` as "GPU KV cache size: N tokens" (``kv_cache_utils._report_kv_cache_config``).
The three subtracted terms are the fields of ``vllm/utils/mem_utils.py``'s ``memory_profiling``:

* ``weights``: ``GPUModelRunner.model_memory_usage``, the PyTorch memory that ``load_model`` allocated
  (``vllm/v1/worker/gpu_model_runner.py``, ``load_model``): the weight shards of this GPU plus the rotary
  ``cos_sin_cache`` buffer (``weight_bytes_per_gpu``).
* ``peak_activation``: ``torch_peak_increase``, the rise of PyTorch's peak allocated bytes over the profile run
  (``GPUModelRunner.profile_run``): one forward of ``max_num_batched_tokens`` tokens with no attention metadata
  (``_dummy_run(..., is_profile=True)``), then the sampler on ``min(max_num_seqs, max_num_batched_tokens)`` rows
  (``_dummy_sampler_run``) while the forward's output is still held (``peak_activation_bytes``).
* ``non_torch_increase``: device memory outside PyTorch's allocator added between the worker's baseline snapshot
  and the end of the profile run (``non_torch_increase_bytes``). The CUDA context, the NCCL communicators and
  the custom all-reduce buffers exist before that snapshot (``Worker.init_device`` initialises the distributed
  environment, then takes ``init_snapshot``), so they are not subtracted.

CUDA graphs are not a term: 0.17.1 captures them in ``Worker.compile_or_warm_up_model``, which the executor calls
after the KV cache is allocated (``vllm/v1/executor/abstract.py``, ``Executor.initialize_from_config``); the
worker's own debug message there says the profiling "does not consider CUDAGraph memory size". The 150 MiB
``redundancy_buffer_memory`` of that message only enters a suggested ``--kv-cache-memory`` value, not the size.

Units: bytes in code, GiB where a name says so.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from dlfp.devices.specs import GIB, CostModelError, GPUSpec, ModelSpec

#: ``vllm/model_executor/layers/vocab_parallel_embedding.py``: ``DEFAULT_VOCAB_PADDING_SIZE``; the embedding and
#: LM-head rows are padded to a multiple of it, then split evenly over the TP ranks.
VOCAB_PADDING = 64
#: ``vllm/v1/sample/ops/topk_topp_sampler.py``, ``apply_top_k_top_p``: batches of at least this many rows take
#: the Triton top-k/top-p kernel; smaller ones sort the vocabulary in PyTorch.
TRITON_TOPK_MIN_ROWS = 8
#: Bytes of the sampler's float32 tensors (``Sampler.forward`` casts the logits to float32), of the int64 sort
#: indices and of the boolean masks (``apply_top_k_top_p_pytorch``).
FP32_BYTES, INT64_BYTES, BOOL_BYTES = 4, 8, 1
#: Assumption (no vLLM constant): device memory outside PyTorch's allocator that a single-GPU worker adds
#: between its baseline snapshot and the end of the profile run: the kernel images that CUDA's lazy module
#: loading brings in when the compiled model and the sampler first run, and the cuBLAS/cuBLASLt handle state.
#: Public vLLM start-up logs of single-GPU runs print this term ("GiB for non-torch memory") at a few hundredths
#: to a few tenths of a GiB; we take 0.1 GiB.
NON_TORCH_GIB = 0.1
#: Assumption (no vLLM constant), added when ``tp > 1``: NCCL buffers connected at the profile run's first large
#: all-reduce. NCCL (2.22 and later) connects each algorithm and protocol lazily at its first use
#: (``NCCL_RUNTIME_CONNECT``, default 1, NCCL environment-variable documentation), and the start-up warm-up
#: all-reduce of one element does not use the Simple protocol that large messages take. Ring all-reduce: up to
#: 32 channels, each with a send and a receive buffer of ``NCCL_BUFFSIZE`` (default 4 MiB, same documentation):
#: 32 x 2 x 4 MiB = 0.25 GiB.
NCCL_LAZY_GIB = 0.25


@dataclass(frozen=True)
class KVSizing:
    """The terms of one KV-cache sizing (bytes), as ``Worker.determine_available_memory`` combines them."""

    total_bytes: int  # device memory (GPUSpec.memory_gib)
    requested_bytes: int  # ceil(total * gpu_memory_utilization)
    weight_bytes: int
    forward_peak_bytes: int  # activation peak of the dummy forward
    sampler_peak_bytes: int  # activation peak of the dummy sampler run (forward output still held)
    non_torch_bytes: int
    cuda_graph_bytes: int  # 0 in vLLM 0.17.1 (captured after sizing)
    kv_bytes: int
    page_bytes: int  # one block of one layer
    num_layers: int
    block_size: int
    num_blocks: int

    @property
    def peak_activation_bytes(self) -> int:
        """``torch_peak_increase`` of the profile run: the larger of the two phases."""
        return max(self.forward_peak_bytes, self.sampler_peak_bytes)

    @property
    def non_kv_bytes(self) -> int:
        """``MemoryProfilingResult.non_kv_cache_memory`` (+ CUDA graphs, 0 here)."""
        return self.weight_bytes + self.peak_activation_bytes + self.non_torch_bytes + self.cuda_graph_bytes

    @property
    def tokens(self) -> int:
        """What vLLM logs as "GPU KV cache size: N tokens": ``num_blocks * block_size``."""
        return self.num_blocks * self.block_size

    def as_dict(self) -> dict:
        return {**asdict(self), "peak_activation_bytes": self.peak_activation_bytes,
                "non_kv_bytes": self.non_kv_bytes, "tokens": self.tokens}


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads one GPU holds: ``num_key_value_heads / tp``, at least 1 (vLLM replicates KV heads when
    ``tp`` exceeds their count; ``QKVParallelLinear``)."""
    return max(1, model.num_key_value_heads // tp)


def page_bytes(model: ModelSpec, tp: int, block_size: int) -> int:
    """Bytes of one KV block of one layer on one GPU: ``2 * block_size * kv_heads * head_dim * dtype_bytes``
    (``vllm/v1/kv_cache_interface.py``, ``AttentionSpec.real_page_size_bytes``; K and V)."""
    return 2 * block_size * kv_heads_per_gpu(model, tp) * model.head_dim * model.dtype_bytes


def vocab_rows_per_gpu(model: ModelSpec, tp: int) -> int:
    """Embedding (and LM-head) rows on one GPU: the vocabulary padded to a multiple of 64, split over ``tp``
    (``VocabParallelEmbedding.__init__``: ``pad_vocab_size`` then ``divide(num_embeddings_padded, tp_size)``)."""
    return math.ceil(model.vocab_size / VOCAB_PADDING) * VOCAB_PADDING // tp


def weight_bytes_per_gpu(model: ModelSpec, tp: int) -> int:
    """``model_memory_usage`` of one GPU (bytes): what ``GPUModelRunner.load_model`` allocates.

    Per decoder layer: the q/o projections and the MLP split ``tp`` ways (``ColumnParallelLinear``,
    ``RowParallelLinear``), the k/v projections of ``kv_heads_per_gpu`` heads, and four replicated RMSNorm
    weights (input and post-attention: ``hidden_size``; Qwen3's ``q_norm``/``k_norm``: ``head_dim``;
    ``vllm/model_executor/models/qwen3.py``). Plus the vocabulary-parallel embedding and LM head (one matrix when
    tied), the final norm, and one rotary ``cos_sin_cache`` of ``max_position_embeddings x head_dim`` elements in
    the model dtype (``RotaryEmbeddingBase.__init__``; ``get_rope`` shares one instance between layers).
    """
    h, d, L = model.hidden_size, model.head_dim, model.num_hidden_layers
    attn = h * (model.num_attention_heads // tp) * d * 2 + h * kv_heads_per_gpu(model, tp) * d * 2
    mlp = 3 * h * (model.intermediate_size // tp)
    norms = 2 * h + 2 * d
    vocab = vocab_rows_per_gpu(model, tp) * h * (1 if model.tie_word_embeddings else 2)
    rope = model.max_position_embeddings * d
    return (L * (attn + mlp + norms) + vocab + h + rope) * model.dtype_bytes


def forward_peak_bytes(model: ModelSpec, tp: int, num_tokens: int) -> int:
    """Activation peak (bytes) of the profile run's forward over ``num_tokens`` tokens on one GPU.

    vLLM 0.17.1 runs it through the torch.compile'd model (its default; ``_dummy_run(is_profile=True)`` turns off
    CUDA graphs, not compilation), whose Inductor code frees each buffer after its last use. The live tensors at the
    largest step of a decoder layer, in elements per token (the residual stream ``hidden_size`` is always live):

    * MLP gate/up matmul: residual + normed input + ``2 * intermediate/tp`` output;
    * SiluAndMul: residual + ``2 * intermediate/tp`` input + ``intermediate/tp`` output;
    * attention: residual + QKV output + normed q and k copies + the attention output buffer
      (``Attention.forward`` allocates it; with no attention metadata the kernel does not run).
    """
    h, d = model.hidden_size, model.head_dim
    i = model.intermediate_size // tp
    q, kv = model.num_attention_heads // tp * d, kv_heads_per_gpu(model, tp) * d
    per_token = max(2 * h + 2 * i, h + 3 * i, h + (q + 2 * kv) + (q + kv) + q)
    return num_tokens * per_token * model.dtype_bytes


def triton_buffer_rows(sm_count: int, rows: int) -> int:
    """Rows of the float32 scratch buffer ``apply_top_k_top_p_triton`` caches (and keeps):
    ``min(next_power_of_2(min(sm_count, rows)), sm_count)`` (``vllm/v1/sample/ops/topk_topp_triton.py``)."""
    programs = min(sm_count, rows)
    return min(1 << (programs - 1).bit_length(), sm_count)


def sampler_peak_bytes(model: ModelSpec, sm_count: int, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """Activation peak (bytes) of the profile run's sampler phase on one GPU.

    ``profile_run`` keeps the forward's output (``max_num_batched_tokens x hidden_size``) and its last-token rows
    (``R = min(max_num_seqs, max_num_batched_tokens)``, ``_dummy_run``) while ``_dummy_sampler_run`` draws
    ``rand_like`` rows and computes the full-vocabulary logits ``R x V`` in the model dtype (all-gathered under
    TP; ``LogitsProcessor``). The dummy request samples at temperature 0.5 with top-k ``V - 1`` and top-p 0.9,
    no penalties, no logprobs. ``Sampler.forward`` casts the logits to float32 (``4RV``); for ``R >= 8`` the
    Triton top-k/top-p kernel works in place with its cached ``rows x V`` float32 buffer, then
    ``softmax`` (``4RV``) and ``random_sample``'s exponential draws (``4RV``) are live together. For ``R < 8``
    ``apply_top_k_top_p_pytorch`` peaks at the top-p mask: sorted values (``4RV``), int64 indices (``8RV``), the
    top-k mask (``RV``), sorted probabilities (``4RV``) and the top-p mask (``RV``).
    """
    r, v, e = min(max_num_seqs, max_num_batched_tokens), model.vocab_size, model.dtype_bytes
    held = (max_num_batched_tokens + 2 * r) * model.hidden_size * e
    logits = r * v * (e + FP32_BYTES)
    if r >= TRITON_TOPK_MIN_ROWS:
        sampling = 2 * r * v * FP32_BYTES + triton_buffer_rows(sm_count, r) * v * FP32_BYTES
    else:
        sampling = r * v * (FP32_BYTES + INT64_BYTES + BOOL_BYTES + FP32_BYTES + BOOL_BYTES)
    return held + logits + sampling


def non_torch_increase_bytes(tp: int) -> int:
    """``non_torch_increase`` (bytes): ``NON_TORCH_GIB``, plus ``NCCL_LAZY_GIB`` when ``tp > 1`` (assumptions,
    reasons at the constants)."""
    return int((NON_TORCH_GIB + (NCCL_LAZY_GIB if tp > 1 else 0.0)) * GIB)


def sm_count(gpu: GPUSpec) -> int:
    """Streaming multiprocessors of ``gpu`` (the ``gpus`` section of ``dlfp/devices/operators.yaml``, sources there).

    Raises:
        CostModelError: no SM count for this GPU (field ``gpu``).
    """
    from dlfp.devices.operators import load_constants

    counts = load_constants().sm_count
    if gpu.key not in counts:
        raise CostModelError(f"field gpu: no SM count for {gpu.key!r} in operator constants (the sampler's top-k "
                             f"buffer has one row per SM); known: {', '.join(sorted(counts))}")
    return int(counts[gpu.key])


def profile_kv_sizing(model: ModelSpec, gpu: GPUSpec, tp: int, *, gpu_memory_utilization: float = 0.9,
                      block_size: int = 16, max_num_batched_tokens: int = 8192,
                      max_num_seqs: int = 256) -> KVSizing:
    """The KV cache of one GPU of ``gpu`` running ``model`` at ``tp``, as vLLM 0.17.1 sizes it (module docstring).

    ``total_memory`` is ``gpu.memory_gib`` GiB. Engine settings as in vLLM: ``max_num_batched_tokens`` sizes the
    profile forward, ``max_num_seqs`` the sampler rows (defaults: this project's GPU experiments, 8,192 and 256).

    Raises:
        CostModelError: the weights and the profile run leave no KV memory (one line, field
            ``gpu_memory_utilization``), like vLLM's "No available memory for the cache blocks"; a GPU without an
            SM count (field ``gpu``).
    """
    model.check_tp(tp)
    total = int(gpu.memory_gib * GIB)
    requested = math.ceil(total * gpu_memory_utilization)
    weights = weight_bytes_per_gpu(model, tp)
    fwd = forward_peak_bytes(model, tp, max_num_batched_tokens)
    smp = sampler_peak_bytes(model, sm_count(gpu), max_num_batched_tokens, max_num_seqs)
    non_torch = non_torch_increase_bytes(tp)
    kv = requested - (weights + max(fwd, smp) + non_torch)
    page = page_bytes(model, tp, block_size)
    if kv <= 0:
        raise CostModelError(
            f"field gpu_memory_utilization: {model.key} weights ({weights / GIB:.1f} GiB per GPU at tp={tp}) and "
            f"the profile run ({(max(fwd, smp) + non_torch) / GIB:.2f} GiB) do not fit in {gpu_memory_utilization} "
            f"x {gpu.memory_gib} GiB of {gpu.key}")
    blocks = int(kv // page // model.num_hidden_layers)
    return KVSizing(total_bytes=total, requested_bytes=requested, weight_bytes=weights, forward_peak_bytes=fwd,
                    sampler_peak_bytes=smp, non_torch_bytes=non_torch, cuda_graph_bytes=0, kv_bytes=kv,
                    page_bytes=page, num_layers=model.num_hidden_layers, block_size=block_size, num_blocks=blocks)


__all__ = ["KVSizing", "NCCL_LAZY_GIB", "NON_TORCH_GIB", "forward_peak_bytes", "kv_heads_per_gpu", "page_bytes",
           "profile_kv_sizing", "sampler_peak_bytes", "sm_count", "triton_buffer_rows", "vocab_rows_per_gpu",
           "weight_bytes_per_gpu", "non_torch_increase_bytes"]
