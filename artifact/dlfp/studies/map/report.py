"""The map's outputs from its cached per-trial tables: cell tables, heat maps and the inference tables.

``write_outputs(out, names)`` reads ``<out>/<map>.csv`` for each map (strictly: a table with rows of another
plan or simulator version, or with a missing trial, is refused, never rendered), and writes beside it:

* ``<map>_cells.csv`` / ``.md``: one row per cell (``dlfp.studies.map.table``);
* ``<map>_itl.png``, ``<map>_ttft.png``: heat maps of the paired P99 ITL and P99 TTFT changes;
* with the Qwen3-8B and Qwen3-0.6B TP1 maps: ``inference_anchors``, ``inference_consistency`` (csv only),
  ``inference_intersection`` and ``inference_cross_validation`` (``dlfp.studies.map.inference``).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from dlfp.studies.map.grid import MapError, get_map, quick_spec
from dlfp.studies.map.store import load_rows, table_path

CELL_MD_COLUMNS = ["source", "scale", "rate", "budget", "d_itl_pct", "d_itl_lo", "d_itl_hi", "d_itl_signs",
                   "d_itl_armmean_pct", "d_ttft_pct", "d_e2el_pct", "itl_p99_ms_baseline", "itl_p99_ms_dlfp",
                   "slo_passes_baseline", "slo_passes_dlfp", "stall_frac_baseline", "gap_over_slo_baseline",
                   "gap_over_slo_dlfp", "utilisation"]


def spec_of(name: str, quick: bool = False):
    """The map ``name`` (its smoke-run version with ``quick``)."""
    return quick_spec(get_map(name)) if quick else get_map(name)


def load_complete(out: Path, name: str, quick: bool = False) -> pd.DataFrame:
    """The complete per-trial table of map ``name``.

    Raises:
        MapError: no table, rows that do not belong (another plan or simulator version), or missing trials.
    """
    from dlfp.studies.map.run import code_fingerprint

    spec = spec_of(name, quick)
    path = table_path(out, name)
    if not path.exists():
        raise MapError(f"map {name}: no table {path}; run `dlfp map {name}`")
    rows = load_rows(spec, out, code_fingerprint(), strict=True)
    missing = len(spec.tasks()) - len(rows)
    if missing:
        raise MapError(f"map {name}: {missing} of {len(spec.tasks())} trials missing from {path}; "
                       f"run `dlfp map {name}` to finish it")
    return rows


def write_outputs(out: str | Path, names: list[str], quick: bool = False) -> dict[str, pd.DataFrame]:
    """Write every output of the maps ``names`` (see the module docstring); returns the frames by output name.

    Raises:
        MapError: see ``load_complete``.
    """
    from dlfp.analysis.figures import save
    from dlfp.analysis.markdown import write_table
    from dlfp.pipeline.paths import default_published_csv
    from dlfp.studies.map import figures, inference
    from dlfp.studies.map.table import cell_table

    out = Path(out)
    frames: dict[str, pd.DataFrame] = {}
    for name in names:
        spec = spec_of(name, quick)
        cells = cell_table(load_complete(out, name, quick))
        frames[f"{name}_cells"] = cells
        write_table(cells, out, f"{name}_cells", markdown=cells[CELL_MD_COLUMNS],
                    title=f"Workload map {name}: DLFP against the baseline per cell (simulator)",
                    notes=["changes in percent, (dlfp - baseline) / baseline per seed, mean over seeds "
                           "(negative: DLFP lower); lo/hi: 95 % Student-t interval; signs: per seed",
                           "armmean: change of the arm means over seeds; gap_over_slo: share of inter-token gaps "
                           "above the ITL SLO; utilisation: prefill demand over capacity"])
        for metric, tag in (("d_itl_pct", "itl"), ("d_ttft_pct", "ttft")):
            save(figures.heatmap(cells, spec, metric), out, f"{name}_{tag}", formats=("png",))
    from dlfp.studies.map.claims import claims_table

    claims = claims_table(pd.concat([frames[f"{n}_cells"] for n in names], ignore_index=True))
    frames["map_claims"] = claims
    write_table(claims, out, "map_claims", title="Where each published claim holds on the workload map (simulator)",
                notes=["cells_holding: cells of the map where the claim's direction holds; at_paper_rate: the same at "
                       "the paper's rate, also per prompt-length source; shipped_holds: at the shipped assumption",
                       "statistic paper: mean of per-seed paired P99 changes with its 95 % interval; armmean: change "
                       "of the arm means; tail_share: share of gaps above the ITL SLO (dlfp.studies.map.claims)"])
    if {"qwen3-8b", "qwen3-0.6b-tp1"} <= set(names):
        frames.update(_inference(out, pd.concat([frames["qwen3-8b_cells"], frames["qwen3-0.6b-tp1_cells"]]),
                                 default_published_csv(), write_table, inference))
    return frames


def _inference(out: Path, cells: pd.DataFrame, published: Path, write_table, inference) -> dict[str, pd.DataFrame]:
    anchors = inference.anchors(published)
    cons = inference.consistency(cells, anchors)
    table = inference.anchor_table(cons, anchors)
    names = [a.name for a in anchors]
    groups = {"all anchors": names, "8B anchors": [a.name for a in anchors if a.group == "8b"],
              "0.6B anchors": [a.name for a in anchors if a.group == "0.6b"]}
    inter = pd.concat([inference.intersection(cons, g).assign(anchors=k) for k, g in groups.items()],
                      ignore_index=True)
    summary = pd.DataFrame([{"anchors": k, "consistent_workloads": int((inter["anchors"] == k).sum())}
                            for k in groups])
    cv = inference.cross_validate(cons, anchors)
    note = ("an inference, not a fact: the workload (prompt-length source, scale, token budget) the paper does not "
            "state, read from the simulator's map at the paper's rates; tolerances in dlfp.studies.map.inference")
    write_table(table, out, "inference_anchors", title="Which workloads reproduce each published anchor", notes=[note])
    write_table(cons, out, "inference_consistency")
    write_table(inter if len(inter) else summary, out, "inference_intersection", markdown=summary,
                title="Workloads consistent with every anchor of a set", notes=[note])
    write_table(cv, out, "inference_cross_validation",
                title="Cross-validation: the workload chosen by one model's anchors, the other model predicted",
                notes=[note])
    return {"inference_anchors": table, "inference_consistency": cons, "inference_intersection": inter,
            "inference_summary": summary, "inference_cross_validation": cv}


__all__ = ["CELL_MD_COLUMNS", "load_complete", "write_outputs"]
