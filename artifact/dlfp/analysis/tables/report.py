"""Every table ``figures.ipynb`` writes, by the same functions, without figures."""
from __future__ import annotations

from pathlib import Path

from dlfp.analysis.tables.controller import write_arm_points
from dlfp.analysis.tables.dlfps import write_dlfps
from dlfp.analysis.tables.fidelity import write_fidelity
from dlfp.analysis.tables.loading import TraceSet
from dlfp.analysis.tables.problems import write_problems
from dlfp.analysis.tables.published import write_published_vs_reproduced
from dlfp.analysis.tables.root_cause import write_root_cause
from dlfp.analysis.tables.sim_vs_emu import write_sim_vs_emu
from dlfp.analysis.tables.summaries import write_headline

#: Tables ``write_tables`` always writes, in order (``<name>.csv`` and ``<name>.md`` each).
TABLE_NAMES = ["problems", "headline_per_seed", "headline", "published_vs_reproduced", "root_cause", "arm_points",
               "sim_vs_emu", "dlfps_targets", "dlfps_ablation"]


def write_tables(ts: TraceSet, results_dir: str | Path, published_csv: str | Path,
                 fidelity_dir: str | Path | None = None) -> list[str]:
    """Write every table of ``figures.ipynb`` into ``results_dir`` (for the byte-for-byte regression test).

    ``fidelity_dir`` defaults to ``<results_dir>/fidelity``; the fidelity
    tables are written only when ``dlfp validate-sim`` left its output there.
    Returns the names of the tables written (``TABLE_NAMES``, then
    ``fidelity_errors``/``fidelity_effect`` where written).
    """
    results_dir = Path(results_dir)
    write_problems(ts, results_dir)
    write_headline(ts, results_dir)
    write_published_vs_reproduced(ts, results_dir, published_csv)
    write_root_cause(ts, results_dir)
    write_arm_points(ts, results_dir)
    write_sim_vs_emu(ts, results_dir)
    write_dlfps(ts, results_dir)
    err, eff = write_fidelity(fidelity_dir if fidelity_dir is not None else results_dir / "fidelity", results_dir)
    return (list(TABLE_NAMES) + (["fidelity_errors"] if err is not None else [])
            + (["fidelity_effect"] if eff is not None else []))


__all__ = ["TABLE_NAMES", "write_tables"]
