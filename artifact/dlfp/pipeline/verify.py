"""``run-all`` on a backend that is not real-time (the simulator) as a reproducibility check.

Every selected trial is run again into a scratch directory beside the traces and compared with the shipped one
(``dlfp.traces.compare.trial_differences``: Parquet byte for byte, metadata without provenance). An identical
trial leaves the shipped files untouched (so a clean checkout stays clean); a different or missing one is
replaced by the fresh one (atomically: old moved aside, new renamed in, old removed). The scratch directory is
removed afterwards, also when interrupted.
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dlfp.config import ExperimentConfig
from dlfp.pipeline.interrupts import TALLY
from dlfp.pipeline.progress import progress_file, say
from dlfp.traces.compare import trial_differences
from dlfp.traces.format import replace_directory, trial_dir


@dataclass
class Verification:
    """What ``verify_trials`` found: trial count, identical count, and ``{trial: differences}`` of the rest."""

    backend: str
    total: int = 0
    identical: int = 0
    replaced: dict[str, list[str]] = field(default_factory=dict)
    added: int = 0

    def summary(self) -> str:
        """``N of M simulator trials identical to the shipped traces`` (+ how many were replaced)."""
        text = f"{self.identical} of {self.total} {_kind(self.backend)} trials identical to the shipped traces"
        if self.replaced:
            text += f"; {len(self.replaced)} replaced by the fresh run"
        if self.added:
            text += f"; {self.added} missing, added from the fresh run"
        return text


def _kind(backend: str) -> str:
    """What to call a backend's trials: a backend that is not real-time is the simulator."""
    from dlfp.backends import get_backend

    return backend if get_backend(backend).real_time else "simulator"


def place_trial(fresh: Path, shipped: Path) -> None:
    """Move the trial directory ``fresh`` to ``shipped``, replacing what is there atomically."""
    shipped.parent.mkdir(parents=True, exist_ok=True)
    replace_directory(fresh, shipped)


def verify_trials(plans: list[tuple[ExperimentConfig, list[str], list[int]]], backend: str, traces: Path,
                  jobs: int, progress: bool = True) -> Verification:
    """Rerun every (config, arm, seed) of ``plans`` on ``backend`` and keep or replace the shipped trial.

    Names each trial that differed (and what differed) on stderr. Raises what a trial raises.
    """
    from tqdm import tqdm

    from dlfp.pipeline.execute import _trial_worker
    from dlfp.pipeline.pool import run_pool

    traces.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".rerun-", dir=traces))
    out = Verification(backend)
    jobs_list = [((cfg.name, arm, seed), (cfg, arm, seed, backend, str(scratch)))
                 for cfg, arms, seeds in plans for seed in seeds for arm in arms]
    out.total = len(jobs_list)
    bar = tqdm(total=out.total, desc=f"rerun {_kind(backend)} trials and compare", unit="trial",
               file=progress_file(), disable=not progress, dynamic_ncols=True)

    def done(key, _elapsed) -> None:
        name, arm, seed = key
        fresh, shipped = trial_dir(scratch, backend, name, arm, seed), trial_dir(traces, backend, name, arm, seed)
        diffs = trial_differences(shipped, fresh) if shipped.is_dir() else None
        if diffs is None:
            place_trial(fresh, shipped)
            out.added += 1
        elif diffs:
            place_trial(fresh, shipped)
            rel = shipped.relative_to(traces).as_posix()
            out.replaced[rel] = diffs
            say(f"dlfp: {rel} differs from the fresh run ({', '.join(diffs)}); replaced")
        else:
            out.identical += 1
            shutil.rmtree(fresh, ignore_errors=True)
        TALLY.trials += 1
        bar.update(1)

    try:
        if jobs > 1 and len(jobs_list) > 1:
            run_pool(jobs_list, _trial_worker, jobs, done, label=lambda k: f"{backend}/{k[0]}/{k[1]}/seed-{k[2]}")
        else:
            for key, args in jobs_list:
                done(key, _trial_worker(*args))
    finally:
        bar.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return out


__all__ = ["Verification", "place_trial", "verify_trials"]
