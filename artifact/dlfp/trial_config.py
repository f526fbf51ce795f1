"""What shapes one trial of an experiment, and how two configurations differ.

``trial_config`` is the part of an experiment's configuration that determines one arm's trial (the experiment's
settings and that arm's own, not the documentation, the seed list or the other arms); ``trial_config_sha256``
its digest, which a render compares between a trial's recorded configuration and the one its experiment declares;
``first_difference`` names where two configurations part.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from dlfp.config import ExperimentConfig

#: Config fields that do not shape one trial: documentation, the seed list, the arm table (only the trial's own
#: arm counts, under the key ``arm``) and which arm is the baseline.
TRIAL_IGNORED_KEYS = ("description", "assumptions", "tags", "seeds", "arms", "baseline_arm")


def trial_config(config: ExperimentConfig | dict, arm: str) -> dict:
    """The part of an experiment's configuration that shapes one trial of ``arm``, as plain JSON values.

    ``config`` is an ``ExperimentConfig`` or a recorded one (``metadata["config"]``). Every field except
    ``TRIAL_IGNORED_KEYS``, plus ``arm``: the arm's own settings (``None`` when the config has no such arm).
    """
    data = config.model_dump(mode="json") if isinstance(config, ExperimentConfig) else dict(config)
    data = json.loads(json.dumps(data, sort_keys=True, default=str))
    out = {k: v for k, v in data.items() if k not in TRIAL_IGNORED_KEYS}
    out["arm"] = (data.get("arms") or {}).get(arm)
    return out


def trial_config_sha256(config: ExperimentConfig | dict, arm: str) -> str:
    """sha256 (hex) of ``trial_config(config, arm)`` as canonical JSON (sorted keys, no spaces): two trials with
    the same digest ran the same configuration."""
    blob = json.dumps(trial_config(config, arm), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    """The first dotted key path (sorted order) where two JSON values differ, as ``key: a vs b``; ``None`` when
    they are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            d = first_difference(a.get(k), b.get(k), f"{prefix}{k}.")
            if d is not None:
                return d
        return None
    return None if a == b else f"{prefix.rstrip('.')}: {a!r} vs {b!r}"


__all__ = ["TRIAL_IGNORED_KEYS", "first_difference", "trial_config", "trial_config_sha256"]
