"""Where the package's data lives: one place for every path derived from this file.

``PACKAGE_DIR`` is ``artifact/dlfp``; ``REPO_ROOT`` is the checkout holding ``artifact/`` (for an
installed, non-editable package it is the folder two levels up, which has no ``data/``).
"""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parents[1]
#: Experiment YAMLs shipped with the package.
EXPERIMENTS_DIR = PACKAGE_DIR / "experiments"
#: Model architecture YAMLs and Hugging Face ``config.json`` folders (``models/hf/<name>``).
MODELS_DIR = PACKAGE_DIR / "models"
HF_MODELS_DIR = MODELS_DIR / "hf"
#: GPU datasheets and fitted CPU profiles.
HARDWARE_DIR = PACKAGE_DIR / "hardware"
#: Environment variable naming the folder of per-machine caches (default ``<repository>/.cache/dlfp``; ``off``
#: disables them): the tables' per-trial digests and the simulator's verification record.
CACHE_ENV = "DLFP_CACHE_DIR"
#: Derived workload profiles (prompt-length quantiles).
DATA_DIR = PACKAGE_DIR / "data"
#: Environment variable naming a folder of experiment YAMLs read before the package's ``experiments/``: a
#: ``<name>.yaml`` there declares experiment ``<name>`` in place of the package's (what runs, and what its trials
#: are checked against when tables are rendered).
EXPERIMENTS_ENV = "DLFP_EXPERIMENTS_DIR"


def experiment_file(name: str) -> Path:
    """The YAML that declares experiment ``name``: ``$DLFP_EXPERIMENTS_DIR/<name>.yaml`` when that exists, else
    ``experiments/<name>.yaml`` of the package (which may not exist)."""
    import os

    extra = os.environ.get(EXPERIMENTS_ENV, "").strip()
    if extra and (Path(extra) / f"{name}.yaml").is_file():
        return Path(extra) / f"{name}.yaml"
    return EXPERIMENTS_DIR / f"{name}.yaml"
