"""The ``dlfp`` command line.

Usage::

    dlfp list
    dlfp run EXPERIMENT [--backend B] [--seeds S ...] [--arms A ...] [--out DIR] [--force] [--quick]
                        [--set KEY=VALUE ...] [--frontier | --no-frontier] [--no-progress]
    dlfp run-all [--backend B] [--experiments E ...] [--seeds S ...] [--force] [--quick] [--traces DIR]
                 [--results DIR] [--set KEY=VALUE ...] [--frontier | --no-frontier] [--no-figures]
    dlfp figures [--traces DIR] [--out DIR] [--published CSV] [--allow-partial] [--force]
    dlfp map [MAP ...] [--executor local|dask://HOST:PORT] [--render-only] ...   (`dlfp map -h`)
    dlfp calibrate ...      (dlfp.studies.calibration.main_calibrate; `dlfp calibrate -h`)
    dlfp validate-sim ...   (dlfp.studies.validation.main_validate; `dlfp validate-sim -h`)
    dlfp audit ...          (dlfp.studies.audit.main_audit; `dlfp audit -h`)
    dlfp sensitivity [--experiments E ...] [--out DIR] [--seeds S ...] [--arms A ...] [--host-scales K ...]
                     [--no-measured] [--jobs N] [--set KEY=VALUE ...]

``--backend`` is ``auto`` (default; also ``$DLFP_BACKEND``), ``sim``, ``emu`` or
``vllm``: ``auto`` picks ``vllm`` when a GPU and vLLM are present, else ``sim``.
Bad input (an unknown experiment, backend or override; a missing traces
directory) prints one line naming it and exits with status 2.

Subcommands live in a registry: a new one is a function decorated with
``@command(name, help)`` that receives the subparser to configure and returns
the handler ``handler(args) -> int``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

Handler = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], Handler]]] = {}
EXIT_BAD_INPUT = 2


def command(name: str, help: str):
    """Register a subcommand: the decorated function configures its parser and returns its handler."""
    def deco(fn: Callable[[argparse.ArgumentParser], Handler]):
        _COMMANDS[name] = (help, fn)
        return fn
    return deco


def _err(msg: str) -> None:
    print(f"dlfp: error: {msg}", file=sys.stderr)


# --------------------------------------------------------------------------- list


@command("list", "list the shipped experiments and the backends")
def _list(p: argparse.ArgumentParser) -> Handler:
    def run(args: argparse.Namespace) -> int:
        from dlfp.backends import REGISTRY
        from dlfp.config import ConfigError, list_experiments, load_experiment

        names = list_experiments()
        if not names:
            print("(no experiments shipped)")
        for n in names:
            try:
                c = load_experiment(n)
                only = [t for t in c.tags if t.startswith("backend:") or t.endswith("-only")]
                rate = f"{c.workload.rate:g}/s" if c.workload.uses_rate() else c.workload.kind
                if c.workload.concurrency is not None:
                    rate += f" concurrency={c.workload.concurrency}"
                print(f"{n:34s} {c.model:12s} {c.gpu:18s} tp={c.tp} {c.scheduling:5s} "
                      f"rate={rate} n={c.workload.num_requests} arms={','.join(c.arms)} "
                      f"seeds={','.join(map(str, c.seeds))}{'  ' + ' '.join(only) if only else ''}")
            except ConfigError as e:
                print(f"{n:34s} INVALID: {e}")
        print("\nbackends (--backend):")
        for b in REGISTRY.values():
            print(f"  {b.name:6s} {b.description}")
        return 0
    return run


# --------------------------------------------------------------------------- run


def seed_arg(text: str) -> int:
    """argparse type of a seed: a non-negative integer (numpy's ``SeedSequence`` rejects negative ones)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed {text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"seed {v} is negative (seeds are non-negative integers)")
    return v


def _backend_arg(p: argparse.ArgumentParser) -> None:
    from dlfp.backends import BACKENDS

    p.add_argument("--backend", default=None,
                   help=f"auto (default; $DLFP_BACKEND overrides), {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]} "
                        "(see `dlfp list`)")


def _frontier_arg(p: argparse.ArgumentParser) -> None:
    from dlfp.backends import REGISTRY

    cheap = " and ".join(b.name for b in REGISTRY.values() if b.frontier_by_default)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--frontier", dest="frontier", action="store_true", default=None,
                   help="also run the fixed-cap arms fixed-<cap> of backend_options.frontier_caps "
                        f"(default: on for the {cheap} backend only)")
    g.add_argument("--no-frontier", dest="frontier", action="store_false", help="skip the fixed-cap arms")


@command("run", "run one experiment (all arms x seeds) directly, resuming completed trials")
def _run(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("experiment", help="experiment name (see `dlfp list`)")
    _backend_arg(p)
    p.add_argument("--seeds", type=seed_arg, nargs="+", default=None, help="subset of seeds (default: the config's)")
    p.add_argument("--arms", nargs="+", default=None, help="subset of arms (default: all)")
    p.add_argument("--out", default=None, help="traces root (default data/traces; data/traces-quick with --quick)")
    p.add_argument("--force", action="store_true", help="re-run trials that are already complete on disk")
    p.add_argument("--quick", action="store_true", help="smoke run: at most 20 measured requests per trial")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. --set workload.num_requests=5 (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _frontier_arg(p)

    def run(args: argparse.Namespace) -> int:
        from dlfp import pipeline

        res = pipeline.run_experiment(args.experiment, backend=args.backend, seeds=args.seeds, arms=args.arms,
                                      out_dir=args.out, overrides=pipeline.parse_overrides(args.overrides),
                                      force=args.force, quick=args.quick, frontier=args.frontier,
                                      progress=not args.no_progress)
        df = res.frame()
        counts = df["status"].value_counts().to_dict()
        print(f"{res.config.name} on {res.backend}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        print(f"traces: {pipeline.display_path(res.traces_dir / res.backend / res.config.name)}")
        return 0
    return run


@command("run-all", "run the experiment matrix through papermill, then render the figures")
def _run_all(p: argparse.ArgumentParser) -> Handler:
    _backend_arg(p)
    p.add_argument("--experiments", nargs="+", default=None, help="subset (default: every experiment for the backend)")
    p.add_argument("--seeds", type=seed_arg, nargs="+", default=None,
                   help="subset of seeds (default: each config's)")
    p.add_argument("--force", action="store_true",
                   help="re-run trials that are already complete on disk (on the simulator: also those verified "
                        "before) and execute every notebook even when its outputs are fresh")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: at most 20 measured requests per trial, into data/traces-quick and "
                        "data/results-quick")
    p.add_argument("--traces", default=None, help="traces root (default data/traces)")
    p.add_argument("--results", default=None, help="results directory (default data/results)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every experiment (repeatable)")
    p.add_argument("--no-figures", action="store_true", help="skip figures.ipynb at the end")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _frontier_arg(p)

    def run(args: argparse.Namespace) -> int:
        import os

        from dlfp import pipeline

        if args.no_progress:
            os.environ[pipeline.progress.NO_PROGRESS_ENV] = "1"  # also in the notebook kernels
        res = pipeline.run_all(backend=args.backend, experiments=args.experiments, force=args.force,
                               quick=args.quick, traces_dir=args.traces, results_dir=args.results, seeds=args.seeds,
                               overrides=pipeline.parse_overrides(args.overrides), figures=not args.no_figures,
                               frontier=args.frontier)
        print(run_all_summary(res))
        return 0
    return run


def run_all_summary(res: dict) -> str:
    """The one line ``dlfp run-all`` ends with: what ran, what was kept, where the results are, how long."""
    from dlfp import pipeline

    n = len(res["notebooks"])
    v = res.get("verification")
    if v is not None:
        parts = [f"{v.fresh} trials fresh (verified by this code on this machine, not rerun)"] if v.fresh else []
        if v.total or not v.fresh:
            rerun = f"{v.total} trials rerun, {v.identical} identical to the shipped traces, {len(v.replaced)} replaced"
            parts.append(rerun + (f", {v.added} added (were missing)" if v.added else ""))
        did = ", ".join(parts)
    else:
        did = f"{res['trials']} trials, {res['cached']} of them cached and kept (--force reruns them)"
    fresh = res.get("notebooks_fresh", 0)
    if fresh:
        did += f"; {fresh} of {n} experiment notebook(s) fresh, not re-executed"
    if res["figures_notebook"] is None:
        where = f"traces in {pipeline.display_path(res['traces_dir'])} (figures skipped)"
    else:
        where = (f"results in {pipeline.display_path(res['results_dir'])}"
                 + (" (fresh, not re-rendered)" if res.get("figures_fresh") else ""))
    return f"run-all on {res['backend']}: {n} experiment(s), {did}; {where}; {res['seconds']:.1f} s"


@command("figures", "render every table and figure from cached traces (no engine runs)")
def _figures(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("--traces", default=None, help="traces root (default data/traces)")
    p.add_argument("--out", default=None, help="results directory (default data/results)")
    p.add_argument("--published", default=None, help="published numbers CSV (default data/paper/published.csv)")
    p.add_argument("--allow-partial", action="store_true",
                   help="render what loads into <out>-partial: rows of affected experiments marked incomplete, "
                        "no claim judged (default: a corrupt, partial or mispaired trace set stops the render)")
    p.add_argument("--force", action="store_true",
                   help="render even when the outputs are fresh (same traces, notebook, inputs and code as the "
                        "stamp of their render)")

    def run(args: argparse.Namespace) -> int:
        import time

        from dlfp import pipeline

        t0 = time.perf_counter()
        r = pipeline.render_figures_checked(args.traces, args.out, args.published, allow_partial=args.allow_partial,
                                            force=args.force)
        how = ("fresh: rendered by this code from these traces and inputs, not re-rendered; --force re-renders"
               if r.fresh else f"executed notebook: {pipeline.display_path(r.path)}")
        print(f"tables and figures: {pipeline.display_path(r.path.parent)}  ({how}; "
              f"{time.perf_counter() - t0:.1f} s)")
        return 0
    return run


# --------------------------------------------------------------------------- sensitivity


@command("sensitivity", "sweep the unstated choices (backend_options.sensitivity) and host costs on the simulator")
def _sensitivity(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("--experiments", nargs="+", default=None,
                   help="subset (default: every experiment with backend_options.sensitivity)")
    p.add_argument("--out", default=None, help="output directory (default data/results/sensitivity)")
    p.add_argument("--seeds", type=seed_arg, nargs="+", default=None, help="seeds (default 801 802 803)")
    p.add_argument("--arms", nargs="+", default=None, help="candidate arms compared with the baseline "
                                                             "(default dlfp dlfps, where the config has them)")
    p.add_argument("--host-scales", type=float, nargs="+", default=None, help="host-cost scales (default 1 3 10)")
    p.add_argument("--no-measured", action="store_true", help="skip the measured-on-this-CPU host costs")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default $DLFP_JOBS or the CPU count)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override applied to every experiment before its variants (repeatable)")

    def run(args: argparse.Namespace) -> int:
        import shlex

        from dlfp import pipeline

        from dlfp.studies import sensitivity as sens

        out = args.out or str(pipeline.default_results_dir() / "sensitivity")
        cmd = "dlfp sensitivity" + "".join(
            f" {flag} " + " ".join(shlex.quote(str(x)) for x in vals)
            for flag, vals in (("--experiments", args.experiments), ("--seeds", args.seeds), ("--arms", args.arms),
                               ("--host-scales", args.host_scales)) if vals)
        cmd += " --no-measured" * args.no_measured + "".join(f" --set {shlex.quote(o)}" for o in args.overrides)
        try:
            res = sens.run_sweep(args.experiments, out_dir=out, seeds=args.seeds or sens.DEFAULT_SEEDS,
                                 candidate_arms=args.arms or sens.CANDIDATE_ARMS,
                                 host_scales=args.host_scales or sens.HOST_SCALES, measured=not args.no_measured,
                                 overrides=pipeline.parse_overrides(args.overrides), jobs=args.jobs, command=cmd,
                                 progress=lambda d, n: print(f"\rsensitivity: {d}/{n} runs", end="",
                                                             file=sys.stderr, flush=True))
        except sens.SensitivityError as e:
            _err(str(e))
            return EXIT_BAD_INPUT
        print(file=sys.stderr)
        plan = res["plan"]
        print(f"sensitivity: {len(plan.variants)} variants, {plan.num_cells} cells, {plan.num_trials} distinct sim "
              f"runs in {res['seconds']:.1f} s (wall)")
        for k, path in res["paths"].items():
            print(f"{k}: {path}")
        return 0
    return run


# --------------------------------------------------------------------------- delegated commands


_DELEGATED: dict[str, tuple[str, str]] = {}


def _delegate(name: str, help_: str, module: str, func: str) -> None:
    """Register ``dlfp <name> ...`` as a pass-through to ``dlfp.<module>.<func>(argv) -> int``.

    That function parses its own arguments (``dlfp <name> -h`` shows them).
    """
    _DELEGATED[name] = (module, func)

    @command(name, help_ + f" (options: `dlfp {name} -h`)")
    def _configure(p: argparse.ArgumentParser) -> Handler:
        return lambda args: _run_delegated(name, [])


def _run_delegated(name: str, argv: list[str]) -> int:
    import importlib

    module, func = _DELEGATED[name]
    try:
        fn = getattr(importlib.import_module(f"dlfp.{module}"), func)
    except (ImportError, AttributeError) as e:
        _err(f"`dlfp {name}` is not available in this checkout ({e})")
        return EXIT_BAD_INPUT
    return int(fn(argv) or 0)


_delegate("calibrate", "fit the CPU hardware profile from a profiling run of the real engine",
          "studies.calibration", "main_calibrate")
_delegate("validate-sim", "compare the simulator with real-engine traces and report its error",
          "studies.validation", "main_validate")
_delegate("audit", "the simulator against the real engine, all measured on this host: calibrate, run the real "
          "trials and replicates that this host lacks, audit (about 1 h on 2 cores)", "studies.audit", "main_audit")
_delegate("map", "sweep prompt scale x rate x token budget x prompt source per paper configuration on the simulator "
          "and render where each claim holds", "studies.map.cli", "main_map")
_delegate("dlfpg-dev", "rerun DLFP-G's development set (seeds 901-903, where its constants were chosen) on the "
          "simulator", "studies.controller_dev", "main_dev")
_delegate("frontend", "measure the API server of vllm serve on this CPU (both endpoints) and fit its per-request "
          "and per-token costs (about 3 min)", "studies.frontend.cli", "main_frontend")
_delegate("export", "export a trial as JSON in another tool's format (vllm bench serve --save-result)",
          "analysis.export", "main_export")


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="dlfp", description="DLFP reproduction artifact")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (help_, configure) in _COMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(_handler=configure(sp))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dlfp`` console script; returns the exit status (2 for bad input)."""
    from dlfp.config import ConfigError
    from dlfp.pipeline import PipelineError, interrupts
    from dlfp.backends import BackendUnavailable
    from dlfp.traces.format import NO_SPACE_ERRNOS, TraceError, no_space_message
    from dlfp.workload.generator import WorkloadError

    if argv is None:  # the console script: SIGTERM like Ctrl-C, kernels stopped at once (dlfp.pipeline.interrupts)
        interrupts.install()
    interrupts.TALLY.__init__()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        if argv and argv[0] in _DELEGATED:
            return _run_delegated(argv[0], argv[1:])
        args = parser.parse_args(argv)
        interrupts.TALLY.forced = bool(getattr(args, "force", False))
        return int(args._handler(args) or 0)
    except (ConfigError, PipelineError, BackendUnavailable, TraceError, WorkloadError, FileNotFoundError,
            IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError) as e:
        _err(str(e).splitlines()[0] if str(e) else type(e).__name__)
        return EXIT_BAD_INPUT
    except OSError as e:
        if e.errno not in NO_SPACE_ERRNOS:
            raise
        where = Path(e.filename).parent if e.filename else Path.cwd()
        _err(no_space_message(e.filename or "a file", where))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (``interrupts.Terminated``)
        signum = interrupts.signal_of(e)
        print(interrupts.TALLY.message(signum), file=sys.stderr)
        return interrupts.EXIT_STATUS[signum]
    except BrokenPipeError:  # e.g. `dlfp list | head -2`: the reader left, nothing to report
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
