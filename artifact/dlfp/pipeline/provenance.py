"""The committed provenance of the shipped simulator trials: which code wrote each one.

``<traces>/<backend>/PROVENANCE.json`` (``data/traces/sim/PROVENANCE.json``) holds, per trial
``<experiment>/<arm>/seed-<seed>``, the sha256 of its four files (``trace``), of its configuration (``config``,
``dlfp.pipeline.verified.trial_config_sha256``) and the fingerprint of the code that wrote those bytes
(``code``, ``dlfp.fingerprint.code_fingerprint("trial")``), and per code fingerprint the environment it ran in
(``codes``: Python, machine, package versions). It says where the shipped bytes came from, not that anything was
verified on the machine reading it: the verification record is per machine (``dlfp.pipeline.verified``).

``run-all`` keeps it: after a trial is rerun and compared, its entry is rewritten with the current code only when
it does not describe the trial on disk (missing, other bytes, other configuration), so a rerun that reproduces
every shipped trial leaves the file byte for byte as it was, and a replaced or added trial names the code that
wrote it. Written atomically with sorted keys, no timestamps and no absolute paths. Trials of override
experiments (``<experiment>+<hash>``) are never entered.
"""
from __future__ import annotations

from pathlib import Path

from dlfp.fingerprint import read_json, write_json_atomic
from dlfp.pipeline.verified import TrialKey, entry_name, recordable

PROVENANCE_NAME = "PROVENANCE.json"
PROVENANCE_FORMAT = 1
ABOUT = ("Which code wrote each shipped trial: the sha256 of the trial's four files (trace) and configuration "
         "(config), and the fingerprint of the code that wrote those bytes (code; its environment under codes). "
         "Provenance only: `dlfp run-all` reruns every trial on the machine it runs on and compares it with "
         "these files.")


def provenance_path(traces: str | Path, backend: str) -> Path:
    """``<traces>/<backend>/PROVENANCE.json``."""
    return Path(traces) / backend / PROVENANCE_NAME


def load_provenance(path: str | Path) -> dict:
    """The provenance at ``path``; an empty one (no codes, no trials) when it is missing, unreadable or of another
    format."""
    rec = read_json(path)
    if (rec is None or rec.get("format") != PROVENANCE_FORMAT or not isinstance(rec.get("trials"), dict)
            or not isinstance(rec.get("codes"), dict)):
        return {"codes": {}, "trials": {}}
    return rec


def update_provenance(path: str | Path, code: str, env: dict[str, str],
                      trials: dict[TrialKey, dict[str, str]]) -> list[str]:
    """Enter ``trials`` (``{key: {"config": sha256, "trace": sha256}}`` of trials just written or reproduced by
    ``code``, which ran in ``env``) into the provenance at ``path``.

    An entry whose ``config`` and ``trace`` already match keeps its code (the code that first wrote these bytes);
    any other is set to ``code``. The file is written (atomically) only when an entry changed, and only codes that
    some entry names are kept. Returns the names of the entries that changed.

    Raises:
        OSError: the file cannot be written.
    """
    rec = load_provenance(path)
    entries, codes = dict(rec["trials"]), dict(rec["codes"])
    changed = []
    for key, digests in trials.items():
        if not recordable(key):
            continue
        name, old = entry_name(key), entries.get(entry_name(key))
        if (isinstance(old, dict) and old.get("config") == digests["config"] and old.get("trace") == digests["trace"]
                and old.get("code") in codes):
            continue
        entries[name] = {"code": code, "config": digests["config"], "trace": digests["trace"]}
        changed.append(name)
    if changed:
        codes[code] = dict(env)
        used = {e.get("code") for e in entries.values() if isinstance(e, dict)}
        write_json_atomic(path, {"about": ABOUT, "codes": {c: v for c, v in sorted(codes.items()) if c in used},
                                 "format": PROVENANCE_FORMAT, "trials": dict(sorted(entries.items()))})
    return sorted(changed)


__all__ = ["PROVENANCE_FORMAT", "PROVENANCE_NAME", "load_provenance", "provenance_path", "update_provenance"]
