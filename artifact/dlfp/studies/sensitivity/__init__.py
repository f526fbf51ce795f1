"""Sensitivity sweep over the choices the paper leaves unstated, on the simulator.

For each experiment, every alternative value listed in its
``backend_options.sensitivity`` (keyed by a dotted config field, e.g.
``max_num_batched_tokens: [2048, 8192]``, ``workload.num_warmup: [0, 5, 20]``,
``slo: [{...}, ...]``, ``workload.rate: [...]``) plus one host-cost dimension
(field ``host_costs``: the experiment's effective ``HostCosts`` scaled x1 = the
default, x3 and x10, and ``measured``: the host costs that ``dlfp calibrate``
measured for vLLM's real Python engine loop on this CPU, from
``hardware/cpu-calibrated.yaml``) is run as a variant of the config. Each
variant runs the baseline arm and the candidate arms (``dlfp`` and, where the
config has it, ``dlfps``) paired on the same seeds (801-803 by default) with
``dlfp.backends.run_trial(..., backend="sim")`` in parallel processes.

No trace is written: the sweep keeps only per-trial summaries, and its outputs
(``sensitivity.csv``, ``sensitivity.md``, ``sensitivity_trials.csv``) are
reproducible by re-running ``dlfp sensitivity`` (the simulator is
deterministic per (config, arm, seed)), which keeps the repository under its
size budget.

Changes are ``dlfp.analysis.stats.paired_change`` in percent, ``100 * (arm -
baseline) / baseline`` per seed (NEGATIVE = the arm lowers the metric), with
its two-sided 95 % Student-t interval over seeds.

Identical runs are shared: variants whose config equals another's (a listed
value equal to the default, or an SLO variant, which changes only the metric,
not the run) reuse its trials; an arm whose ``options.ttft_slo_s`` equals the
experiment's SLO TTFT limit (DLFP-S, whose guard is the SLO) follows the SLO
variant and is re-run.

Modules: ``plan`` (variants and distinct runs), ``run`` (simulator runs and
their summaries), ``table`` (the table, its Markdown and the output files),
``sweep`` (``run_sweep``: all of it).
"""
from __future__ import annotations

from dlfp.studies.sensitivity.plan import (CANDIDATE_ARMS, DEFAULT_SEEDS, HOST_FIELD, HOST_SCALES, MEASURED_PROFILE,
                                           SensitivityError, SweepPlan, TrialTask, Variant, build_plan,
                                           default_experiments, effective_host_costs, measured_host_costs,
                                           scaled_host_costs, variants_for)
from dlfp.studies.sensitivity.run import STALL_FACTOR, TRIAL_COLUMNS, run_plan, trial_summaries
from dlfp.studies.sensitivity.sweep import run_sweep
from dlfp.studies.sensitivity.table import (TABLE_COLUMNS, UNCHANGED_PCT, build_table, flips, paper_directions,
                                            stall_sign_table, sweep_markdown, write_outputs)

__all__ = ["CANDIDATE_ARMS", "DEFAULT_SEEDS", "HOST_FIELD", "HOST_SCALES", "MEASURED_PROFILE", "STALL_FACTOR",
           "SensitivityError", "SweepPlan", "TABLE_COLUMNS", "TRIAL_COLUMNS", "TrialTask", "UNCHANGED_PCT", "Variant",
           "build_plan", "build_table", "default_experiments", "effective_host_costs", "flips",
           "measured_host_costs", "paper_directions", "run_plan", "run_sweep", "scaled_host_costs",
           "stall_sign_table", "sweep_markdown", "trial_summaries", "variants_for", "write_outputs"]
