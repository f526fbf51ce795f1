"""``EmuExecutor``: a vLLM 0.17.1 V1 ``Executor`` whose device is emulated.

vLLM's real ``EngineCore`` (``step`` or, with asynchronous scheduling,
``step_with_batch_queue``), its scheduler and its KV-cache manager run
unchanged; only the model forward pass is replaced:

* ``execute_model`` spends the modelled host cost of the GPU model runner
  (``HostCosts``) synchronously on the engine thread, works out the batch's
  output token ids, and hands the batch to the single device thread
  (``EmulatedDevice``), which "runs" it for the device time of the configured
  cost model; like ``GPUModelRunner`` it returns ``None``.
* ``sample_tokens`` returns the (future) ``ModelRunnerOutput`` of the oldest
  batch not yet sampled. Non-final prefill chunks get ``[]``, as the real
  runner discards their sample.
* The KV cache has the capacity the modelled GPU memory gives (weights
  subtracted, per TP shard).
* Preemption with recompute is handled: a resumed request's known tokens come
  from the scheduler (``all_token_ids``); token ids depend only on (external
  request id, output index), so recomputed and re-emitted tokens are identical.

Settings travel to the engine-core process in
``vllm_config.additional_config["dlfp_emu"]`` (JSON-like, see ``EmuSettings``).
Each executed batch appends one JSON line to ``log_path`` (write-through, so
the log survives the engine-core process): ``seq``, ``iteration`` (the
scheduler's tag, if any), ``exec_s`` (``execute_model`` entered),
``issue_s`` (handed to the device), ``device_start_s``, ``device_end_s``
(the device timeline), ``signal_s`` (when the completion became visible to
the host; later than ``device_end_s`` only by thread wake-up latency),
``modelled_s``, ``host_cost_s``, ``prefill_tokens``, ``num_prefills``,
``num_decodes``, ``num_reqs``, ``num_preempted`` (requests the scheduler
preempted in this step), ``num_resumed``, ``energy_j`` (modelled, or null).
Times are ``time.monotonic()`` seconds.

Async scheduling needs three things (found by the prototype): pass
``executor_class=EmuExecutor`` straight to the engine (``Executor.get_class``
refuses a custom backend together with async scheduling), keep the ``uni``
distributed backend, and set ``scheduler_config.async_scheduling = True`` again
after ``create_engine_config`` (the CPU platform turns it off). See
``dlfp.backends.emu.runner``.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from vllm import envs
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

from dlfp.backends.emu.device import DeviceRecord, EmuBatch, EmulatedDevice, device_time_fn_from_spec
from dlfp.devices.host import HostCosts
from dlfp.traces.token_ids import token_id

SETTINGS_KEY = "dlfp_emu"
# Attribute names the executor reads from / writes to vLLM objects (additive hooks).
ITERATION_ATTR = "dlfp_iteration"  # on SchedulerOutput, set by a scheduler that numbers its iterations
DEVICE_ATTR = "dlfp_device"  # on ModelRunnerOutput: (device_start_s, device_end_s), monotonic seconds
# vLLM appends "-" + 8 random characters to the caller's request id
# (vllm/v1/engine/input_processor.py, InputProcessor.assign_request_id).
_RANDOM_SUFFIX_LEN = 9


@dataclass
class EmuSettings:
    """What the emulated device needs, as plain data (it crosses into the engine-core process).

    Attributes:
        device: device-time spec (``dlfp.backends.emu.device.device_time_fn_from_spec``).
        host: ``dlfp.devices.host.HostCosts`` fields (seconds); only the model-runner ones are charged
            (input preparation, kernel launch, sampler launch): vLLM's own scheduler and output path run here.
        kernels_per_layer: kernels per decoder layer, for the eager launch cost
            (``dlfp.devices.roofline.DeviceAssumptions.kernels_per_layer``).
        num_gpu_blocks: KV-cache blocks per TP shard (``dlfp.devices.roofline.kv_cache_blocks``
            for the modelled GPU memory, computed by ``dlfp.backends.emu.runner``).
        tp: modelled tensor-parallel degree (KV heads per shard).
        log_path: JSON-lines device log (``None``: no log).
    """

    device: dict[str, Any]
    host: dict[str, float] = field(default_factory=dict)
    num_gpu_blocks: int = 0
    tp: int = 1
    kernels_per_layer: int = 12
    log_path: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EmuSettings":
        try:
            return cls(**d)
        except TypeError as e:
            raise ValueError(f"additional_config[{SETTINGS_KEY!r}]: {e}") from None


class _ReqState:
    __slots__ = ("key", "prompt_len", "num_out")

    def __init__(self, key: str, prompt_len: int, num_out: int = 0) -> None:
        self.key = key
        self.prompt_len = prompt_len
        self.num_out = num_out  # output tokens this "worker" knows (sampled so far)


class EmuExecutor(Executor):
    """vLLM Executor over an emulated device (see the module docstring)."""

    supports_pp = False

    # ---- construction --------------------------------------------------------------
    def _init_executor(self) -> None:
        extra = self.vllm_config.additional_config
        raw = extra.get(SETTINGS_KEY) if isinstance(extra, dict) else None
        if raw is None:
            raise ValueError(f"EmuExecutor needs vllm_config.additional_config[{SETTINGS_KEY!r}] "
                             f"(see dlfp.backends.emu.runner)")
        self.settings = EmuSettings.from_dict(raw)
        self.device_time_fn = device_time_fn_from_spec(self.settings.device)
        self._energy_fn = getattr(self.device_time_fn, "energy_j", None)
        try:
            self.host_costs = HostCosts.from_dict(self.settings.host)
        except (TypeError, ValueError) as e:
            raise ValueError(f"additional_config[{SETTINGS_KEY!r}].host: {e}") from None
        hf = self.model_config.hf_text_config
        self.num_layers = int(hf.num_hidden_layers)
        self._launch = self.host_costs.launch_rule(self.num_layers, int(self.settings.kernels_per_layer))
        self.tp = int(self.settings.tp)
        self.num_kv_heads = max(1, int(hf.num_key_value_heads) // self.tp)
        self.head_size = int(getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads)
        self.vocab_size = int(hf.vocab_size)
        self.block_size = int(self.cache_config.block_size)
        self._strip_suffix = not envs.VLLM_DISABLE_REQUEST_ID_RANDOMIZATION
        self.reqs: dict[str, _ReqState] = {}
        self.seq = 0
        self.pending: deque[Future] = deque()
        self._log_lock = threading.Lock()
        self._log = open(self.settings.log_path, "a", buffering=1) if self.settings.log_path else None
        self.device = EmulatedDevice(on_done=self._on_done)

    @property
    def max_concurrent_batches(self) -> int:
        """2 with async scheduling (the batch queue of ``step_with_batch_queue``), else 1; as UniProcExecutor."""
        return 2 if self.scheduler_config.async_scheduling else 1

    # ---- KV cache -------------------------------------------------------------------
    def _spec(self) -> FullAttentionSpec:
        return FullAttentionSpec(block_size=self.block_size, num_kv_heads=self.num_kv_heads,
                                 head_size=self.head_size, dtype=torch.bfloat16)

    def num_gpu_blocks(self) -> int:
        """KV-cache blocks per shard (``settings.num_gpu_blocks``).

        Raises:
            ValueError: fewer than one block.
        """
        n = int(self.settings.num_gpu_blocks)
        if n < 1:
            raise ValueError(f"additional_config[{SETTINGS_KEY!r}].num_gpu_blocks must be >= 1, got {n}")
        return n

    def determine_available_memory(self) -> list[int]:
        return [self.num_gpu_blocks() * self._spec().page_size_bytes * self.num_layers]

    def get_kv_cache_specs(self):
        s = self._spec()
        return [{f"model.layers.{i}.self_attn.attn": s for i in range(self.num_layers)}]

    def initialize_from_config(self, kv_cache_configs) -> None:
        self.kv_num_blocks = kv_cache_configs[0].num_blocks

    # ---- control plane --------------------------------------------------------------
    _NOOP_RPCS = frozenset({"initialize_cache", "shutdown", "compile_or_warm_up_model", "update_max_model_len",
                            "reset_mm_cache", "reset_encoder_cache", "profile", "reset_prefix_cache",
                            "init_device", "load_model", "sleep", "wake_up"})

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
        name = method if isinstance(method, str) else getattr(method, "__name__", "callable")
        if name == "get_supported_tasks":
            res: list[Any] = [("generate",)]
        elif name in self._NOOP_RPCS:
            res = [None]
        else:
            raise NotImplementedError(f"EmuExecutor.collective_rpc({name!r}) is not emulated")
        if non_block:
            f: Future = Future()
            f.set_result(res)
            return f
        return res

    def check_health(self) -> None:
        return

    def shutdown(self) -> None:
        self.device.shutdown()
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    # ---- the data plane -------------------------------------------------------------
    def _key(self, req_id: str) -> str:
        return req_id[:-_RANDOM_SUFFIX_LEN] if self._strip_suffix and len(req_id) > _RANDOM_SUFFIX_LEN else req_id

    def _update_states(self, so) -> None:
        """Mirror the model runner's request bookkeeping (``GPUModelRunner._update_states``)."""
        for rid in so.finished_req_ids:
            self.reqs.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            plen = len(nr.prompt_token_ids)
            known = len(nr.prefill_token_ids) if nr.prefill_token_ids is not None else plen
            self.reqs[nr.req_id] = _ReqState(self._key(nr.req_id), plen, known - plen)
        cr = so.scheduled_cached_reqs
        for rid in cr.resumed_req_ids:
            st = self.reqs[rid]
            toks = cr.all_token_ids.get(rid)
            if toks is not None:  # tokens the scheduler holds: prompt + outputs so far
                st.num_out = len(toks) - st.prompt_len

    def execute_model(self, scheduler_output, non_block: bool = False):
        t_exec = time.monotonic()
        so = scheduler_output
        self._update_states(so)
        if so.total_num_scheduled_tokens == 0:
            if non_block:
                f: Future = Future()
                f.set_result(EMPTY_MODEL_RUNNER_OUTPUT)
                return f
            return EMPTY_MODEL_RUNNER_OUTPUT
        ctok = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        cr = so.scheduled_cached_reqs
        ctok.update(zip(cr.req_ids, cr.num_computed_tokens))
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        chunks: list[tuple[int, int]] = []
        decodes: list[int] = []
        for rid, n in so.num_scheduled_tokens.items():
            st = self.reqs[rid]
            c = ctok[rid]
            known = st.prompt_len + st.num_out
            done = c + n
            if st.num_out > 0 and n == 1 and c == known - 1:
                decodes.append(done)
            else:
                chunks.append((n, c))
            req_ids.append(rid)
            if done >= known:
                idx = done - st.prompt_len
                if idx != st.num_out:
                    raise RuntimeError(
                        f"emulated device out of step with the scheduler for request {rid}: it computes up to "
                        f"position {done} but the device knows {known} tokens (prompt {st.prompt_len})"
                    )
                sampled.append([token_id(st.key, idx, self.vocab_size)])
                st.num_out += 1
            else:
                sampled.append([])  # non-final prefill chunk: the real runner discards its sample
        out = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        batch = EmuBatch(prefill_chunks=tuple(chunks), decode_contexts=tuple(decodes),
                         sampled=sum(1 for x in sampled if x))
        prep_s = self.host_costs.prep_s(len(req_ids), batch.num_tokens)
        if prep_s > 0:  # the model runner's input preparation, on the engine thread
            EmulatedDevice.wait_until(t_exec + prep_s)
        dur = float(self.device_time_fn(batch))
        energy = self._energy_fn(batch) if self._energy_fn is not None else None
        self.seq += 1
        issue = time.monotonic()
        launch_s = self._launch(batch.num_tokens, batch.num_prefills)
        rec = DeviceRecord(seq=self.seq, issue_s=issue, meta=dict(
            iteration=getattr(so, ITERATION_ATTR, None), exec_s=t_exec, prep_s=prep_s, launch_s=launch_s,
            prefill_tokens=batch.prefill_tokens, num_prefills=batch.num_prefills,
            num_decodes=batch.num_decodes, num_reqs=len(req_ids), energy_j=energy,
            num_preempted=len(so.preempted_req_ids or ()), num_resumed=len(so.scheduled_cached_reqs.resumed_req_ids),
            output=out))
        self.pending.append(self.device.submit(dur, out, rec, not_before_s=issue + launch_s))
        if launch_s > 0:  # launch overlaps the device but keeps the engine thread busy
            EmulatedDevice.wait_until(issue + launch_s)
        if non_block:
            f = Future()
            f.set_result(None)
            return f
        return None

    def _on_done(self, rec: DeviceRecord) -> None:
        """Device thread: stamp the output with its device interval and log the batch."""
        out = rec.meta.pop("output")
        setattr(out, DEVICE_ATTR, (rec.device_start_s, rec.device_end_s))
        row = dict(seq=rec.seq, issue_s=rec.issue_s, device_start_s=rec.device_start_s,
                   device_end_s=rec.device_end_s, signal_s=rec.signal_s, modelled_s=rec.modelled_s, **rec.meta)
        with self._log_lock:
            if self._log is not None:
                self._log.write(json.dumps(row) + "\n")

    def sample_tokens(self, grammar_output, non_block: bool = False):
        fut = self.pending.popleft()
        if self.host_costs.sample_launch_s > 0:
            EmulatedDevice.wait_until(time.monotonic() + self.host_costs.sample_launch_s)
        if non_block:
            return fut
        out = fut.result()
        # the runner's bookkeeping after the sampler (GPUModelRunner._bookkeeping_sync), on the engine thread;
        # charged only on the synchronous path (under async scheduling it overlaps the next batch)
        n = len(getattr(out, "req_ids", None) or ())
        book = self.host_costs.bookkeeping_s(n)
        if book > 0:
            EmulatedDevice.wait_until(time.monotonic() + book)
        return out

    def execute_dummy_batch(self) -> None:
        return

    def take_draft_token_ids(self):
        return None


def read_device_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of an ``EmuExecutor`` device log (a missing file gives ``[]``; a torn last line is dropped)."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    break
    except FileNotFoundError:
        return []
    return rows


__all__ = ["EmuExecutor", "EmuSettings", "SETTINGS_KEY", "ITERATION_ATTR", "DEVICE_ATTR", "read_device_log"]
