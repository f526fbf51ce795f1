"""The request list every workload produces: ``RequestSpec``, ``WorkloadInstance`` and its fingerprint, and fresh
(nonmatching) prompt token ids."""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlfp.traces.format import REQUEST_COLUMNS, coerce

#: Lowest prompt token id drawn. Ids 0..9 are skipped so that no prompt starts
#: with a low id that some tokenizers reserve; Qwen3 keeps its special tokens at
#: the TOP of the vocabulary (>= 151,643, tokenizer_config.json), and engines
#: here run with ``skip_tokenizer_init`` and dummy weights, so the exact value is
#: immaterial as long as every arm uses the same one.
TOKEN_ID_LOW = 10

_FP_HEADER = b"dlfp-workload-v1"


class WorkloadError(ValueError):
    """A workload that cannot be built (bad trace file, too few requests, ...); one line naming the cause."""


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload.

    Attributes:
        request_id: unique within the instance (``w0003`` warm-up, ``r0042`` measured).
        arrival_s: arrival time, seconds from the trial start (t = 0).
        prompt_token_ids: int64 array of shape ``(prompt_tokens,)``.
        output_tokens: tokens to generate (``ignore_eos``: exactly this many).
        warmup: True for warm-up requests (excluded from metrics).
    """

    request_id: str
    arrival_s: float
    prompt_token_ids: np.ndarray
    output_tokens: int
    warmup: bool

    @property
    def prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return int(self.prompt_token_ids.shape[0])

    def digest(self) -> bytes:
        """The bytes the fingerprints hash: lengths, warm-up flag, arrival (float64) and token ids (int64 LE)."""
        head = struct.pack("<qq?d", self.prompt_tokens, int(self.output_tokens), bool(self.warmup),
                           float(self.arrival_s))
        return head + np.ascontiguousarray(self.prompt_token_ids, dtype="<i8").tobytes()

    def fingerprint(self) -> str:
        """sha256 hex of :meth:`digest` (one request)."""
        return hashlib.sha256(self.digest()).hexdigest()


@dataclass(frozen=True)
class WorkloadInstance:
    """A concrete workload: requests sorted by arrival (warm-ups first) and its fingerprint.

    ``fingerprint`` is the sha256 hex over, for every request in order, its
    prompt length, output tokens, warm-up flag, arrival time (float64) and
    prompt token ids (int64): equal fingerprints mean byte-identical workloads.
    ``concurrency`` is the number of clients of a closed loop (``None``: open loop,
    every request sent at its ``arrival_s``); a closed loop's ``arrival_s`` are
    release times (``dlfp.workload.generator``). It is not part of the fingerprint,
    which describes the requests; the experiment's config records it.
    """

    requests: tuple[RequestSpec, ...]
    fingerprint: str
    concurrency: int | None = None

    @property
    def measured(self) -> tuple[RequestSpec, ...]:
        """Requests that count for metrics."""
        return tuple(r for r in self.requests if not r.warmup)

    @property
    def warmups(self) -> tuple[RequestSpec, ...]:
        """Warm-up requests (excluded from metrics)."""
        return tuple(r for r in self.requests if r.warmup)

    def requests_frame(self) -> pd.DataFrame:
        """One row per request with the trace format's ``REQUEST_COLUMNS``.

        ``finished`` is False (a backend sets it); ``fingerprint`` is the
        workload's fingerprint in every row (``dlfp.traces.format`` validates that it is
        one value). Per-request hashes: :meth:`RequestSpec.fingerprint`.
        """
        df = pd.DataFrame({
            "request_id": [r.request_id for r in self.requests],
            "arrival_s": [r.arrival_s for r in self.requests],
            "prompt_tokens": [r.prompt_tokens for r in self.requests],
            "output_tokens": [r.output_tokens for r in self.requests],
            "warmup": [r.warmup for r in self.requests],
            "finished": [False] * len(self.requests),
            "fingerprint": [self.fingerprint] * len(self.requests),
        })
        return coerce(df, REQUEST_COLUMNS, "requests")


def fingerprint(requests: tuple[RequestSpec, ...]) -> str:
    h = hashlib.sha256(_FP_HEADER)
    h.update(struct.pack("<q", len(requests)))
    for r in requests:
        h.update(r.digest())
    return h.hexdigest()



def fresh_prompts(rng: np.random.Generator, lengths: np.ndarray, vocab_size: int) -> list[np.ndarray]:
    """Random prompts of the given lengths whose first ids are pairwise distinct (no shared prefix)."""
    span = vocab_size - TOKEN_ID_LOW
    if len(lengths) > span:
        raise WorkloadError(f"workload: {len(lengths)} requests exceed the {span} distinct first token ids of "
                            f"vocab_size={vocab_size}")
    firsts = rng.choice(span, size=len(lengths), replace=False).astype(np.int64) + TOKEN_ID_LOW
    out = []
    for f, n in zip(firsts, lengths):
        ids = np.empty(int(n), dtype=np.int64)
        ids[0] = f
        ids[1:] = rng.integers(TOKEN_ID_LOW, vocab_size, int(n) - 1, dtype=np.int64)
        out.append(ids)
    return out
