"""Run experiments and render results: the glue behind ``dlfp run``, ``run-all`` and ``figures``.

Data flows one way (see ``dlfp/__init__``): a config and a backend give trials,
trials are written under ``<traces>/<backend>/<experiment>/<arm>/seed-<seed>/``
(``dlfp.traces.format``), and only ``figures.ipynb`` (through ``dlfp.analysis.tables`` and
``dlfp.analysis.figures``) turns saved traces into tables and figures.

Modules, in the order a run uses them:

* ``paths``: the repository root, default trace/result directories, output-directory checks, display paths;
* ``plan``: backend choice (``resolve_backend``), config overrides (and the derived experiment id of a run
  with overrides), ``--quick`` and frontier arms, the engine-side config check, the arm/seed plan, worker
  count, stale/corrupt trial detection, the ``run-all`` matrix;
* ``execute``: ``run_experiment`` (in process or a worker pool) and ``run_all``;
* ``pool``: worker processes that end with their parent and whose death names the trial;
* ``verify``: ``run-all`` on the simulator reruns every trial and compares it with the shipped one;
* ``verified``: this machine's record of the trials this code already reran and found identical (not rerun
  again; kept in ``.cache/``, never committed);
* ``provenance``: the committed record of which code wrote each shipped simulator trial;
* ``notebooks``: papermill execution of ``experiment.ipynb`` and ``figures.ipynb`` (``render_figures``),
  reproducible executed copies, and the parameter check the notebooks call;
* ``stamps``: content fingerprints of what rendered each executed notebook (a fresh one is not executed again);
* ``interrupts``: Ctrl-C and SIGTERM as one line, temporaries removed, exit status 130/143;
* ``progress``: where progress bars and notes go (not into executed notebooks);
* ``errors``: ``PipelineError``.

Every public name is importable from ``dlfp.pipeline`` itself.
"""
from dlfp.pipeline.errors import PipelineError
from dlfp.pipeline.execute import ExperimentRun, PendingTrial, TrialOutcome, run_all, run_experiment, run_parallel
from dlfp.pipeline.interrupts import TALLY, Terminated
from dlfp.pipeline.notebooks import (NotebookParameterError, Rendered, check_parameters, execute_experiment_notebook,
                                     execute_experiment_notebook_checked, execute_notebook, render_figures,
                                     render_figures_checked)
from dlfp.pipeline.paths import (ROOT_ENV, check_output_dir, default_published_csv, default_results_dir,
                                 default_traces_dir, display_path, notebooks_dir, repo_root)
from dlfp.pipeline.plan import (BACKEND_ENV, FRONTIER_PREFIX, JOBS_ENV, QUICK_NUM_REQUESTS, auto_backend,
                                check_backend_config, config_mismatch, default_matrix, derived_experiment,
                                experiment_backends, frontier_overrides, gpu_present, load_config, parse_overrides,
                                prepare_config, quick_overrides, resolve_backend, select_arms, select_seeds,
                                software_present, trial_state, worker_count)
from dlfp.pipeline.pool import run_pool
from dlfp.pipeline.progress import PROGRESS_ENV, progress_file, say
from dlfp.pipeline.verify import Verification, verify_trials

__all__ = ["BACKEND_ENV", "ExperimentRun", "FRONTIER_PREFIX", "JOBS_ENV", "NotebookParameterError", "PROGRESS_ENV",
           "PendingTrial", "PipelineError", "QUICK_NUM_REQUESTS", "ROOT_ENV", "Rendered", "TALLY", "Terminated",
           "TrialOutcome",
           "Verification", "auto_backend", "check_backend_config", "check_output_dir", "check_parameters",
           "config_mismatch", "default_matrix", "default_published_csv", "default_results_dir", "default_traces_dir",
           "derived_experiment", "display_path", "execute_experiment_notebook", "execute_experiment_notebook_checked",
           "execute_notebook",
           "experiment_backends", "frontier_overrides", "gpu_present", "load_config", "notebooks_dir",
           "parse_overrides", "prepare_config", "progress_file", "quick_overrides", "render_figures",
           "render_figures_checked", "repo_root",
           "resolve_backend", "run_all", "run_experiment", "run_parallel", "run_pool", "say", "select_arms",
           "select_seeds", "software_present", "trial_state", "verify_trials", "worker_count"]
