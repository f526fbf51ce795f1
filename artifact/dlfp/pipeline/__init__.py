"""Run experiments and render results: the glue behind ``dlfp run``, ``run-all`` and ``figures``.

Data flows one way (see ``dlfp/__init__``): a config and a backend give trials,
trials are written under ``<traces>/<backend>/<experiment>/<arm>/seed-<seed>/``
(``dlfp.traces.format``), and only ``figures.ipynb`` (through ``dlfp.analysis.tables`` and
``dlfp.analysis.figures``) turns saved traces into tables and figures.

Modules, in the order a run uses them:

* ``paths``: the repository root, default trace/result directories, output-directory checks;
* ``plan``: backend choice (``resolve_backend``), config overrides, ``--quick`` and frontier arms,
  the arm/seed plan, worker count, stale/corrupt trial detection, the ``run-all`` matrix;
* ``execute``: ``run_experiment`` (in process or a worker pool) and ``run_all``;
* ``notebooks``: papermill execution of ``experiment.ipynb`` and ``figures.ipynb`` (``render_figures``);
* ``progress``: where progress bars and notes go (not into executed notebooks);
* ``errors``: ``PipelineError``.

Every public name is importable from ``dlfp.pipeline`` itself.
"""
from dlfp.pipeline.errors import PipelineError
from dlfp.pipeline.execute import ExperimentRun, PendingTrial, TrialOutcome, run_all, run_experiment, run_parallel
from dlfp.pipeline.notebooks import execute_experiment_notebook, execute_notebook, render_figures
from dlfp.pipeline.paths import (ROOT_ENV, check_output_dir, default_published_csv, default_results_dir,
                                 default_traces_dir, notebooks_dir, repo_root)
from dlfp.pipeline.plan import (BACKEND_ENV, FRONTIER_PREFIX, JOBS_ENV, QUICK_NUM_REQUESTS, auto_backend,
                                config_mismatch, default_matrix, experiment_backends, frontier_overrides, gpu_present,
                                load_config, parse_overrides, prepare_config, quick_overrides, resolve_backend,
                                select_arms, select_seeds, software_present, trial_state, worker_count)
from dlfp.pipeline.progress import PROGRESS_ENV, progress_file, say

__all__ = ["BACKEND_ENV", "ExperimentRun", "FRONTIER_PREFIX", "JOBS_ENV", "PROGRESS_ENV", "PendingTrial",
           "PipelineError", "QUICK_NUM_REQUESTS", "ROOT_ENV", "TrialOutcome", "auto_backend", "check_output_dir",
           "config_mismatch", "default_matrix", "default_published_csv", "default_results_dir", "default_traces_dir",
           "execute_experiment_notebook", "execute_notebook", "experiment_backends", "frontier_overrides",
           "gpu_present", "load_config", "notebooks_dir", "parse_overrides", "prepare_config", "progress_file",
           "quick_overrides", "render_figures", "repo_root", "resolve_backend", "run_all", "run_experiment",
           "run_parallel", "say", "select_arms", "select_seeds", "software_present", "trial_state", "worker_count"]
