"""Papermill mistakes: a misspelt parameter name and a bad value, each one line, the run failed."""
from __future__ import annotations

import ast

import nbformat
import papermill as pm
import pytest

from dlfp import pipeline
from dlfp.config import list_experiments

NOTEBOOKS = ("experiment", "figures", "controller")


def _declared(nb) -> list[str]:
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    return [t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign) for t in node.targets]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_each_notebook_checks_exactly_its_declared_parameters(name):
    nb = nbformat.read(pipeline.notebooks_dir() / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    i = next(k for k, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
    call = code[i + 1].source  # the cell right after the parameters (papermill injects between them)
    listed = next(ast.literal_eval(n.args[1]) for n in ast.walk(ast.parse(call))
                  if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "check_parameters")
    assert listed == _declared(nb)


def test_unknown_parameters_ignores_kernel_and_private_names():
    ns = {"experiment": "x", "experimnet": "y", "In": [], "Out": {}, "_i1": "", "pd": pytest, "f": len}
    assert pipeline.notebooks.unknown_parameters(ns, ["experiment"]) == ["experimnet"]


def _error(path):
    nb = nbformat.read(path, as_version=4)
    errs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert len(errs) == 1
    return errs[0]


def test_misspelt_parameter_fails_the_run_with_one_line(tmp_path):
    out = tmp_path / "out.ipynb"
    with pytest.raises(pm.PapermillExecutionError) as ei:
        pm.execute_notebook(str(pipeline.notebooks_dir() / "experiment.ipynb"), str(out),
                            parameters={"experimnet": "qwen3-8b-r0.10"}, progress_bar=False, kernel_name="python3")
    assert ei.value.ename == "NotebookParameterError"
    err = _error(out)
    assert err.traceback == ["dlfp: error: unknown notebook parameter(s) experimnet; this notebook takes "
                             "experiment, backend, seeds, out_dir, overrides, force, quick, frontier"]
    assert not list(tmp_path.glob("data*"))  # the default experiment did not run


def test_bad_value_is_one_readable_line(tmp_path):
    out = tmp_path / "out.ipynb"
    with pytest.raises(pm.PapermillExecutionError) as ei:
        pm.execute_notebook(str(pipeline.notebooks_dir() / "experiment.ipynb"), str(out),
                            parameters={"experiment": "qwen3-7b-nope", "backend": "sim",
                                        "out_dir": str(tmp_path / "t")},
                            progress_bar=False, kernel_name="python3")
    assert ei.value.ename == "ConfigError"
    err = _error(out)
    assert err.traceback == [f"dlfp: error: unknown experiment 'qwen3-7b-nope'; known: {', '.join(list_experiments())}"]
    assert not (tmp_path / "t").exists()
