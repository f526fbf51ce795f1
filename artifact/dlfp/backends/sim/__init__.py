"""Discrete-event simulator of a vLLM 0.17.1 V1 serving engine (host and device timelines).

* ``dlfp.backends.sim.scheduler``: the V1 scheduler (token budget, max_num_seqs, KV blocks, preemption, DLFP hook).
* ``dlfp.backends.sim.engine``: the sync (``EngineCore.step``) and async (``step_with_batch_queue``) loops.
* ``dlfp.devices.host``: named host-cost parameters.
The device cost model is ``dlfp.devices.roofline``.
"""
from dlfp.backends.sim.engine import SimEngine, SimResult
from dlfp.devices.host import HostCosts
from dlfp.backends.sim.scheduler import Scheduler, SimRequest

__all__ = ["HostCosts", "Scheduler", "SimEngine", "SimRequest", "SimResult"]
