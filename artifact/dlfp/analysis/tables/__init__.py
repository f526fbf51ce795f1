"""Tables from saved traces: what ``figures.ipynb`` shows, as tested functions.

Everything here reads trials written by ``dlfp.traces.format`` and nothing else: no
engine runs, no typed-in numbers (the paper's numbers come only from
``data/paper/published.csv``). Metrics come from ``dlfp.analysis.metrics`` (seconds)
and paired statistics from ``dlfp.analysis.stats``; tables report milliseconds.

Every ``*_change_pct`` column is the change of ``dlfp.analysis.stats`` in
percent: the candidate arm relative to the baseline arm of the same seed,
``(candidate - baseline) / baseline * 100``, NEGATIVE = the candidate is lower
(e.g. P99 ITL -27.7 %), with the paired two-sided 95 % Student-t interval.

Outputs are deterministic: rows sorted (backend, experiment, arm with the
baseline first, seed), floats written with fixed decimals per unit
(``dlfp.analysis.markdown``), so the same traces give byte-identical CSV and
Markdown.

Modules, one per family of tables (all re-exported here):

* ``loading``: ``LoadedTrial``, ``TraceSet``, ``load_traces`` and the per-trial values computed at load time;
* ``trial_frames``: per-trial frames (measured tokens, token agreement, guarded iterations);
* ``summaries``: per-trial summaries, the headline table per seed and over seeds, ``paired``;
* ``published``: ``load_published`` and ``published_vs_reproduced``;
* ``root_cause``: host interval vs device time of guarded iterations;
* ``controller``: cap trajectory, controller summary, absolute per-arm points;
* ``sim_vs_emu``: the simulator against the emulated-device backend;
* ``dlfps``: the DLFP-S target and ablation tables;
* ``fidelity``: the tables of ``dlfp validate-sim``'s output;
* ``checks``: the whole-set checks (every trial loads, no seed missing, paired trials share workload and
  engine settings, seeds with identical workloads) and ``PartialTraceSet``;
* ``problems``: trials that failed to load;
* ``report``: ``write_tables``, every table at once; ``render_tables``, checked first (``allow_partial``
  writes into ``<results>-partial``).
"""
from __future__ import annotations

from dlfp.analysis.markdown import format_frame, to_markdown, write_table
from dlfp.analysis.tables.controller import (ARM_POINT_COLUMNS, DEFAULT_TARGET_S, arm_points, cap_trajectory,
                                             controller_summary, decision_reasons, policy_target_s,
                                             write_arm_points)
from dlfp.analysis.tables.dlfpg import dlfpg_ablation, dlfpg_targets, worst_gap_bound_s, write_dlfpg
from dlfp.analysis.tables.dlfps import (DLFPS_ARM, dlfps_ablation, dlfps_targets, evaluation_frame,
                                        write_dlfps)
from dlfp.analysis.tables.fidelity import FIDELITY_COLUMNS, fidelity_effect, fidelity_errors, write_fidelity
from dlfp.analysis.tables.loading import (FIXED_CAP_PREFIX, PARALLEL_MIN_TRIALS, LoadedTrial, TraceSet, arm_order,
                                          guarded_of, itl_samples, load_traces)
from dlfp.analysis.tables.problems import problems_frame, write_problems
from dlfp.analysis.tables.published import (BY_CONSTRUCTION, PUBLISHED_COLUMNS, PUBLISHED_METRICS, PVR_COLUMNS,
                                            empty_pvr, load_published, published_vs_reproduced, pvr_markdown_frame,
                                            write_published_vs_reproduced)
from dlfp.analysis.tables.checks import IDENTICAL_WORKLOADS, PartialTraceSet, trace_set_problems
from dlfp.analysis.tables.report import (PARTIAL_SUFFIX, TABLE_NAMES, check_traces, partial_results_dir,
                                         render_tables, write_tables)
from dlfp.analysis.tables.root_cause import ROOT_CAUSE_COLUMNS, root_cause, write_root_cause
from dlfp.analysis.tables.sim_vs_emu import (SIM_EMU_ITL_TOL, SIM_VS_EMU_COLUMNS, sim_vs_emu,
                                             sim_vs_emu_markdown_frame, write_sim_vs_emu)
from dlfp.analysis.tables.summaries import (CHANGE_METRICS, change_pct, headline, headline_markdown_frame,
                                            headline_per_seed, paired, trial_summaries, write_headline)
from dlfp.analysis.tables.torch_gpu import write_torch_gpu
from dlfp.analysis.tables.trial_frames import guarded_iterations, measured_token_ids, token_agreement

__all__ = [
    "BY_CONSTRUCTION", "IDENTICAL_WORKLOADS", "PARTIAL_SUFFIX", "PartialTraceSet", "check_traces",
    "partial_results_dir", "render_tables", "trace_set_problems",
    "ARM_POINT_COLUMNS", "CHANGE_METRICS", "DEFAULT_TARGET_S", "DLFPS_ARM", "FIDELITY_COLUMNS", "FIXED_CAP_PREFIX",
    "PARALLEL_MIN_TRIALS", "PUBLISHED_COLUMNS", "PUBLISHED_METRICS", "PVR_COLUMNS", "ROOT_CAUSE_COLUMNS",
    "SIM_EMU_ITL_TOL", "SIM_VS_EMU_COLUMNS", "TABLE_NAMES", "LoadedTrial", "TraceSet", "arm_order", "arm_points",
    "cap_trajectory", "change_pct", "controller_summary", "decision_reasons", "dlfpg_ablation", "dlfpg_targets",
    "dlfps_ablation", "dlfps_targets", "empty_pvr",
    "evaluation_frame", "fidelity_effect", "fidelity_errors", "format_frame", "guarded_iterations", "guarded_of",
    "headline", "headline_markdown_frame", "headline_per_seed", "itl_samples", "load_published", "load_traces",
    "measured_token_ids", "paired", "policy_target_s", "problems_frame", "published_vs_reproduced",
    "pvr_markdown_frame", "root_cause", "sim_vs_emu", "sim_vs_emu_markdown_frame", "to_markdown", "token_agreement",
    "trial_summaries", "worst_gap_bound_s", "write_arm_points", "write_dlfpg",
    "write_dlfps", "write_fidelity", "write_headline", "write_problems",
    "write_published_vs_reproduced", "write_root_cause", "write_sim_vs_emu", "write_table", "write_tables",
    "write_torch_gpu",
]
