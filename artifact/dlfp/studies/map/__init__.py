"""The workload map: where each of the paper's claims holds, and what that says about its unstated workload.

For each paper configuration (``grid.MAPS``) the simulator runs the baseline and DLFP arms, paired on seeds
801-803, over a grid of prompt-length scale x request rate x token budget x prompt-length source
(``grid``); each trial is summarised to one row (``run``), the rows are kept resumably on disk (``store``,
``sweep.run_map``), paired into one row per cell (``table``), matched against the paper's absolute anchors
(``inference``) and drawn as heat maps (``figures``). Nothing here changes a device or host constant: only
workload parameters (and the unstated token budget) vary, and every value they point to is an inference.
"""
from __future__ import annotations

from dlfp.studies.map.grid import MAPS, SHIPPED, Cell, MapError, MapSpec, Task, get_map, quick_spec
from dlfp.studies.map.run import TRIAL_COLUMNS, code_fingerprint, summarize_task
from dlfp.studies.map.store import load_rows, read_table, table_path
from dlfp.studies.map.sweep import run_map

__all__ = ["Cell", "MAPS", "MapError", "MapSpec", "SHIPPED", "TRIAL_COLUMNS", "Task", "code_fingerprint", "get_map",
           "load_rows", "quick_spec", "read_table", "run_map", "summarize_task", "table_path"]
