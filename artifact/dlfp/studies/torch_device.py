"""The GPU run of the torch backend: one command for a lent machine, rehearsed on the CPU with ``--tiny``.

``python -m dlfp.studies.torch_device --out DIR [--tiny] [--budget-s S]`` (what ``benchmarks/gpu/run_device.sh``
calls) writes into ``DIR``:

* ``gpu.json``: the GPU (name, SMs, memory, clocks, driver, torch and CUDA versions) and the host;
* ``torch-traces.tar.gz``: the trials, as ``torch/<experiment>/<arm>/seed-<seed>/`` in the trace format (unpack
  into ``data/traces/``); each trial is written atomically into ``traces/`` first, so an interrupted run leaves no
  trial that loads, and ``python -m dlfp.studies.torch_device --pack DIR`` packs what a killed run left;
* ``runs.csv``: one row per planned trial with its state (``done``, ``skipped``: past the budget, ``failed``: the
  error) and its wall time in seconds.

The plan (``PLAN`` on a GPU, ``TINY_PLAN`` with ``--tiny``, or ``--select``) runs the 8B request list (async),
the 0.6B headline configuration (seed by seed, every arm of a seed together), then the 8B list with sync
scheduling; a trial is not started once ``budget_s`` seconds have passed since the start.
Every trial of the plan uses the same random weights per model (``backend_options.torch.weight_seed``).

Raises (as one line on stderr, exit 2): a GPU plan on a machine without CUDA; an output folder that is not
writable.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tarfile
import shutil
import time
import traceback
from pathlib import Path

#: (experiment, arms, seeds) in run order on a GPU.
PLAN = (
    ("torch-qwen3-8b-long-prompt-h200", ("baseline", "dlfp", "dlfpg"), (801,)),
    ("torch-qwen3-0.6b-h200", ("baseline", "dlfp", "dlfpg"), (801, 802, 803)),
    ("torch-qwen3-8b-long-prompt-h200-sync", ("baseline", "dlfp", "dlfpg"), (801,)),
)
#: The CPU rehearsal: the same shape of plan on the tiny model.
TINY_PLAN = (
    ("torch-cpu-tiny-sync", ("baseline", "dlfp", "dlfpg"), (801,)),
    ("torch-cpu-tiny", ("baseline", "dlfp", "dlfpg"), (801,)),
)
RUNS_COLUMNS = ("experiment", "arm", "seed", "state", "wall_s", "error")


def parse_select(text: str) -> tuple:
    """A plan from ``"experiment:arm:seed,..."`` (entries of one experiment and seed grouped in the given order).

    Raises:
        ValueError: an entry that is not ``experiment:arm:seed`` with an integer seed.
    """
    plan: list[tuple[str, list[str], tuple[int]]] = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3 or not parts[2].isdigit():
            raise ValueError(f"--select: {item!r} is not experiment:arm:seed (e.g. torch-cpu-tiny:baseline:801)")
        name, arm, seed = parts[0], parts[1], int(parts[2])
        if plan and plan[-1][0] == name and plan[-1][2] == (seed,):
            plan[-1][1].append(arm)
        else:
            plan.append((name, [arm], (seed,)))
    return tuple((n, tuple(a), s) for n, a, s in plan)


def run(out: Path, tiny: bool = False, budget_s: float = 420.0, commit: str | None = None,
        plan: tuple | None = None) -> list[dict]:
    """Run the plan into ``out`` (see module docstring); returns the rows of ``runs.csv``.

    Raises:
        ConfigError: a GPU plan without CUDA (before anything is written).
        OSError: ``out`` cannot be created or written.
    """
    from dlfp.backends import run_trial
    from dlfp.backends.torch.runner import check_config, gpu_identity
    from dlfp.backends.harness import host_hardware
    from dlfp.config import load_experiment
    from dlfp.traces.format import write_trial

    plan = plan or (TINY_PLAN if tiny else PLAN)
    cfgs = {name: load_experiment(name) for name, _a, _s in plan}
    for cfg in cfgs.values():
        check_config(cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu.json").write_text(json.dumps({"gpu": gpu_identity(), "host": host_hardware()}, indent=1) + "\n")
    t0 = time.perf_counter()
    rows: list[dict] = []
    root = out / "traces"  # trials land here one by one (atomically), then are packed; a killed run keeps them
    for name, arms, seeds in plan:
        for seed in seeds:
            for arm in arms:
                row = {"experiment": name, "arm": arm, "seed": seed, "state": "skipped", "wall_s": "", "error": ""}
                rows.append(row)
                if time.perf_counter() - t0 > budget_s:
                    print(f"skip {name} {arm} {seed}: past the {budget_s:.0f} s budget", flush=True)
                    continue
                ts = time.perf_counter()
                try:
                    trial = run_trial(cfgs[name], arm, seed, backend="torch")
                except Exception as e:  # noqa: BLE001 - one failed trial must not lose the others
                    row.update(state="failed", error=f"{type(e).__name__}: {e}"[:300])
                    traceback.print_exc()
                    continue
                if commit:
                    trial.metadata["git_commit"] = commit
                write_trial(trial, root, overwrite=True)
                row.update(state="done", wall_s=round(time.perf_counter() - ts, 2))
                print(f"{name} {arm} seed {seed}: {row['wall_s']} s, {len(trial.iterations)} iterations, "
                      f"{len(trial.tokens)} tokens", flush=True)
                _write_runs(out / "runs.csv", rows)
    _write_runs(out / "runs.csv", rows)
    pack(root, out / "torch-traces.tar.gz")
    print(f"plan done in {time.perf_counter() - t0:.0f} s: "
          f"{sum(r['state'] == 'done' for r in rows)} of {len(rows)} trials", flush=True)
    return rows


def pack(root: Path, dest: Path) -> None:
    """Pack the trials under ``root`` (``torch/<experiment>/<arm>/seed-<seed>/``, temporaries left out) into the
    gzipped tar ``dest`` atomically, then remove ``root``."""
    part = dest.with_name(f".{dest.name}.part")
    with tarfile.open(part, "w:gz") as tar:
        if (root / "torch").exists():
            tar.add(root / "torch", arcname="torch",
                    filter=lambda ti: None if Path(ti.name).name.startswith(".") else ti)
    os.replace(part, dest)
    shutil.rmtree(root, ignore_errors=True)


def _write_runs(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=RUNS_COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    from dlfp.config import ConfigError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "torch-device-out"), help="output folder ($OUT)")
    ap.add_argument("--tiny", action="store_true", help="the CPU rehearsal (tiny model, fp32)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no trial after this many seconds")
    ap.add_argument("--commit", default=os.environ.get("DLFP_GIT_COMMIT"), help="git commit recorded in the traces")
    ap.add_argument("--select", default="", help="run these trials instead of the plan: experiment:arm:seed,...")
    ap.add_argument("--pack", action="store_true", help="only pack the trials a killed run left in OUT/traces")
    a = ap.parse_args(argv)
    if a.pack:
        pack(Path(a.out) / "traces", Path(a.out) / "torch-traces.tar.gz")
        return 0
    try:
        plan = parse_select(a.select) if a.select else None
        run(Path(a.out), tiny=a.tiny, budget_s=a.budget_s, commit=a.commit, plan=plan)
    except (ConfigError, ValueError) as e:  # a bad --select, an experiment this machine cannot run
        print(f"dlfp torch-device: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"dlfp torch-device: cannot write {a.out}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
