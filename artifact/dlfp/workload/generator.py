"""The request workload shared by every backend (sim, emu, vllm).

``make_workload(wl, seed)`` turns a :class:`dlfp.config.Workload` and a seed
into a :class:`WorkloadInstance`: a tuple of :class:`RequestSpec` sorted by
arrival time, warm-up requests first (they are the first ``num_warmup``
arrivals of the same process and are excluded from metrics), then
``num_requests`` measured requests. The same ``(workload, seed)`` gives the
identical instance (same fingerprint) in every arm and on every machine.

Workload kinds
--------------
* ``fixed``: every prompt has ``wl.prompt_tokens`` tokens; Poisson arrivals.
* ``agent``: prompt lengths sampled by inverse-CDF interpolation from a
  quantile table of the ``input_length`` column of the public Mooncake
  conversation trace (FAST'25 release, Kimi production service,
  ``data/workloads/mooncake_conversation_trace.jsonl``). The paper's
  "Agent" prompts are long agentic prompts whose length distribution it does
  not state; the Mooncake conversation trace (median 6,909, mean 12,035, max
  126,195 tokens) is the closest public stand-in. The table is
  ``dlfp/data/agent_prompt_quantiles.json``, derived by
  ``python -m dlfp.workload.profiles`` from the shipped trace. Lengths are
  multiplied by ``wl.prompt_scale``, rounded, and clipped to ``[wl.min_prompt_tokens, wl.max_prompt_tokens]``. Poisson
  arrivals.
* ``trace``: replay of a production trace (Mooncake JSONL or Azure LLM
  inference CSV, :func:`load_trace`). Rows after ``trace.start`` are taken in
  time order; with ``trace.nonmatching`` only rows sharing no prefix block with
  an earlier row are kept (:func:`nonmatching_rows`); the first
  ``num_warmup + num_requests`` of them form the window (``trace.window`` must
  be 0 or that number). Arrivals are the window's timestamps minus the first,
  multiplied by one factor so the window's mean rate ``(n - 1) / t_last``
  equals ``wl.rate`` (burstiness is kept). Prompt lengths are ``input_length x
  prompt_scale`` clipped to ``[min_prompt_tokens, min(max_prompt_tokens,
  trace.max_prompt_tokens)]``; outputs are ``wl.output_tokens`` unless
  ``trace.use_trace_output_lengths``. Token ids are fresh (nonmatching) or,
  with ``trace.follow_hash_ids`` (Mooncake only), one fixed random 512-token
  block per hash id.

* ``requests``: an explicit request list, inline (``wl.requests``: arrival_s,
  prompt_tokens, output_tokens per request) or a CSV with those columns
  (``wl.requests_csv``); taken as given: no rate, no clipping.

* ``burst``: every request arrives at t = 0 (``vllm bench serve --request-rate inf``); prompt lengths as
  ``agent`` or ``fixed`` give them (``wl.prompts``).
* ``closed_loop``: ``wl.concurrency`` clients (``vllm bench serve --max-concurrency``). The instance's
  arrivals are RELEASE times: the Poisson process of ``wl.rate`` (the same stream, hence the same times, as
  ``fixed``/``agent`` at that rate) or all 0 without a rate; a backend sends request ``i`` at
  ``max(release_i, the time a client slot frees)`` and records that send time as its arrival in the trace
  (``dlfp.backends.sim.engine``, ``dlfp.backends.harness``). Prompt lengths as for ``burst``.

With ``trace.timing: native`` a replay keeps the trace's own timestamps
(shifted to start at 0) instead of time-scaling them to ``wl.rate``.

Arrivals (``fixed``/``agent``): a Poisson process of rate ``wl.rate``
requests/s: exponential inter-arrival gaps of mean ``1/wl.rate`` s, the first
arrival one gap after t = 0. Times are seconds from the trial start.

Token ids: every prompt gets fresh uniformly random ids in
``[TOKEN_ID_LOW, wl.vocab_size)``, and the FIRST id of each prompt is drawn
without replacement, so no two prompts of an instance share even their first
token: no prefix-cache block can ever match ("nonmatching" prompts, as in the
paper). With ``trace.follow_hash_ids`` a Mooncake replay instead maps every
512-token ``hash_id`` to one fixed block of random ids (same id -> same
block), so the trace's prefix sharing is reproduced exactly.

Random streams: one ``numpy.random.SeedSequence(seed)`` is split into
independent streams for arrivals, lengths and token ids, so changing e.g. the
length profile does not move arrival times. Each stream is consumed in request
order, so adding requests at the end leaves earlier ones unchanged.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dlfp.paths import DATA_DIR, REPO_ROOT  # noqa: F401  (REPO_ROOT: relative paths resolve against it)
from dlfp.workload.replay import (MOONCAKE_BLOCK_TOKENS, TraceRequest, common_hash_ids,  # noqa: F401
                                  load_request_list, load_trace, nonmatching_rows, resolve_trace_path,
                                  trace_instance_parts, trace_start)
from dlfp.workload.requests import (TOKEN_ID_LOW, RequestSpec, WorkloadError, WorkloadInstance,  # noqa: F401
                                    fingerprint, fresh_prompts)

if TYPE_CHECKING:  # pragma: no cover
    from dlfp.config import Workload

AGENT_QUANTILES_PATH = DATA_DIR / "agent_prompt_quantiles.json"

# --------------------------------------------------------------------------- agent profile


@functools.lru_cache(maxsize=4)
def _load_quantile_table(path: str) -> tuple[np.ndarray, np.ndarray, str]:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
        probs = np.asarray(data["probabilities"], dtype=float)
        qs = np.asarray(data["quantiles"], dtype=float)
    except FileNotFoundError:
        raise WorkloadError(f"agent prompt-length table {p} is missing; "
                            f"run `python -m dlfp.workload.profiles`") from None
    except (ValueError, KeyError, TypeError) as e:
        raise WorkloadError(f"agent prompt-length table {p} is not valid: {e}") from None
    if (probs.ndim != 1 or probs.shape != qs.shape or probs.size < 2 or probs[0] != 0.0 or probs[-1] != 1.0
            or np.any(np.diff(probs) <= 0) or np.any(np.diff(qs) < 0)):
        raise WorkloadError(f"agent prompt-length table {p}: probabilities must rise from 0 to 1 and "
                            "quantiles must not decrease")
    return probs, qs, str(data.get("source", ""))


def agent_quantile_table(path: str | Path = AGENT_QUANTILES_PATH) -> tuple[np.ndarray, np.ndarray]:
    """The agent prompt-length quantile table: ``(probabilities, quantiles_tokens)``, both shape ``(K,)``.

    Raises:
        WorkloadError: the table file is missing or malformed.
    """
    probs, qs, _ = _load_quantile_table(str(path))
    return probs.copy(), qs.copy()


def sample_agent_lengths(rng: np.random.Generator, n: int, *, scale: float = 1.0, lo: int = 1,
                         hi: int | None = None, table: str | Path = AGENT_QUANTILES_PATH,
                         source: str = "mooncake-conversation") -> np.ndarray:
    """Draw ``n`` prompt lengths (int64, shape ``(n,)``) from the agent profile.

    Inverse-CDF sampling: ``u ~ U[0, 1)``, length = linear interpolation of the
    quantile table at ``u``, times ``scale``, rounded half-to-even, clipped to
    ``[lo, hi]``. The table is ``table`` for the default ``source``, else the quantiles of that source's shipped
    trace (``dlfp.workload.profiles.source_quantiles``).

    Raises:
        WorkloadError: a missing or malformed table, an unknown source.
    """
    if source == "mooncake-conversation":
        probs, qs, _ = _load_quantile_table(str(table))
    else:
        from dlfp.workload.profiles import source_quantiles

        probs, qs = source_quantiles(source)
    u = rng.random(n)
    x = np.rint(np.interp(u, probs, qs) * scale).astype(np.int64)
    return np.clip(x, lo, hi if hi is not None else np.iinfo(np.int64).max)





def request_list_parts(wl: "Workload", tok_rng: np.random.Generator):
    """Arrivals, prompt lengths and output lengths of an explicit request list (inline or CSV), with fresh
    nonmatching prompt ids; the list is taken as given (no clipping, no rate).

    Raises:
        WorkloadError: a bad CSV, decreasing arrivals, or a row count that is not num_warmup + num_requests.
    """
    if wl.requests is not None:
        rows = [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in wl.requests]
    else:
        rows = load_request_list(wl.requests_csv)
    total = wl.num_warmup + wl.num_requests
    if len(rows) != total:
        raise WorkloadError(f"workload.requests_csv: {wl.requests_csv} has {len(rows)} rows, but num_warmup + "
                            f"num_requests = {total}")
    arrivals = np.array([r[0] for r in rows], dtype=float)
    if np.any(np.diff(arrivals) < 0):
        raise WorkloadError("workload.requests: arrival_s must not decrease from one request to the next")
    lengths = np.array([r[1] for r in rows], dtype=np.int64)
    outs = np.array([r[2] for r in rows], dtype=np.int64)
    return arrivals, lengths, outs, fresh_prompts(tok_rng, lengths, wl.vocab_size)


def make_workload(wl: "Workload", seed: int) -> WorkloadInstance:
    """Build the concrete workload for ``(wl, seed)``; deterministic.

    Returns ``num_warmup + num_requests`` requests sorted by arrival, warm-ups
    first; for a closed loop the arrivals are release times and the instance's
    ``concurrency`` its number of clients. Output lengths are ``wl.output_tokens`` (``ignore_eos``) unless a
    trace replay asks for the trace's own.

    Raises:
        WorkloadError: a trace file is missing or garbled, has too few usable
            requests, or the workload cannot be built as asked (message names the field).
    """
    total = wl.num_warmup + wl.num_requests
    ss_arr, ss_len, ss_tok = np.random.SeedSequence(int(seed)).spawn(3)
    tok_rng = np.random.default_rng(ss_tok)
    if wl.kind == "trace":
        arrivals, lengths, outs, ids_list = trace_instance_parts(wl, int(seed), tok_rng)
    elif wl.kind == "requests":
        arrivals, lengths, outs, ids_list = request_list_parts(wl, tok_rng)
    else:
        if wl.uses_rate():
            gaps = np.random.default_rng(ss_arr).exponential(1.0 / wl.rate, size=total)
            arrivals = np.cumsum(gaps)
        else:  # a burst, or a closed loop released as fast as its slots free (bench serve's --request-rate inf)
            arrivals = np.zeros(total)
        prompts = wl.prompt_lengths()
        if prompts == "fixed":
            n = int(np.clip(wl.prompt_tokens, wl.min_prompt_tokens, wl.max_prompt_tokens))  # type: ignore[arg-type]
            lengths = np.full(total, n, dtype=np.int64)
        elif prompts == "agent":
            lengths = sample_agent_lengths(np.random.default_rng(ss_len), total, scale=wl.prompt_scale,
                                           lo=wl.min_prompt_tokens, hi=wl.max_prompt_tokens,
                                           source=wl.prompt_source)
        else:  # pragma: no cover - config validation forbids it
            raise WorkloadError(f"workload.kind: unknown kind {wl.kind!r}")
        outs = np.full(total, wl.output_tokens, dtype=np.int64)
        ids_list = fresh_prompts(tok_rng, lengths, wl.vocab_size)
    reqs = []
    for i in range(total):
        warm = i < wl.num_warmup
        rid = f"w{i:04d}" if warm else f"r{i - wl.num_warmup:04d}"
        ids = ids_list[i]
        ids.setflags(write=False)
        reqs.append(RequestSpec(rid, float(arrivals[i]), ids, int(outs[i]), warm))
    requests = tuple(reqs)
    return WorkloadInstance(requests=requests, fingerprint=fingerprint(requests),
                            concurrency=wl.concurrency if wl.kind == "closed_loop" else None)
