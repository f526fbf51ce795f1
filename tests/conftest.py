"""Shared fixtures: every test gets its own, empty folder of declared experiments (``$DLFP_EXPERIMENTS_DIR``).

A test that fabricates trials of a shipped experiment with smaller settings (``test_pipeline.write_fake_experiment``)
declares those settings there, so the trace-set checks judge the fakes against what they claim to be, in this
process and in the notebook kernels it starts.
"""
from __future__ import annotations

import pytest

from dlfp.config import EXPERIMENTS_ENV


@pytest.fixture(autouse=True)
def declared_experiments(tmp_path_factory, monkeypatch):
    """The folder a test may declare experiments in (empty: the package's YAMLs apply)."""
    folder = tmp_path_factory.mktemp("experiments")
    monkeypatch.setenv(EXPERIMENTS_ENV, str(folder))
    return folder
