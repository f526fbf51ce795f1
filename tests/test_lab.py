"""``make lab``: JupyterLab from the pinned extra ``lab``, opening the executed notebooks."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_lab_extra_is_pinned():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["lab"]
    pins = {m.group(1).lower().replace("_", "-"): m.group(2) for m in
            re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+)", (ROOT / "requirements" / "constraints.txt").read_text(), re.M)}
    assert extra == ["jupyterlab"] and pins["jupyterlab"] == "4.6.6"
    for dep in ("jupyter-server", "jupyterlab-server", "notebook-shim", "nbconvert"):
        assert dep in pins, dep


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_lab_opens_the_executed_notebooks_with_the_venv_jupyter():
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # not nested
    r = subprocess.run(["make", "--no-print-directory", "-n", "-W", "pyproject.toml", "lab", "LAB_ARGS=--no-browser"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last == ".venv/bin/jupyter lab --notebook-dir=. --port=8888 --no-browser data/results/figures.ipynb"
    assert "-e '.[lab]'" in r.stdout
    help_text = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True,
                               timeout=60, env=env).stdout
    assert "make lab" in help_text and "--no-browser" in help_text
