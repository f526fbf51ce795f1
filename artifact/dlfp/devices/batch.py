"""Batch features: the one place every backend and study computes them.

A scheduled request contributes a chunk of ``c`` new tokens after ``p`` tokens already in its KV cache
(a decode is ``c = 1`` with ``p`` = its context before the new token). The device models are functions of
four aggregate features of an iteration:

* ``tokens``: sum of ``c`` (rows through the linear layers);
* ``sampled``: LM-head rows (decodes plus final prefill chunks);
* ``attn_pairs``: causal query-key pairs, ``c * p + c (c + 1) / 2`` per chunk (a decode: ``p + 1``);
* ``kv_tokens``: cached tokens read by attention, ``p`` per chunk.

The kernel-launch rule (CUDA graph, piecewise graphs or eager) that goes with these features is
``dlfp.devices.host.HostCosts.launch_rule``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from dlfp.devices.specs import CostModelError


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


def scheduled_features(entries) -> tuple[int, int, float, float, int, int, int]:
    """``features`` of a simulator schedule, plus the prefill/decode split, in one pass.

    Args:
        entries: ``(request, new_tokens, computed_before, is_decode, sampled)`` per scheduled request, as
            ``dlfp.backends.sim.scheduler.Scheduler.schedule`` returns them.

    Returns:
        ``(tokens, sampled, attn_pairs, kv_tokens, prefill_tokens, num_prefills, num_decodes)``; the pair and KV
        counts follow ``chunk_pairs`` (a decode of context ``p`` has ``p + 1`` pairs and reads ``p`` tokens).
    """
    tokens = ptok = npf = nd = sampled = 0
    pairs = kv = 0.0
    for _r, k, c, dec, smp in entries:
        tokens += k
        if smp:
            sampled += 1
        if dec:
            nd += 1
            pairs += c + 1
            kv += c
        else:
            npf += 1
            ptok += k
            pairs += k * c + k * (k + 1) * 0.5
            kv += c
    return tokens, sampled, pairs, kv, ptok, npf, nd


@dataclass(frozen=True)
class Batch:
    """One iteration's work, as the device cost models take it.

    Attributes:
        prefill: sequence of ``(chunk_tokens, context_tokens)``: a prefill chunk
            of ``chunk_tokens`` new tokens after ``context_tokens`` already in
            the KV cache.
        decodes: context length (tokens in the KV cache including the new one)
            of each decoding request.
        sampled: number of sampled tokens (LM-head rows); defaults to
            ``len(decodes)`` + number of prefill chunks (each chunk treated as
            final) when ``None``.
    """

    prefill: Sequence[tuple[int, int]] = ()
    decodes: Sequence[int] = ()
    sampled: int | None = None


def batch_counts(batch: Batch) -> tuple[int, int, float, float]:
    """``(tokens, sampled, attn_pairs, kv_read_tokens)`` of a ``Batch`` (``features``; a decode with context ``n``,
    including itself, is a chunk of 1 token after ``n - 1``).

    Raises:
        CostModelError: a chunk of zero tokens, a negative context, or a non-positive decode context.
    """
    for c, p in batch.prefill:
        if c <= 0 or p < 0:
            raise CostModelError(f"field prefill: chunk ({c}, {p}) needs tokens > 0 and context >= 0")
    for n in batch.decodes:
        if n <= 0:
            raise CostModelError(f"field decodes: context length must be positive, got {n}")
    chunks = [(c, p, True) for c, p in batch.prefill] + [(1, n - 1, True) for n in batch.decodes]
    tokens, sampled, pairs, kv, _ = features(chunks)
    return tokens, (batch.sampled if batch.sampled is not None else sampled), pairs, kv
