"""The shipped public traces: unchanged copies (sha256), licensed and cited, and the only trace files read."""
from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO / "data" / "workloads"
# sha256 of the public files (Mooncake FAST'25 release; Azure LLM inference trace 2023), as published
PUBLISHED_SHA256 = {
    "mooncake_conversation_trace.jsonl": "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
    "mooncake_synthetic_trace.jsonl": "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
    "azure_llm_2023_code.csv": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    "azure_llm_2023_conv.csv": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
}


def test_every_shipped_trace_is_the_public_file_byte_for_byte():
    got = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in WORKLOADS.iterdir()
           if p.suffix in (".jsonl", ".csv")}
    assert got == PUBLISHED_SHA256


def test_the_manifest_and_readme_state_the_same_hashes():
    manifest = dict(reversed(line.split()) for line in (WORKLOADS / "SHA256SUMS").read_text().splitlines())
    assert manifest == PUBLISHED_SHA256
    readme = (WORKLOADS / "README.md").read_text()
    for name, digest in PUBLISHED_SHA256.items():
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}`"))
        assert digest in row and ("Apache-2.0" in row if name.startswith("mooncake") else "CC BY 4.0" in row)
    assert (WORKLOADS / "LICENSE-Apache-2.0.txt").read_text().startswith("\n") or "Apache License" in (
        WORKLOADS / "LICENSE-Apache-2.0.txt").read_text()[:200]
    assert "Splitwise" in (WORKLOADS / "LICENSE-CC-BY-4.0.txt").read_text()


def test_row_counts_match_the_readme():
    lines = {"mooncake_conversation_trace.jsonl": 12031, "mooncake_synthetic_trace.jsonl": 3993}
    for name, n in lines.items():
        assert len((WORKLOADS / name).read_text().splitlines()) == n
    for name, n in {"azure_llm_2023_code.csv": 8819, "azure_llm_2023_conv.csv": 19366}.items():
        assert len((WORKLOADS / name).read_text().splitlines()) == n + 1  # header row


def test_nothing_reads_a_sibling_folder():
    """No experiment, module, test, notebook or build file refers to a folder beside the checkout."""
    files = subprocess.run(["git", "ls-files", "artifact", "tests", "notebooks", "benchmarks", "Makefile", ".ci"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"\.\./shared|parents\[1\]\.parent")
    hits = [f for f in files if f != "tests/test_workload_files.py" and (REPO / f).is_file()
            and pattern.search((REPO / f).read_text(errors="replace"))]
    assert hits == []
