"""``run-all`` on a backend that is not real-time (the simulator) as a reproducibility check.

Every selected trial is run again into a scratch directory beside the traces and compared with the shipped one
(``dlfp.traces.compare.trial_differences``: Parquet byte for byte, metadata without provenance). An identical
trial leaves the shipped files untouched (so a clean checkout stays clean); a different or missing one is
replaced by the fresh one (atomically: old moved aside, new renamed in, old removed). The scratch directory is
removed afterwards, also when interrupted.

A trial that this exact code already reran on this machine and found identical (``dlfp.pipeline.verified``: this
machine's record, ``.cache/dlfp/verified/<backend>.json``, matches the trial's files, its configuration and the
code fingerprint) is fresh and not rerun, unless ``force``; a fresh clone has no record and reruns every trial.
Every trial rerun is entered into the record and, where the committed provenance
(``<traces>/<backend>/PROVENANCE.json``, ``dlfp.pipeline.provenance``) does not describe it, into that (also when
the run is interrupted: the trials compared until then).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dlfp.config import ExperimentConfig
from dlfp.fingerprint import environment, trial_sha256
from dlfp.pipeline import provenance, verified
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
    #: Trials not rerun: verified earlier by this code on this machine (``dlfp.pipeline.verified``).
    fresh: int = 0

    def fresh_line(self) -> str:
        """The one line about the trials not rerun ("" when every trial was rerun)."""
        if not self.fresh:
            return ""
        return f"{self.fresh} trials fresh: verified by this code on this machine, not rerun; --force reruns"

    def summary(self) -> str:
        """``N of M simulator trials identical to the shipped traces`` (+ how many were replaced)."""
        if not self.total:
            return f"no {_kind(self.backend)} trial rerun"
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


#: Name prefix of the scratch folder a verification reruns trials into: ``<traces>/.rerun-<pid>-<random>``.
SCRATCH_PREFIX = ".rerun-"


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0 probes it without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_scratch(traces: Path) -> list[Path]:
    """Remove the scratch folders (``.rerun-*``) under ``traces`` whose process is gone (a run that was killed);
    returns them. One of a live process (another run on the same root) is left alone."""
    removed = []
    for d in sorted(Path(traces).glob(f"{SCRATCH_PREFIX}*")):
        pid = d.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if d.is_dir() and not (pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid))):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def verify_trials(plans: list[tuple[ExperimentConfig, list[str], list[int]]], backend: str, traces: Path,
                  jobs: int, progress: bool = True, force: bool = False) -> Verification:
    """Rerun every (config, arm, seed) of ``plans`` on ``backend`` that is not fresh and keep or replace the shipped
    trial; ``force`` reruns the fresh ones too.

    Names each trial that differed (and what differed) on stderr, enters every trial compared into this
    machine's verification record (``verified.record_path``) and into the provenance where it does not describe
    the trial (``provenance.update_provenance``). Raises what a trial raises, and ``OSError`` when the provenance
    cannot be written (a verification record that cannot be written is only named).
    """
    from tqdm import tqdm

    from dlfp.fingerprint import code_fingerprint
    from dlfp.pipeline.execute import _trial_worker
    from dlfp.pipeline.pool import run_pool

    traces.mkdir(parents=True, exist_ok=True)
    code = code_fingerprint("trial", fresh=True)  # the code as it is now, before any trial runs
    rec_path = verified.record_path(backend)
    fresh = {} if force else verified.fresh_trials(verified.load_record(rec_path), plans, backend, traces, code)
    configs = {cfg.name: cfg for cfg, _, _ in plans}
    out = Verification(backend, fresh=len(fresh))
    jobs_list = [((cfg.name, arm, seed), (cfg, arm, seed, backend, None))
                 for cfg, arms, seeds in plans for seed in seeds for arm in arms if (cfg.name, arm, seed) not in fresh]
    out.total = len(jobs_list)
    if not jobs_list:
        _write_record(rec_path, code, fresh)
        return out
    remove_stale_scratch(traces)
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=traces))
    jobs_list = [(key, args[:-1] + (str(scratch),)) for key, args in jobs_list]
    entries: dict = dict(fresh)
    rerun: dict = {}
    bar = tqdm(total=out.total, desc=f"rerun {_kind(backend)} trials and compare", unit="trial",
               file=progress_file(), disable=not progress, dynamic_ncols=True)

    def done(key, _elapsed) -> None:
        name, arm, seed = key
        shipped = _compare_and_place(out, scratch, traces, backend, key)
        entries[key] = rerun[key] = {"config": verified.trial_config_sha256(configs[name], arm, seed, backend),
                                     "trace": trial_sha256(shipped)}
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
        _write_record(rec_path, code, entries)
        if rerun:
            provenance.update_provenance(provenance.provenance_path(traces, backend), code, environment(), rerun)
    return out


def _write_record(path: Path | None, code: str, entries: dict) -> None:
    """``verified.write_record``; a cache folder that cannot be written is named in one line, not an error (the
    next run then reruns these trials)."""
    try:
        verified.write_record(path, code, entries)
    except OSError as e:
        say(f"dlfp: cannot write the verification record {path} ({e.strerror or e}); the next run-all reruns "
            f"these trials")


def _compare_and_place(out: Verification, scratch: Path, traces: Path, backend: str, key) -> Path:
    """Compare the fresh run of ``key`` in ``scratch`` with the shipped trial; keep or replace it (counted in
    ``out``). Returns the shipped trial's directory."""
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
    return shipped


__all__ = ["SCRATCH_PREFIX", "Verification", "place_trial", "remove_stale_scratch", "verify_trials"]
