"""Discrete-event simulator of a vLLM 0.17.1 V1 serving engine (host and device timelines).

* ``dlfp.sim.scheduler``: the V1 scheduler (token budget, max_num_seqs, KV blocks, preemption, DLFP hook).
* ``dlfp.sim.engine``: the sync (``EngineCore.step``) and async (``step_with_batch_queue``) loops.
* ``dlfp.sim.host``: named host-cost parameters.
The device cost model is ``dlfp.cost_model``.
"""
from .engine import SimEngine, SimResult
from .host import HostCosts
from .scheduler import Scheduler, SimRequest

__all__ = ["HostCosts", "Scheduler", "SimEngine", "SimRequest", "SimResult"]
