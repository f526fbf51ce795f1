"""Token ids of the modelled backends (simulator and emulator): a deterministic function of (request, index).

The modelled device computes no logits, so an output token is a hash: splitmix64 of
``h(request_id) + index * 0x9E3779B97F4A7C15`` modulo ``vocab_size``, with ``h`` the first 8 bytes (little endian)
of BLAKE2b(request_id). It depends only on the request's external id and the output index, so a preempted and
recomputed request, the same request in another arm, and the same request on the other modelled backend all get
the same ids. Token-id agreement between arms of a modelled backend therefore holds by construction.
"""
from __future__ import annotations

import hashlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _request_hash(request_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "little")


def token_ids(request_ids: np.ndarray, index: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids (int64, shape of ``index``) of output token ``index[i]`` (0-based) of request ``request_ids[i]``.

    Raises:
        ValueError: a negative index or a non-positive vocabulary size.
    """
    index = np.asarray(index)
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if index.size and index.min() < 0:
        raise ValueError(f"output index must be >= 0, got {int(index.min())}")
    uniq, inv = np.unique(np.asarray(request_ids), return_inverse=True)
    seeds = np.array([_request_hash(str(u)) for u in uniq], dtype=np.uint64)
    z = seeds[inv] + index.astype(np.uint64) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(vocab_size)).astype(np.int64)


def token_id(request_id: str, index: int, vocab_size: int) -> int:
    """One token id (``token_ids`` of a single token), for the emulator's per-step output.

    Raises:
        ValueError: a negative index or a non-positive vocabulary size.
    """
    return int(token_ids(np.array([request_id]), np.array([index]), vocab_size)[0])
