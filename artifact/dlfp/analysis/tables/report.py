"""Every table ``figures.ipynb`` writes, by the same functions, without figures."""
from __future__ import annotations

from pathlib import Path

from dlfp.analysis.tables.controller import write_arm_points
from dlfp.analysis.tables.dlfpg import write_dlfpg
from dlfp.analysis.tables.dlfps import write_dlfps
from dlfp.analysis.tables.fidelity import write_fidelity
from dlfp.analysis.tables.loading import TraceSet, load_traces
from dlfp.analysis.tables.problems import write_problems
from dlfp.analysis.tables.published import write_published_vs_reproduced
from dlfp.analysis.tables.root_cause import write_root_cause
from dlfp.analysis.tables.sim_vs_emu import write_sim_vs_emu
from dlfp.analysis.tables.summaries import write_headline
from dlfp.analysis.tables.torch_gpu import write_torch_gpu

#: Tables ``write_tables`` always writes, in order (``<name>.csv`` and ``<name>.md`` each).
TABLE_NAMES = ["problems", "headline_per_seed", "headline", "published_vs_reproduced", "root_cause", "arm_points",
               "sim_vs_emu", "dlfps_targets", "dlfps_ablation", "dlfpg_targets", "dlfpg_frontier", "dlfpg_ablation",
               "torch_gpu_device_model", "torch_gpu_step_costs", "torch_gpu_decoupling", "torch_gpu_effects",
               "torch_gpu_anchors"]
#: Where ``dlfp dlfpg-dev`` leaves DLFP-G's development-set runs, under the results folder.
DLFPG_DEV_CSV = Path("dlfpg") / "dev.csv"


def write_tables(ts: TraceSet, results_dir: str | Path, published_csv: str | Path,
                 fidelity_dir: str | Path | None = None, dlfpg_dev: str | Path | None = None) -> list[str]:
    """Write every table of ``figures.ipynb`` into ``results_dir`` (for the byte-for-byte regression test).

    ``fidelity_dir`` defaults to ``<results_dir>/fidelity``; the fidelity
    tables are written only when ``dlfp validate-sim`` left its output there;
    ``dlfpg_dev`` (default ``<results_dir>/DLFPG_DEV_CSV``) likewise for
    ``dlfpg_dev``. Returns the names of the tables written (``TABLE_NAMES``,
    then ``fidelity_errors``/``fidelity_effect``/``dlfpg_dev`` where written).
    """
    results_dir = Path(results_dir)
    write_problems(ts, results_dir)
    write_headline(ts, results_dir)
    write_published_vs_reproduced(ts, results_dir, published_csv)
    write_root_cause(ts, results_dir)
    write_arm_points(ts, results_dir)
    write_sim_vs_emu(ts, results_dir)
    write_dlfps(ts, results_dir)
    dev = Path(dlfpg_dev) if dlfpg_dev is not None else results_dir / DLFPG_DEV_CSV
    write_dlfpg(ts, results_dir, dev)
    write_torch_gpu(ts, results_dir)
    err, eff = write_fidelity(fidelity_dir if fidelity_dir is not None else results_dir / "fidelity", results_dir)
    return (list(TABLE_NAMES) + (["fidelity_errors"] if err is not None else [])
            + (["fidelity_effect"] if eff is not None else []) + (["dlfpg_dev"] if dev.exists() else []))


#: Suffix of the folder a partial render writes into, beside the results folder it would otherwise replace.
PARTIAL_SUFFIX = "-partial"


def partial_results_dir(results_dir: str | Path) -> Path:
    """Where a partial render goes: ``<results_dir>-partial`` (never the results folder itself)."""
    p = Path(results_dir)
    return p.with_name(p.name + PARTIAL_SUFFIX)


def check_traces(traces_dir: str | Path) -> TraceSet:
    """Load the trace set for a render and check it whole, before anything is written; returns it.

    Raises:
        PartialTraceSet: a trial that is corrupt, partial or missing, or a mismatched pair (one line naming it).
        FileNotFoundError: ``traces_dir`` is not a directory.
    """
    return load_traces(traces_dir)


def render_tables(traces_dir: str | Path, results_dir: str | Path, published_csv: str | Path, *,
                  allow_partial: bool = False, fidelity_dir: str | Path | None = None) -> tuple[Path, list[str]]:
    """Check the trace set, then write every table; returns ``(folder written, table names)``.

    By default the whole set is checked first (``check_traces``) and a problem
    raises before any file is written. ``allow_partial=True`` renders what
    loads into ``partial_results_dir(results_dir)`` instead, rows of affected
    experiments marked "incomplete" and no claim marked as agreeing.
    ``fidelity_dir`` defaults to ``<results_dir>/fidelity``.

    Raises:
        PartialTraceSet: see ``check_traces`` (not with ``allow_partial``).
    """
    ts = load_traces(traces_dir, allow_partial=allow_partial)
    out = partial_results_dir(results_dir) if allow_partial else Path(results_dir)
    fid = Path(fidelity_dir) if fidelity_dir is not None else Path(results_dir) / "fidelity"
    return out, write_tables(ts, out, published_csv, fidelity_dir=fid, dlfpg_dev=Path(results_dir) / DLFPG_DEV_CSV)


__all__ = ["DLFPG_DEV_CSV", "PARTIAL_SUFFIX", "TABLE_NAMES", "check_traces", "partial_results_dir", "render_tables",
           "write_tables"]
