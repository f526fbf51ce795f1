"""The package keeps the shape ARCHITECTURE.md describes: small modules and functions, no backend-name tests
outside the backend registry, and no internal tracker words where a user reads."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "artifact" / "dlfp"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _modules():
    return sorted(PKG.rglob("*.py"))


def test_every_module_is_at_most_500_lines():
    long = {str(p.relative_to(PKG)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_every_function_is_at_most_80_lines():
    long = {}
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(PKG)}:{node.lineno} {node.name}"] = n
    assert long == {}


def test_the_limits_catch_a_long_function():
    src = "def f():\n" + "    x = 1\n" * 90
    node = ast.parse(src).body[0]
    assert node.end_lineno - node.lineno + 1 == 91 > MAX_FUNCTION_LINES


_BACKEND_TEST = re.compile(r"""backend\s*(==|!=)\s*["'](sim|emu|vllm)["']""")


def test_no_code_tests_a_backend_by_name():
    """Backend properties are data on ``dlfp.backends.Backend``; code asks the descriptor, not the name."""
    hits = [f"{p.relative_to(PKG)}:{i}" for p in _modules() for i, line in enumerate(p.read_text().splitlines(), 1)
            if _BACKEND_TEST.search(line)]
    assert hits == []


_TRACKER = re.compile(r"issue[- ]?[0-9]", re.IGNORECASE)


def test_no_tracker_numbers_where_a_user_reads():
    files = subprocess.run(["git", "ls-files", "artifact", "notebooks", "README.md", "REPRODUCE.md",
                            "ARCHITECTURE.md"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout: no file list")
    hits = []
    for f in files:
        p = REPO / f
        if p.suffix in {".py", ".md", ".yaml", ".ipynb", ".txt"} and p.is_file():
            hits += [f"{f}:{i}" for i, line in enumerate(p.read_text().splitlines(), 1) if _TRACKER.search(line)]
    assert hits == []


def test_the_cli_help_names_no_tracker_numbers():
    from dlfp.cli import build_parser

    parser = build_parser()
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions:  # every subcommand's own help
        texts += [sub.format_help() for sub in action.choices.values()]
    assert not [t for t in texts if _TRACKER.search(t)]
