"""Trace replay: reading production traces (Mooncake JSONL, Azure LLM inference CSV) and building a workload
window from them (see ``dlfp.workload.generator`` for the semantics)."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dlfp.paths import REPO_ROOT
from dlfp.workload.requests import TOKEN_ID_LOW, WorkloadError, fresh_prompts

if TYPE_CHECKING:  # pragma: no cover
    from dlfp.config import TraceReplay, Workload

#: Tokens per Mooncake ``hash_ids`` block (Mooncake FAST'25 trace README).
MOONCAKE_BLOCK_TOKENS = 512


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
    (so ``data/workloads/x.jsonl`` works from anywhere in the checkout), falling back to the working directory."""
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
        raise WorkloadError(f"workload.trace.path: trace file {p} does not exist (a path relative to the repository "
                            f"root, e.g. data/workloads/mooncake_conversation_trace.jsonl, or an absolute one)")
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


def trace_instance_parts(wl: "Workload", seed: int, tok_rng: np.random.Generator):
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
    if tr.timing == "native":
        arrivals = t  # the trace's own inter-arrival times
    elif total > 1:
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
        ids_list = fresh_prompts(tok_rng, lengths, wl.vocab_size)
    return arrivals, lengths, outs, ids_list


def load_request_list(path: str | Path) -> list[tuple[float, int, int]]:
    """``(arrival_s, prompt_tokens, output_tokens)`` rows of a request-list CSV (header
    ``arrival_s,prompt_tokens,output_tokens``), sorted by arrival as given.

    Raises:
        WorkloadError: missing file, wrong header, a non-numeric or out-of-range value, or decreasing arrivals;
            one line naming the file and row.
    """
    p = resolve_trace_path(path)
    if not p.is_file():
        raise WorkloadError(f"workload.requests_csv: {p} does not exist")
    try:
        df = pd.read_csv(p)
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"workload.requests_csv: {p} is not a readable CSV ({type(e).__name__})") from None
    want = ["arrival_s", "prompt_tokens", "output_tokens"]
    if list(df.columns) != want:
        raise WorkloadError(f"workload.requests_csv: {p} has columns {list(df.columns)}; expected {want}")
    rows = []
    prev = 0.0
    for i, (a, n, m) in enumerate(df.itertuples(index=False), start=2):  # row 1 is the header
        try:
            a, nf, mf = float(a), float(n), float(m)
        except (TypeError, ValueError):
            raise WorkloadError(f"workload.requests_csv: {p} row {i}: not numbers") from None
        if not (nf.is_integer() and mf.is_integer()):
            raise WorkloadError(f"workload.requests_csv: {p} row {i}: prompt_tokens and output_tokens must be "
                                f"whole numbers of tokens")
        n, m = int(nf), int(mf)
        if not np.isfinite(a) or a < prev or n <= 0 or m <= 0:
            raise WorkloadError(f"workload.requests_csv: {p} row {i}: need arrival_s >= the previous row's, "
                                f"prompt_tokens > 0 and output_tokens > 0")
        rows.append((a, n, m))
        prev = a
    return rows
