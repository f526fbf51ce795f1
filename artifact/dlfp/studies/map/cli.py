"""``dlfp map``: run (or resume) the workload maps on the simulator, then render them.

    dlfp map                                  # every map, local processes, into data/results/map/
    dlfp map qwen3-0.6b-tp1 --jobs 2          # one map
    dlfp map --executor dask://HOST:8786      # on a Dask cluster
    dlfp map --render-only                    # render from the cached tables (no simulation)
    dlfp map --quick                          # smoke run: a few cells, into data/results-quick/map/

Exit status: 0 done, 2 bad input (one line naming it), 130 interrupted (finished trials are kept; rerun resumes).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from dlfp.studies.map.grid import MAPS, MapError, get_map, quick_spec


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlfp map", description="Run (or resume) the workload maps on the simulator, "
                                "then render them (heat maps, where each claim holds, the anchor inference).")
    p.add_argument("maps", nargs="*", metavar="MAP", help=f"maps to run (default all: {', '.join(MAPS)})")
    p.add_argument("--out", default=None, help="output directory (default data/results/map)")
    p.add_argument("--executor", default="local",
                   help="local (default: spawned processes) or dask://HOST:PORT (a running Dask scheduler)")
    p.add_argument("--jobs", type=int, default=None, help="local worker processes (default $DLFP_JOBS or CPU count)")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 scales x 2 rates x 1 budget x 2 sources, 1 seed")
    p.add_argument("--render-only", action="store_true", help="render from the cached tables; run nothing")
    p.add_argument("--no-render", action="store_true", help="run the sweep only")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main_map(argv: list[str] | None = None) -> int:
    """Entry point of ``dlfp map``; returns the exit status."""
    from dlfp.config import ConfigError
    from dlfp.pipeline.paths import default_results_dir, display_path
    from dlfp.studies.map.sweep import run_map

    args = _parser().parse_args(argv)
    out = Path(args.out) if args.out else default_results_dir(args.quick) / "map"
    try:
        from dlfp.studies.map.run import check_executor, jobs_count

        check_executor(args.executor)
        jobs_count(args.jobs)
        specs = [get_map(n) for n in (args.maps or list(MAPS))]
        if args.quick:
            specs = [quick_spec(s) for s in specs]
        if not args.render_only:
            for s in specs:
                t0 = time.perf_counter()
                df = run_map(s, out, executor=args.executor, jobs=args.jobs, progress=not args.no_progress)
                print(f"map {s.name}: {len(df)} trials in {display_path(out / (s.name + '.csv'))} "
                      f"({time.perf_counter() - t0:.1f} s)")
        if not args.no_render:
            from dlfp.studies.map.render import render_maps

            nb = render_maps(out, [s.name for s in specs], quick=args.quick)
            print(f"map figures and tables: {display_path(nb.parent)} (executed notebook {display_path(nb)})")
    except (MapError, ConfigError) as e:
        print(f"dlfp map: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dlfp map: interrupted; finished trials are kept, run the same command again to resume",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main_map())
