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
