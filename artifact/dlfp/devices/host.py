"""Host-side costs of vLLM's engine loop (seconds), as named parameters: the one ``HostCosts`` of every backend.

The simulator charges every field; the emulator runs vLLM's real scheduler and output path on this CPU, so it
charges only the model-runner fields (input preparation, kernel launch, sampler launch).

These are assumptions with a stated reason, not fitted to the DLFP paper.
Every cost is host CPU time on the EngineCore thread unless noted.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Callable



def check_non_negative_fields(costs, where: str) -> None:
    """Every field of the dataclass ``costs`` is a finite non-negative number (not a bool).

    Raises:
        ValueError: naming the first bad field as ``<where>.<field>``.
    """
    for f in fields(costs):
        v = getattr(costs, f.name)
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
            raise ValueError(f"field {where}.{f.name}: must be a finite non-negative number, got {v!r}")


@dataclass(frozen=True)
class HostCosts:
    """Per-step host costs of the engine loop (seconds).

    The engine loop's Python (``schedule``, ``prep``, ``update``, ``bookkeeping``, ``engine_loop``) is the same code on
    the GPU and CPU paths (``Scheduler``, ``EngineCore``; ``CPUModelRunner`` subclasses ``GPUModelRunner``, so
    ``_update_states``, ``_prepare_inputs`` and ``_bookkeeping_sync`` are shared). The defaults are therefore the
    values ``dlfp calibrate`` fitted on the real engine of this project's 2-core Xeon VM, frozen in
    ``data/host-measurements/engine_loop_xeon_2core.json`` (microseconds, two decimals), used unscaled for the
    paper's host: the one comparison with a GPU server's host (a pure-Python scheduler benchmark,
    ``data/gpu-measurements/h200/step_floor.csv``) found it no faster. Known difference: the CPU path's input
    preparation builds the CPU attention backend's metadata and dispatches through the executor in-process, the GPU
    path builds FlashAttention's and copies to the device asynchronously. Before the measurement they were assumed
    (80 + 4/request, 150 + 3/request + 0.02/token, 60 + 5/request, 0, 0 us).

    * ``schedule_base_s`` 99.04e-6 + ``schedule_per_req_s`` 3.59e-6 per running and scheduled request:
      ``Scheduler.schedule()``.
    * ``prep_base_s`` 476.33e-6 + ``prep_per_req_s`` 4.83e-6 + ``prep_per_token_s`` 0.11e-6: executor dispatch,
      ``GPUModelRunner._update_states`` and ``_prepare_inputs``.
    * launch: ``launch_graph_s`` 7.7e-6 for a decode-only batch of at most
      ``cudagraph_max_tokens`` tokens replayed as one FULL CUDA graph;
      ``launch_piecewise_per_layer_s`` 18.7e-6 per layer for a mixed batch of at
      most ``cudagraph_max_tokens`` (piecewise graphs, attention launched
      eagerly between pieces); ``launch_eager_per_kernel_s`` 7.6e-6 per kernel
      (PyTorch dispatch + cudaLaunchKernel) for larger batches that run without
      graphs, and for every batch under ``--enforce-eager``. ``cudagraph_max_tokens`` 512 = vLLM's default
      largest capture size (min(2 * max_num_seqs, 512)). Launch overlaps the device: the batch cannot
      finish before its last kernel is launched. The three launch costs are measured on a GPU server's host
      (``benchmarks/gpu/step_floor.py`` on the H200 machine, ``data/gpu-measurements/h200/step_floor.csv``,
      medians of 25): one eager kernel 7.6 us to enqueue (``eager_op``); ``replay()`` of a captured graph of
      512 kernels 7.7 us (``graph_replay_launch``, 3.5 us for 1-64 kernels; a Qwen3 decoder stack is 300-770
      kernels); a piecewise layer = one graph replay of its pieces (3.5 us, 64 kernels) and two attention
      kernels launched eagerly (2 x 7.6 us). Before the measurement they were assumed 40, 15 and 5 us.
    * ``sample_launch_s`` 30e-6: ``sample_tokens`` (sampler launch, async D2H copy); assumed, and consistent with
      the 33.6 us a one-row greedy sample took end to end on the H200 (launch-bound, ``sampler_greedy``).
    * ``update_base_s`` 77.76e-6 + ``update_per_req_s`` 5.26e-6: ``Scheduler.update_from_output`` (append tokens,
      stop checks, build EngineCoreOutputs).
    * ``bookkeeping_base_s`` 280.21e-6 + ``bookkeeping_per_req_s`` 6.54e-6: the model runner's work after the
      sampler (``GPUModelRunner._bookkeeping_sync``, building ``ModelRunnerOutput``) and ``EngineCore.step`` up to
      ``update_from_output``.
    * ``engine_loop_s`` 129.01e-6: the engine loop between ``update_from_output`` and the next ``schedule()``
      (``EngineCoreProc._process_engine_step`` putting the outputs on the output queue, ``_process_input_queue``).
    * ``frontend_output_s`` 522.68e-6: EngineCore output thread -> ZMQ -> the API server's output handler, outside
      the handler's own work (``dlfp.devices.frontend``); delays token emission but not the engine loop.
    * ``ingest_s`` 258.34e-6: from the API server's ``add_request`` through ZMQ to the EngineCore input queue.
      Both fitted by ``dlfp frontend`` on the real ``vllm serve`` of this project's CPU
      (``data/results/frontend/frontend.md``: their sum from token-id requests one at a time, split as ``dlfp
      calibrate`` measured them without HTTP); before, 300 and 200 us were assumed.
    """

    schedule_base_s: float = 99.04e-6
    schedule_per_req_s: float = 3.59e-6
    prep_base_s: float = 476.33e-6
    prep_per_req_s: float = 4.83e-6
    prep_per_token_s: float = 0.11e-6
    launch_graph_s: float = 7.7e-6
    launch_piecewise_per_layer_s: float = 18.7e-6
    launch_eager_per_kernel_s: float = 7.6e-6
    cudagraph_max_tokens: int = 512
    sample_launch_s: float = 30e-6
    update_base_s: float = 77.76e-6
    update_per_req_s: float = 5.26e-6
    bookkeeping_base_s: float = 280.21e-6
    bookkeeping_per_req_s: float = 6.54e-6
    engine_loop_s: float = 129.01e-6
    frontend_output_s: float = 522.68e-6
    ingest_s: float = 258.34e-6

    def __post_init__(self) -> None:
        check_non_negative_fields(self, "backend_options.sim.host")

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "HostCosts":
        """Build from a (partial) dict; unknown keys are rejected naming the field."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"field backend_options.sim.host.{bad[0]}: unknown; known: {', '.join(sorted(known))}")
        return cls(**d)

    def prep_s(self, num_requests: int, num_tokens: int) -> float:
        """Input preparation (s) of a batch of ``num_requests`` requests and ``num_tokens`` tokens."""
        return self.prep_base_s + self.prep_per_req_s * num_requests + self.prep_per_token_s * num_tokens

    def bookkeeping_s(self, num_requests: int) -> float:
        """The model runner's work after the sampler (s) for a batch of ``num_requests`` requests."""
        return self.bookkeeping_base_s + self.bookkeeping_per_req_s * num_requests

    def launch_rule(self, num_layers: int, kernels_per_layer: int,
                    enforce_eager: bool = False) -> Callable[[int, int], float]:
        """The kernel-launch time (s) of a model with ``num_layers`` layers of ``kernels_per_layer`` kernels.

        Returns ``launch(num_tokens, num_prefills) -> seconds``: ``launch_graph_s`` for a FULL CUDA graph,
        ``launch_piecewise_per_layer_s * num_layers`` for piecewise graphs, ``launch_eager_per_kernel_s *
        num_layers * kernels_per_layer`` eagerly. The rule follows vLLM 0.17.1's CUDA-graph modes
        (``vllm/config/compilation.py``): a decode-only batch of at most ``cudagraph_max_tokens`` tokens replays
        one FULL graph; a mixed batch of at most that many tokens runs PIECEWISE graphs (attention launched
        eagerly between pieces); a larger batch runs eagerly. ``enforce_eager`` (vLLM's ``--enforce-eager``:
        ``ModelConfig.enforce_eager``, no graph captured, ``CUDAGraphMode.NONE``) launches every batch eagerly.
        This is the only place the rule is written.
        """
        graph = self.launch_graph_s
        piecewise = self.launch_piecewise_per_layer_s * num_layers
        eager = self.launch_eager_per_kernel_s * num_layers * kernels_per_layer
        gmax = self.cudagraph_max_tokens

        if enforce_eager:
            return lambda num_tokens, num_prefills: eager

        def launch(num_tokens: int, num_prefills: int) -> float:
            if num_tokens <= gmax:
                return graph if num_prefills == 0 else piecewise
            return eager
        return launch
