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



@dataclass(frozen=True)
class HostCosts:
    """Per-step host costs of the engine loop (seconds).

    * ``schedule_base_s`` 80e-6 + ``schedule_per_req_s`` 4e-6 per running/scheduled
      request: ``Scheduler.schedule()`` is pure Python (budget loop, KV block
      allocation, SchedulerOutput construction); tens of microseconds plus a
      few per request is the order vLLM's own profiles show for small batches.
    * ``prep_base_s`` 150e-6 + ``prep_per_req_s`` 3e-6 + ``prep_per_token_s`` 0.02e-6:
      ``GPUModelRunner._prepare_inputs`` (numpy index building, H2D copies of
      input ids, positions, slot mappings, attention metadata).
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
    * ``sample_launch_s`` 30e-6: ``sample_tokens`` (sampler launch, async D2H copy).
    * ``update_base_s`` 60e-6 + ``update_per_req_s`` 5e-6:
      ``Scheduler.update_from_output`` (append tokens, stop checks, build
      EngineCoreOutputs).
    * ``bookkeeping_base_s`` 0 + ``bookkeeping_per_req_s`` 0: the model runner's work after the
      sampler (``GPUModelRunner._bookkeeping_sync``, building ``ModelRunnerOutput``) and ``EngineCore.step``
      up to ``update_from_output``. On a GPU it overlaps the next batch under async scheduling and is
      assumed to be inside ``update_base_s`` (0 here keeps the GPU experiments' costs as they were);
      measured on the CPU by ``dlfp calibrate``.
    * ``engine_loop_s`` 0: the engine loop between ``update_from_output`` and the next
      ``schedule()`` (``EngineCoreProc._process_engine_step`` putting the outputs on the output queue,
      ``_process_input_queue``). Assumed inside ``update_base_s`` on GPUs (0); measured on the CPU.
    * ``frontend_output_s`` 300e-6: EngineCore output thread -> ZMQ -> AsyncLLM
      output handler -> client stream; runs in other threads/processes, so it
      delays token emission but not the engine loop.
    * ``ingest_s`` 200e-6: a request's way from the client through AsyncLLM to the
      EngineCore input queue (prompt given as token ids, no tokenisation).
    """

    schedule_base_s: float = 80e-6
    schedule_per_req_s: float = 4e-6
    prep_base_s: float = 150e-6
    prep_per_req_s: float = 3e-6
    prep_per_token_s: float = 0.02e-6
    launch_graph_s: float = 7.7e-6
    launch_piecewise_per_layer_s: float = 18.7e-6
    launch_eager_per_kernel_s: float = 7.6e-6
    cudagraph_max_tokens: int = 512
    sample_launch_s: float = 30e-6
    update_base_s: float = 60e-6
    update_per_req_s: float = 5e-6
    bookkeeping_base_s: float = 0.0
    bookkeeping_per_req_s: float = 0.0
    engine_loop_s: float = 0.0
    frontend_output_s: float = 300e-6
    ingest_s: float = 200e-6

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise ValueError(f"field backend_options.sim.host.{f.name}: must be a finite non-negative number, got "
                                 f"{v!r}")

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
