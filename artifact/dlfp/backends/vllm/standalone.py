"""A vLLM 0.17.1 DLFP scheduler without an engine, for tests and the overhead benchmark.

:func:`standalone_scheduler` builds the scheduler in this process with no model,
executor or engine core; :func:`make_request` makes a request and :func:`fake_step`
runs one iteration with a fake model output.
"""
from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from dlfp.backends.vllm.scheduler import CONFIG_KEY, DLFPScheduler
from dlfp.paths import HF_MODELS_DIR


def standalone_scheduler(policy: dict | None = None, *, model: str | None = None, max_num_batched_tokens: int = 2048,
                         max_num_seqs: int = 16, block_size: int = 16, num_blocks: int = 4096,
                         max_model_len: int = 8192, async_scheduling: bool = False, stock: bool = False,
                         log_path: str | None = None):
    """A vLLM 0.17.1 scheduler built in this process, with no model, executor or engine core.

    ``policy`` is the ``additional_config["dlfp"]`` object (PolicyConfig
    fields, optional ``log_path``); ``stock=True`` builds vLLM's own
    ``Scheduler``/``AsyncScheduler`` instead of the DLFP one. The model is only
    read for its ``config.json`` (default: the shipped ``qwen3-tiny``). Drive
    it with :func:`fake_step`.
    """

    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = model or str(HF_MODELS_DIR / "qwen3-tiny")
    dl = dict(policy or {"policy": "nocap"})
    if log_path:
        dl["log_path"] = log_path
    args = EngineArgs(model=model, load_format="dummy", skip_tokenizer_init=True, dtype="float32",
                      max_model_len=max_model_len, enable_chunked_prefill=True,
                      max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                      block_size=block_size, enable_prefix_caching=False, enforce_eager=True,
                      additional_config={CONFIG_KEY: dl}, disable_log_stats=True)
    vc = args.create_engine_config()
    vc.scheduler_config.async_scheduling = async_scheduling  # the CPU platform forces it off
    vc.cache_config.num_gpu_blocks = num_blocks
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer.0"], FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                                                        dtype=torch.float32))])
    if stock:
        cls = AsyncScheduler if async_scheduling else Scheduler
    else:
        cls = DLFPScheduler
    return cls(vllm_config=vc, kv_cache_config=kvc, structured_output_manager=StructuredOutputManager(vc),
               block_size=block_size, log_stats=False)


def make_request(request_id: str, prompt_tokens: int, max_tokens: int, first_token: int = 100):
    """A vLLM ``Request`` with ``prompt_tokens`` distinct ids, greedy, ``ignore_eos``, ``max_tokens`` outputs."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [(first_token + i) % 30000 + 10 for i in range(prompt_tokens)]
    return Request(request_id=request_id, prompt_token_ids=ids, sampling_params=sp, pooling_params=None)


def fake_step(scheduler, token_id: int = 7):
    """One engine iteration with no model: ``schedule()``, then an output that samples ``token_id``.

    Every scheduled request whose prefill completes (or that decodes) gets one
    token; non-final prefill chunks get none, as vLLM's model runner does.
    Returns the ``SchedulerOutput``.
    """
    from vllm.v1.outputs import ModelRunnerOutput

    so = scheduler.schedule()
    req_ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        r = scheduler.requests[rid]
        done_prefill = r.num_computed_tokens >= r.num_tokens  # advanced by schedule()
        sampled.append([token_id] if done_prefill else [])
    mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                            sampled_token_ids=sampled)
    scheduler.update_from_output(so, mro)
    return so


__all__ = ["fake_step", "make_request", "standalone_scheduler"]
