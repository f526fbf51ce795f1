"""Batch features and the kernel-launch rule: the one place every backend and study computes them.

A scheduled request contributes a chunk of ``c`` new tokens after ``p`` tokens already in its KV cache
(a decode is ``c = 1`` with ``p`` = its context before the new token). The device models are functions of
four aggregate features of an iteration:

* ``tokens``: sum of ``c`` (rows through the linear layers);
* ``sampled``: LM-head rows (decodes plus final prefill chunks);
* ``attn_pairs``: causal query-key pairs, ``c * p + c (c + 1) / 2`` per chunk (a decode: ``p + 1``);
* ``kv_tokens``: cached tokens read by attention, ``p`` per chunk.

The launch rule follows vLLM 0.17.1's CUDA-graph modes (``vllm/config/compilation.py``): a decode-only batch of
at most ``cudagraph_max_tokens`` tokens replays one FULL graph; a mixed batch of at most that many tokens runs
PIECEWISE graphs (attention launched eagerly between pieces); a larger batch runs eagerly.
"""
from __future__ import annotations

from typing import Iterable

GRAPH = "graph"
PIECEWISE = "piecewise"
EAGER = "eager"


def chunk_pairs(c: int, p: int) -> float:
    """Causal attention pairs of a chunk of ``c`` new tokens after ``p`` cached ones: ``c p + c (c + 1) / 2``."""
    return c * p + c * (c + 1) * 0.5


def features(chunks: Iterable[tuple[int, int, bool]]) -> tuple[int, int, float, float, int]:
    """Aggregate ``(tokens, sampled, attn_pairs, kv_tokens, num_chunks)`` of one iteration.

    Args:
        chunks: ``(new_tokens, computed_before, sampled)`` per scheduled request.

    Raises:
        ValueError: ``new_tokens <= 0`` or ``computed_before < 0``, naming the chunk.
    """
    tokens = sampled = n = 0
    pairs = kv = 0.0
    for c, p, s in chunks:
        if c <= 0 or p < 0:
            raise ValueError(f"chunk ({c}, {p}): needs new_tokens > 0 and computed_before >= 0")
        tokens += c
        sampled += bool(s)
        pairs += c * p + c * (c + 1) * 0.5
        kv += p
        n += 1
    return tokens, sampled, pairs, kv, n


def launch_kind(num_tokens: int, num_prefills: int, cudagraph_max_tokens: int) -> str:
    """``GRAPH``, ``PIECEWISE`` or ``EAGER`` for a batch of ``num_tokens`` with ``num_prefills`` prefill chunks."""
    if num_tokens <= cudagraph_max_tokens:
        return GRAPH if num_prefills == 0 else PIECEWISE
    return EAGER
