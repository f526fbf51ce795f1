"""The verification record of ``run-all`` on the simulator: which trials this code already reran and found identical.

``<traces>/<backend>/VERIFIED.json`` (e.g. ``data/traces/sim/VERIFIED.json``) holds the fingerprint of the code
that reran the trials (``dlfp.fingerprint.code_fingerprint("trial")``: every file of the ``dlfp`` package and the
versions of the packages that shape a trial) and, per trial ``<experiment>/<arm>/seed-<seed>``, two sha256
digests: ``trace``, of the trial's four files as they were when the rerun matched them (or replaced them), and
``config``, of the configuration the rerun used (``trial_config_sha256``).

A trial is fresh when the record's code fingerprint is this code's and its entry's two digests are those of the
trial on disk and of its configuration now; ``run-all`` then does not rerun it. The record is written atomically
with sorted keys and neither timestamps nor absolute paths, so committing it lets a fresh clone with the same
code and package versions skip the rerun. Trials of override experiments (``<experiment>+<hash>``) are never
recorded.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from dlfp.config import ExperimentConfig
from dlfp.fingerprint import canonical_json, environment, read_json, text_sha256, trial_sha256, write_json_atomic
from dlfp.traces.compare import DESCRIPTIVE_CONFIG_KEYS
from dlfp.traces.format import trial_dir

RECORD_NAME = "VERIFIED.json"
RECORD_FORMAT = 1
ABOUT = ("Trials that `dlfp run-all` reran with this code and found identical to (or replaced by) the files "
         "with these sha256 digests; while the code, the configuration and the files match, a trial is not "
         "rerun (`dlfp run-all --force` reruns every trial).")

#: One trial of a plan: (experiment id, arm, seed).
TrialKey = tuple[str, str, int]


def record_path(traces: str | Path, backend: str) -> Path:
    """``<traces>/<backend>/VERIFIED.json``."""
    return Path(traces) / backend / RECORD_NAME


def entry_name(key: TrialKey) -> str:
    """A trial's name in the record: ``<experiment>/<arm>/seed-<seed>``."""
    name, arm, seed = key
    return f"{name}/{arm}/seed-{int(seed)}"


def recordable(key: TrialKey) -> bool:
    """False for a trial of an override experiment (``<experiment>+<hash>``): those are always rerun."""
    return "+" not in key[0]


def trial_config_sha256(cfg: ExperimentConfig, arm: str, seed: int, backend: str) -> str:
    """sha256 of what a rerun of (``arm``, ``seed``) on ``backend`` is compared on: the whole configuration
    (every arm, as the trial's metadata records it) without its free text (``description``, ``assumptions``)."""
    dump = cfg.model_dump(mode="json")
    for k in DESCRIPTIVE_CONFIG_KEYS:
        dump.pop(k, None)
    return text_sha256(canonical_json({"arm": arm, "backend": backend, "config": dump, "seed": int(seed)}))


def load_record(path: str | Path) -> dict:
    """The record at ``path``; an empty one (no code, no trials) when it is missing, unreadable or of another
    format."""
    rec = read_json(path)
    if rec is None or rec.get("format") != RECORD_FORMAT or not isinstance(rec.get("trials"), dict):
        return {"code": None, "trials": {}}
    return rec


def fresh_trials(record: dict, plans: Iterable[tuple[ExperimentConfig, list[str], list[int]]], backend: str,
                 traces: str | Path, code: str) -> dict[TrialKey, dict[str, str]]:
    """The planned trials the record shows as verified by ``code``, with their current entries.

    A trial counts when it is recordable, its directory exists and the entry's ``config`` and ``trace``
    digests equal ``trial_config_sha256`` and ``trial_sha256`` of it now.
    """
    if record.get("code") != code:
        return {}
    out = {}
    for cfg, arms, seeds in plans:
        for seed in seeds:
            for arm in arms:
                key = (cfg.name, arm, int(seed))
                entry = record["trials"].get(entry_name(key))
                path = trial_dir(traces, backend, cfg.name, arm, seed)
                if not recordable(key) or not isinstance(entry, dict) or not path.is_dir():
                    continue
                now = {"config": trial_config_sha256(cfg, arm, seed, backend), "trace": trial_sha256(path)}
                if entry.get("config") == now["config"] and entry.get("trace") == now["trace"]:
                    out[key] = now
    return out


def write_record(path: str | Path, code: str, entries: dict[TrialKey, dict[str, str]]) -> Path:
    """Merge ``entries`` into the record at ``path`` and write it atomically; returns ``path``.

    Entries already there stay when the record is of this ``code``; a record of other code is replaced.
    """
    old = load_record(path)
    trials = dict(old["trials"]) if old.get("code") == code else {}
    trials.update({entry_name(k): v for k, v in entries.items() if recordable(k)})
    write_json_atomic(path, {"about": ABOUT, "code": code, "environment": environment(), "format": RECORD_FORMAT,
                             "trials": dict(sorted(trials.items()))})
    return Path(path)


__all__ = ["RECORD_FORMAT", "RECORD_NAME", "TrialKey", "entry_name", "fresh_trials", "load_record", "recordable",
           "record_path", "trial_config_sha256", "write_record"]
