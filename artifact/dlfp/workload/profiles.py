"""Derive the ``agent`` prompt-length quantile table from the public Mooncake trace.

Usage (from the repository root)::

    python -m dlfp.workload.profiles            # writes dlfp/data/agent_prompt_quantiles.json
    python -m dlfp.workload.profiles --check    # exit 1 if the committed table differs

Source: ``data/workloads/mooncake_conversation_trace.jsonl`` (shipped unchanged) = Mooncake
FAST'25 release, ``FAST25-release/traces/conversation_trace.jsonl`` in
kvcache-ai/Mooncake (Kimi production conversation service, Apache-2.0),
column ``input_length`` (tokens), all 12,031 rows.

Method: ``numpy.quantile`` (method ``linear``) of ``input_length`` at
probabilities 0.00, 0.01, ..., 0.99 and 0.991, ..., 1.000 (the tail is
finer because the distribution is heavy-tailed), rounded to 0.001 token.
``dlfp.workload.generator`` samples from it by linear inverse-CDF interpolation.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from dlfp.workload.generator import AGENT_QUANTILES_PATH, REPO_ROOT, load_trace

DEFAULT_TRACE = "data/workloads/mooncake_conversation_trace.jsonl"
SOURCE = ("Mooncake FAST'25 release, FAST25-release/traces/conversation_trace.jsonl in kvcache-ai/Mooncake "
          "(Kimi production conversation service, Apache-2.0); column input_length; read from "
          "data/workloads/mooncake_conversation_trace.jsonl")


#: Prompt-length sources of the agent profile: name -> (shipped trace, format, description). The default,
#: ``mooncake-conversation``, is the committed table ``dlfp/data/agent_prompt_quantiles.json``; the others are
#: derived from their shipped trace the same way when first used (``source_quantiles``).
PROMPT_SOURCES: dict[str, tuple[str, str, str]] = {
    "mooncake-conversation": (DEFAULT_TRACE, "mooncake", "Mooncake conversation trace, input_length"),
    "mooncake-synthetic": ("data/workloads/mooncake_synthetic_trace.jsonl", "mooncake",
                           "Mooncake synthetic trace, input_length"),
    "azure-code": ("data/workloads/azure_llm_2023_code.csv", "azure", "Azure LLM 2023 code trace, ContextTokens"),
    "azure-conversation": ("data/workloads/azure_llm_2023_conv.csv", "azure",
                           "Azure LLM 2023 conversation trace, ContextTokens"),
}
DEFAULT_PROMPT_SOURCE = "mooncake-conversation"


def probability_grid() -> np.ndarray:
    """The table's probabilities, shape (110,): 0.00..0.99 step 0.01, then 0.991..1.000 step 0.001."""
    coarse = np.round(np.arange(100) / 100, 3)
    fine = np.round(0.99 + np.arange(1, 11) / 1000, 3)
    return np.concatenate([coarse, fine])


def source_quantiles(source: str) -> tuple[np.ndarray, np.ndarray]:
    """``(probabilities, quantiles_tokens)``, shape ``(110,)`` each, of a prompt-length source (``PROMPT_SOURCES``).

    The default source reads the committed table; the others derive it from their shipped trace with
    :func:`derive_agent_quantiles` (same grid and method), once per process.

    Raises:
        WorkloadError: an unknown source (lists the known ones), or its trace is missing or garbled.
    """
    from dlfp.workload.generator import WorkloadError, agent_quantile_table

    if source not in PROMPT_SOURCES:
        raise WorkloadError(f"field workload.prompt_source: unknown source {source!r}; known: "
                            f"{', '.join(PROMPT_SOURCES)}")
    if source == DEFAULT_PROMPT_SOURCE:
        return agent_quantile_table()
    probs, qs = _derived_quantiles(source)
    return probs.copy(), qs.copy()


@functools.lru_cache(maxsize=None)
def _derived_quantiles(source: str) -> tuple[np.ndarray, np.ndarray]:
    path, fmt, _ = PROMPT_SOURCES[source]
    table = derive_agent_quantiles(path, fmt)
    return np.asarray(table["probabilities"], dtype=float), np.asarray(table["quantiles"], dtype=float)


def derive_agent_quantiles(trace_path: str | Path = DEFAULT_TRACE, fmt: str = "mooncake") -> dict:
    """The quantile table of Mooncake ``input_length`` as a JSON-ready dict.

    Keys: ``source``, ``trace_sha256``, ``rows``, ``column``, ``method``,
    ``summary`` (median/mean/max), ``probabilities``, ``quantiles`` (tokens).

    Raises:
        dlfp.workload.generator.WorkloadError: the trace is missing or garbled.
    """
    rows = load_trace(trace_path, fmt)
    x = np.array([r.input_length for r in rows], dtype=float)
    p = probability_grid()
    q = np.round(np.quantile(x, p, method="linear"), 3)
    from dlfp.workload.generator import resolve_trace_path

    digest = hashlib.sha256(resolve_trace_path(trace_path).read_bytes()).hexdigest()
    return {
        "source": SOURCE if str(trace_path) == DEFAULT_TRACE else f"{trace_path} ({fmt} format)",
        "trace_sha256": digest,
        "rows": int(x.size),
        "column": "input_length",
        "method": "numpy.quantile(method='linear'), rounded to 0.001; sampled by linear inverse-CDF interpolation",
        "summary": {"median": float(np.median(x)), "mean": round(float(x.mean()), 3), "max": float(x.max()),
                    "min": float(x.min())},
        "probabilities": [float(v) for v in p],
        "quantiles": [float(v) for v in q],
    }


def write_json_atomic(obj: dict, path: Path) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (``dlfp.analysis.markdown.atomic_write``)."""
    from dlfp.analysis.markdown import atomic_write

    atomic_write(path, json.dumps(obj, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlfp.workload.profiles", description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=DEFAULT_TRACE, help=f"Mooncake JSONL (default {DEFAULT_TRACE}, "
                    f"relative to {REPO_ROOT})")
    ap.add_argument("--out", type=Path, default=AGENT_QUANTILES_PATH)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing")
    a = ap.parse_args(argv)
    try:
        table = derive_agent_quantiles(a.trace)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.check:
        try:
            old = json.loads(a.out.read_text())
        except (OSError, ValueError) as e:
            print(f"error: cannot read {a.out}: {e}", file=sys.stderr)
            return 2
        same = old.get("probabilities") == table["probabilities"] and old.get("quantiles") == table["quantiles"]
        print(f"{a.out}: {'matches' if same else 'DIFFERS FROM'} the trace ({table['rows']} rows)")
        return 0 if same else 1
    write_json_atomic(table, a.out)
    s = table["summary"]
    print(f"wrote {a.out}: {len(table['quantiles'])} quantiles from {table['rows']} rows "
          f"(median {s['median']:.0f}, mean {s['mean']:.0f}, max {s['max']:.0f} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
