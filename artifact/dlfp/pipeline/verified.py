"""The verification record of ``run-all`` on the simulator: which trials this code already reran on this machine
and found identical.

The record is a per-machine cache, never committed: ``$DLFP_CACHE_DIR/verified/<backend>.json`` (default
``<repository>/.cache/dlfp/verified/sim.json``, git-ignored; ``DLFP_CACHE_DIR=off`` keeps no record, so every
``run-all`` reruns every trial). It holds the fingerprint of the code that reran the trials
(``dlfp.fingerprint.code_fingerprint("trial")``: every file of the ``dlfp`` package and the versions of the
packages that shape a trial) and, per trial ``<experiment>/<arm>/seed-<seed>``, two sha256 digests: ``trace``,
of the trial's four files as they were when the rerun matched them (or replaced them), and ``config``, of the
configuration the rerun used (``trial_config_sha256``).

A trial is fresh when the record's code fingerprint is this code's and its entry's two digests are those of the
trial on disk and of its configuration now; ``run-all`` then does not rerun it. The entries are keyed by content,
not by folder: a trial in any traces folder whose files and configuration match an entry is one this code
reproduced here. A fresh clone has no record, so its first ``run-all`` reruns and compares every trial. The
record is written atomically with sorted keys and neither timestamps nor absolute paths. Trials of override
experiments (``<experiment>+<hash>``) are never recorded.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from dlfp.config import ExperimentConfig
from dlfp.fingerprint import canonical_json, environment, read_json, text_sha256, trial_sha256, write_json_atomic
from dlfp.paths import CACHE_ENV
from dlfp.pipeline.paths import repo_root
from dlfp.traces.compare import DESCRIPTIVE_CONFIG_KEYS
from dlfp.traces.format import trial_dir

#: The folder of the records below the cache folder.
RECORD_DIR = "verified"
RECORD_FORMAT = 1
ABOUT = ("Trials that `dlfp run-all` reran on this machine with this code and found identical to (or replaced "
         "by) the files with these sha256 digests; while the code, the configuration and the files match, a "
         "trial is not rerun (`dlfp run-all --force` reruns every trial). A per-machine cache: safe to delete.")

#: One trial of a plan: (experiment id, arm, seed).
TrialKey = tuple[str, str, int]


def record_path(backend: str) -> Path | None:
    """Where this machine's record for ``backend`` lives: ``$DLFP_CACHE_DIR/verified/<backend>.json`` (default
    ``<repository>/.cache/dlfp/verified/<backend>.json``, the repository being ``dlfp.pipeline.repo_root()``);
    ``None`` when ``$DLFP_CACHE_DIR`` is ``off`` (no record: every trial is rerun)."""
    env = os.environ.get(CACHE_ENV, "").strip()
    if env.lower() == "off":
        return None
    return (Path(env) if env else repo_root() / ".cache" / "dlfp") / RECORD_DIR / f"{backend}.json"


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


def load_record(path: str | Path | None) -> dict:
    """The record at ``path``; an empty one (no code, no trials) when ``path`` is ``None`` or the file is missing,
    unreadable or of another format."""
    rec = read_json(path) if path is not None else None
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


def write_record(path: str | Path | None, code: str, entries: dict[TrialKey, dict[str, str]]) -> Path | None:
    """Merge ``entries`` into the record at ``path`` and write it atomically; returns ``path`` (``None``, writing
    nothing, when ``path`` is ``None``: the cache is off).

    Entries already there stay when the record is of this ``code``; a record of other code is replaced.

    Raises:
        OSError: the cache folder cannot be created or written.
    """
    if path is None:
        return None
    old = load_record(path)
    trials = dict(old["trials"]) if old.get("code") == code else {}
    trials.update({entry_name(k): v for k, v in entries.items() if recordable(k)})
    write_json_atomic(path, {"about": ABOUT, "code": code, "environment": environment(), "format": RECORD_FORMAT,
                             "trials": dict(sorted(trials.items()))})
    return Path(path)


__all__ = ["RECORD_DIR", "RECORD_FORMAT", "TrialKey", "entry_name", "fresh_trials", "load_record", "recordable",
           "record_path", "trial_config_sha256", "write_record"]
