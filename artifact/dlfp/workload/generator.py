"""The open-loop request workload shared by every backend (sim, emu, vllm).

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
  ``../shared/traces/mooncake_conversation_trace.jsonl``). The paper's
  "Agent" prompts are long agentic prompts whose length distribution it does
  not state; the Mooncake conversation trace (median 6,909, mean 12,035, max
  126,195 tokens) is the closest public stand-in. The table is
  ``dlfp/data/agent_prompt_quantiles.json``, derived by
  ``python -m dlfp.workload.profiles`` (the trace itself is never copied into
  the repository). Lengths are multiplied by ``wl.prompt_scale``, rounded, and
  clipped to ``[wl.min_prompt_tokens, wl.max_prompt_tokens]``. Poisson
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
import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dlfp.traces.format import REQUEST_COLUMNS, coerce

if TYPE_CHECKING:  # pragma: no cover
    from dlfp.config import TraceReplay, Workload

from dlfp.paths import DATA_DIR
AGENT_QUANTILES_PATH = DATA_DIR / "agent_prompt_quantiles.json"
#: Repository root (``artifact/dlfp/workload.py`` -> repo); relative trace paths resolve against it.
from dlfp.paths import REPO_ROOT

#: Lowest prompt token id drawn. Ids 0..9 are skipped so that no prompt starts
#: with a low id that some tokenizers reserve; Qwen3 keeps its special tokens at
#: the TOP of the vocabulary (>= 151,643, tokenizer_config.json), and engines
#: here run with ``skip_tokenizer_init`` and dummy weights, so the exact value is
#: immaterial as long as every arm uses the same one.
TOKEN_ID_LOW = 10
#: Tokens per Mooncake ``hash_ids`` block (Mooncake FAST'25 trace README).
MOONCAKE_BLOCK_TOKENS = 512

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
    """

    requests: tuple[RequestSpec, ...]
    fingerprint: str

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


def _fingerprint(requests: tuple[RequestSpec, ...]) -> str:
    h = hashlib.sha256(_FP_HEADER)
    h.update(struct.pack("<q", len(requests)))
    for r in requests:
        h.update(r.digest())
    return h.hexdigest()


# --------------------------------------------------------------------------- agent profile


@functools.lru_cache(maxsize=4)
def _load_quantile_table(path: str) -> tuple[np.ndarray, np.ndarray, str]:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
        probs = np.asarray(data["probabilities"], dtype=float)
        qs = np.asarray(data["quantiles"], dtype=float)
    except FileNotFoundError:
        raise WorkloadError(f"agent prompt-length table {p} is missing; run `python -m dlfp.workload.profiles`") from None
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
                         hi: int | None = None, table: str | Path = AGENT_QUANTILES_PATH) -> np.ndarray:
    """Draw ``n`` prompt lengths (int64, shape ``(n,)``) from the agent profile.

    Inverse-CDF sampling: ``u ~ U[0, 1)``, length = linear interpolation of the
    quantile table at ``u``, times ``scale``, rounded half-to-even, clipped to
    ``[lo, hi]``.
    """
    probs, qs, _ = _load_quantile_table(str(table))
    u = rng.random(n)
    x = np.rint(np.interp(u, probs, qs) * scale).astype(np.int64)
    return np.clip(x, lo, hi if hi is not None else np.iinfo(np.int64).max)


# --------------------------------------------------------------------------- trace replay


@dataclass(frozen=True)
class TraceRequest:
    """One row of a production trace: arrival (seconds, trace clock), lengths, prefix-block ids (may be empty)."""

    time_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def resolve_trace_path(path: str | Path) -> Path:
    """Absolute path of a trace file; a relative path resolves against the repository root
    (so ``../shared/traces/x.jsonl`` works from the repo root), falling back to the working directory."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    for base in (REPO_ROOT, Path.cwd()):
        if (base / p).exists():
            return (base / p).resolve()
    return (REPO_ROOT / p).resolve()


def _check_row(p: Path, where: str, r: TraceRequest, prev_time_s: float | None, ts_field: str,
               len_fields: tuple[str, str]) -> None:
    """Reject a trace row the replay cannot use: non-finite or decreasing time, negative lengths."""
    if not np.isfinite(r.time_s):
        raise WorkloadError(f"trace file {p} {where}: field {ts_field} is not a finite time")
    if prev_time_s is not None and r.time_s < prev_time_s:
        raise WorkloadError(f"trace file {p} {where}: field {ts_field} decreases (rows must be in time order)")
    for name, v in zip(len_fields, (r.input_length, r.output_length)):
        if v < 0:
            raise WorkloadError(f"trace file {p} {where}: field {name} is negative ({v})")


@functools.lru_cache(maxsize=8)
def _read_trace_cached(path: str, fmt: str, mtime_ns: int) -> tuple[TraceRequest, ...]:
    p = Path(path)
    if fmt == "mooncake":
        rows: list[TraceRequest] = []
        try:
            with p.open("rb") as f:
                for lineno, raw in enumerate(f, 1):
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        raise WorkloadError(f"trace file {p} line {lineno}: not UTF-8 text (a binary file?)") from None
                    if not line.strip():
                        continue
                    try:
                        d = json.loads(line)
                        r = TraceRequest(float(d["timestamp"]) / 1000.0, int(d["input_length"]),
                                         int(d["output_length"]), tuple(int(h) for h in d.get("hash_ids", ())))
                    except json.JSONDecodeError:
                        raise WorkloadError(f"trace file {p} line {lineno}: not valid JSON") from None
                    except KeyError as e:
                        raise WorkloadError(f"trace file {p} line {lineno}: missing field {e.args[0]!r} "
                                            "(mooncake needs timestamp, input_length, output_length)") from None
                    except (TypeError, ValueError, AttributeError, OverflowError):
                        raise WorkloadError(f"trace file {p} line {lineno}: a field has a non-numeric value") from None
                    _check_row(p, f"line {lineno}", r, rows[-1].time_s if rows else None, "timestamp",
                               ("input_length", "output_length"))
                    rows.append(r)
        except OSError as e:
            raise WorkloadError(f"trace file {p} cannot be read ({e.strerror or e})") from None
        return tuple(rows)
    if fmt == "azure":
        try:
            df = pd.read_csv(p)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise WorkloadError(f"trace file {p}: not a readable CSV ({str(e).splitlines()[0]})") from None
        except OSError as e:
            raise WorkloadError(f"trace file {p} cannot be read ({e.strerror or e})") from None
        need = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        missing = [c for c in need if c not in df.columns]
        if missing:
            raise WorkloadError(f"trace file {p}: missing column(s) {missing} (azure needs {need})")
        try:
            ts = pd.to_datetime(df["TIMESTAMP"], format="ISO8601")
            t = (ts - ts.iloc[0]).dt.total_seconds().to_numpy(dtype=float) if len(ts) else np.zeros(0)
            inp = pd.to_numeric(df["ContextTokens"], errors="raise").to_numpy(dtype=np.int64)
            out = pd.to_numeric(df["GeneratedTokens"], errors="raise").to_numpy(dtype=np.int64)
        except (ValueError, TypeError) as e:
            raise WorkloadError(f"trace file {p}: bad value ({str(e).splitlines()[0]})") from None
        rows = []
        for i, (a, b, c) in enumerate(zip(t, inp, out)):
            r = TraceRequest(float(a), int(b), int(c), ())
            # row i+1 counts data rows (the header is line 1, so row k is line k+1)
            _check_row(p, f"row {i + 1}", r, rows[-1].time_s if rows else None, "TIMESTAMP",
                       ("ContextTokens", "GeneratedTokens"))
            rows.append(r)
        return tuple(rows)
    raise WorkloadError(f"workload.trace.format: unknown trace format {fmt!r} (mooncake or azure)")


def load_trace(path: str | Path, fmt: str) -> tuple[TraceRequest, ...]:
    """Read a production trace file, rows in file order.

    Formats:
        * ``mooncake``: JSON lines with ``timestamp`` (ms from trace start),
          ``input_length``, ``output_length`` (tokens), ``hash_ids`` (512-token
          prefix-block ids; equal ids = shared prefix).
        * ``azure``: CSV with ``TIMESTAMP`` (date-time), ``ContextTokens``,
          ``GeneratedTokens`` (Azure LLM inference trace 2023); no prefix ids.

    Returns times in seconds on the trace's clock. Cached per (path, mtime).
    Rows must be in time order with finite times and non-negative lengths.

    Raises:
        WorkloadError: missing file or a directory, unknown format, garbled
            line/column, non-UTF-8 text, a non-finite or decreasing timestamp,
            a negative length (one line naming the file, the line or row and the field).
    """
    p = resolve_trace_path(path)
    if p.is_dir():
        raise WorkloadError(f"workload.trace.path: trace file {p} is a directory")
    if not p.is_file():
        raise WorkloadError(f"workload.trace.path: trace file {p} does not exist")
    return _read_trace_cached(str(p), fmt, p.stat().st_mtime_ns)


def common_hash_ids(rows: tuple[TraceRequest, ...] | list[TraceRequest]) -> frozenset[int]:
    """Hash ids present in EVERY row (e.g. Mooncake's id 0, a prompt prefix shared by the whole service).

    Empty when fewer than two rows carry hash ids.
    """
    with_ids = [r for r in rows if r.hash_ids]
    if len(with_ids) < 2:
        return frozenset()
    common = set(with_ids[0].hash_ids)
    for r in with_ids[1:]:
        common &= set(r.hash_ids)
        if not common:
            break
    return frozenset(common)


def nonmatching_rows(rows: list[TraceRequest] | tuple[TraceRequest, ...]) -> list[int]:
    """Indices of rows sharing no prefix block with any EARLIER row (the first row always qualifies).

    Blocks present in every row (:func:`common_hash_ids`) are ignored: in the
    Mooncake conversation trace every request starts with hash id 0, so a
    literal filter would keep only the first request. Rows without hash ids
    (Azure) never match. A rejected row's blocks still count as "seen" (it was
    served in the real trace, so its blocks were cached).
    """
    common = common_hash_ids(rows)
    seen: set[int] = set()
    keep = []
    for i, r in enumerate(rows):
        ids = set(r.hash_ids) - common
        if not (ids & seen):
            keep.append(i)
        seen |= ids
    return keep


def trace_start(tr: "TraceReplay", seed: int) -> int:
    """Rows of the trace skipped before the window for ``seed``.

    ``tr.start`` unless the config has a ``start_by_seed`` mapping (proposed
    TraceReplay field: seed -> start row, so paired seeds replay different
    windows instead of the same lengths and arrivals with different token ids).
    """
    by_seed = getattr(tr, "start_by_seed", None)
    if by_seed:
        if seed not in by_seed:
            raise WorkloadError(f"workload.trace.start_by_seed has no entry for seed {seed}")
        return int(by_seed[seed])
    return int(tr.start)


def _trace_instance_parts(wl: "Workload", seed: int, tok_rng: np.random.Generator):
    tr: TraceReplay = wl.trace  # type: ignore[assignment]
    start = trace_start(tr, seed)
    total = wl.num_warmup + wl.num_requests
    if tr.window and tr.window != total:
        raise WorkloadError(f"workload.trace.window ({tr.window}) must be 0 or equal num_warmup + num_requests "
                            f"({wl.num_warmup} + {wl.num_requests} = {total})")
    if tr.follow_hash_ids and tr.format == "azure":
        raise WorkloadError("workload.trace.follow_hash_ids: the azure format has no hash ids to follow")
    rows_all = load_trace(tr.path, tr.format)
    rows = list(rows_all[start:])  # in time order: load_trace rejects a decreasing timestamp
    idx = nonmatching_rows(rows) if tr.nonmatching else list(range(len(rows)))
    if len(idx) < total:
        raise WorkloadError(f"workload.trace: {tr.path} has only {len(idx)} usable requests after start={start}"
                            f"{' and the nonmatching filter' if tr.nonmatching else ''}; {total} needed")
    sel = [rows[i] for i in idx[:total]]
    t = np.array([r.time_s for r in sel], dtype=float)
    t = t - t[0]
    if total > 1:
        if t[-1] <= 0:
            raise WorkloadError(f"workload.trace: the {total} selected requests of {tr.path} all share one timestamp; "
                                "cannot time-scale to a rate")
        trace_rate = (total - 1) / t[-1]
        arrivals = t * (trace_rate / wl.rate)  # mean rate over the window == wl.rate
    else:
        arrivals = t
    hi = min(wl.max_prompt_tokens, tr.max_prompt_tokens)
    lengths = np.clip(np.rint(np.array([r.input_length for r in sel], dtype=float) * wl.prompt_scale).astype(np.int64),
                      wl.min_prompt_tokens, hi)
    if tr.use_trace_output_lengths:
        outs = np.maximum(np.array([r.output_length for r in sel], dtype=np.int64), 1)
    else:
        outs = np.full(total, wl.output_tokens, dtype=np.int64)
    if tr.follow_hash_ids:
        blocks: dict[int, np.ndarray] = {}
        ids_list = []
        for r, n in zip(sel, lengths):
            parts = []
            for h in r.hash_ids:
                if sum(len(x) for x in parts) >= n:
                    break
                if h not in blocks:
                    blocks[h] = tok_rng.integers(TOKEN_ID_LOW, wl.vocab_size, MOONCAKE_BLOCK_TOKENS, dtype=np.int64)
                parts.append(blocks[h])
            have = sum(len(x) for x in parts)
            if have < n:  # prompt_scale > 1 or missing ids: fresh tokens for the remainder
                parts.append(tok_rng.integers(TOKEN_ID_LOW, wl.vocab_size, int(n - have), dtype=np.int64))
            ids_list.append(np.concatenate(parts)[:n] if parts else np.zeros(0, dtype=np.int64))
    else:
        ids_list = _fresh_prompts(tok_rng, lengths, wl.vocab_size)
    return arrivals, lengths, outs, ids_list


# --------------------------------------------------------------------------- generator


def _fresh_prompts(rng: np.random.Generator, lengths: np.ndarray, vocab_size: int) -> list[np.ndarray]:
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


def make_workload(wl: "Workload", seed: int) -> WorkloadInstance:
    """Build the concrete workload for ``(wl, seed)``; deterministic.

    Returns ``num_warmup + num_requests`` requests sorted by arrival, warm-ups
    first. Output lengths are ``wl.output_tokens`` (``ignore_eos``) unless a
    trace replay asks for the trace's own.

    Raises:
        WorkloadError: a trace file is missing or garbled, has too few usable
            requests, or the workload cannot be built as asked (message names the field).
    """
    total = wl.num_warmup + wl.num_requests
    ss_arr, ss_len, ss_tok = np.random.SeedSequence(int(seed)).spawn(3)
    tok_rng = np.random.default_rng(ss_tok)
    if wl.kind == "trace":
        arrivals, lengths, outs, ids_list = _trace_instance_parts(wl, int(seed), tok_rng)
    else:
        gaps = np.random.default_rng(ss_arr).exponential(1.0 / wl.rate, size=total)
        arrivals = np.cumsum(gaps)
        if wl.kind == "fixed":
            n = int(np.clip(wl.prompt_tokens, wl.min_prompt_tokens, wl.max_prompt_tokens))  # type: ignore[arg-type]
            lengths = np.full(total, n, dtype=np.int64)
        elif wl.kind == "agent":
            lengths = sample_agent_lengths(np.random.default_rng(ss_len), total, scale=wl.prompt_scale,
                                           lo=wl.min_prompt_tokens, hi=wl.max_prompt_tokens)
        else:  # pragma: no cover - config validation forbids it
            raise WorkloadError(f"workload.kind: unknown kind {wl.kind!r}")
        outs = np.full(total, wl.output_tokens, dtype=np.int64)
        ids_list = _fresh_prompts(tok_rng, lengths, wl.vocab_size)
    reqs = []
    for i in range(total):
        warm = i < wl.num_warmup
        rid = f"w{i:04d}" if warm else f"r{i - wl.num_warmup:04d}"
        ids = ids_list[i]
        ids.setflags(write=False)
        reqs.append(RequestSpec(rid, float(arrivals[i]), ids, int(outs[i]), warm))
    requests = tuple(reqs)
    return WorkloadInstance(requests=requests, fingerprint=_fingerprint(requests))
