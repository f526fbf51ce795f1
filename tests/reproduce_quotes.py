"""What REPRODUCE.md quotes from ``data/results/``: the block between ``<!-- begin data/results/<name> -->`` and
``<!-- end data/results/<name> -->``, for the tests that check it is the rendered file, byte for byte."""
from __future__ import annotations

from dlfp.paths import REPO_ROOT


def quoted_block(name: str) -> str:
    """The text REPRODUCE.md quotes for ``data/results/<name>`` (``name`` relative to ``data/results``).

    Raises:
        AssertionError: REPRODUCE.md lacks either marker (naming the file).
    """
    text = (REPO_ROOT / "REPRODUCE.md").read_text()
    begin, end = f"<!-- begin data/results/{name} -->\n", f"<!-- end data/results/{name} -->"
    assert begin in text and end in text, f"REPRODUCE.md quotes no block of data/results/{name}"
    return text.split(begin, 1)[1].split(end, 1)[0]


def rendered(name: str) -> str:
    """The rendered ``data/results/<name>`` as committed."""
    return (REPO_ROOT / "data" / "results" / name).read_text()
