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

from dlfp.hostinfo import VECTOR_FLAG_PREFIXES, identity_record
from dlfp.paths import HARDWARE_DIR
from dlfp.studies.calibration.features import DEVICE_TERMS, CalibrationError, predict_execute
from dlfp.studies.calibration.fit import FitResult, fit_device, fit_device_parts, fit_host, residual_stats

DEFAULT_PROFILE = HARDWARE_DIR / "cpu-calibrated.yaml"
DEFAULT_KEY = "cpu"


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
    """This machine: CPU model name and cores (``/proc/cpuinfo``, ``os.cpu_count``), OS, Python, date, versions,
    and its host identity (``identity``, ``host_key``: ``dlfp.hostinfo``, the same fields a real-engine trial
    records)."""
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
            "versions": package_versions(), "loadavg_at_end": load, **identity_record()}


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
    source = ("fitted by `dlfp calibrate` (dlfp.studies.calibration): non-negative least squares on relative "
              "residuals over timed steps of the real vLLM engine on this machine")
    method = ("device terms: scipy.optimize.nnls on residuals / modelled (IRLS from residuals / measured), fitted "
              "to the model runner's forward + LM head + sampler time of each step; host terms likewise, each "
              "fitted to the measured part of the step it names; medians for engine_loop_s, frontend_output_s "
              "and ingest_s; fitted on the fitted step shapes of the grid, residuals reported on the held-out "
              "shapes")
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
        "fitted": {**{k: float(device.coef[k]) for k, _ in DEVICE_TERMS},
                   **({"lm_head_rows": [int(r) for r in device.coef["lm_head_rows"]],
                       "lm_head_s": [float(v) for v in device.coef["lm_head_s"]]}
                      if device.coef.get("lm_head_rows") else {})},
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


def _residuals_by_kind(steps: pd.DataFrame, col: str = "predicted_s",
                       target: str = "execute_s") -> dict[str, dict[str, dict[str, float]]]:
    """``{kind: {"in_sample": residual_stats, "held_out": residual_stats}}`` of ``steps[col]`` against ``target``."""
    by_kind = {}
    for kind, g in steps.groupby("kind"):
        fitted, held = g[~g["held_out"]], g[g["held_out"]]
        by_kind[kind] = {"in_sample": residual_stats(fitted[target].to_numpy(), fitted[col].to_numpy()),
                         "held_out": residual_stats(held[target].to_numpy(), held[col].to_numpy())}
    return by_kind


def held_out_mask(steps: pd.DataFrame, grid: dict | None, fit_repeats: Sequence[int] | None = None) -> np.ndarray:
    """True for the steps the fit must not see, shape ``(len(steps),)``.

    With ``fit_repeats`` (or a grid whose phases carry no ``held_out`` flag: measurements of an older grid), the
    held-out steps are those of the other repeats; otherwise those of the held-out phases (step shapes).
    """
    if split_by_phase(grid, fit_repeats):
        held_idx = [i for i, p in enumerate(grid["phases"]) if p.get("held_out")]
        return steps["phase"].isin(held_idx).to_numpy()
    return ~steps["repeat"].isin(list(fit_repeats if fit_repeats is not None else (0,))).to_numpy()


def split_by_phase(grid: dict | None, fit_repeats: Sequence[int] | None = None) -> bool:
    """True when ``held_out_mask`` holds out phases (step shapes), False when it holds out repeats."""
    phases = (grid or {}).get("phases") or []
    return fit_repeats is None and any("held_out" in p for p in phases)


def phase_table(steps: pd.DataFrame, grid: dict | None, col: str = "device_s") -> pd.DataFrame:
    """Per grid phase, the repeat-to-repeat spread of its median step time ``col`` (seconds).

    One row per (phase, step kind) with steps in every repeat: ``phase``, ``kind`` (decode / mixed / prefill),
    ``batch``, ``prompt``, ``held_out``, ``repeats``, ``steps`` (per repeat, mean), ``mean_s`` (mean over repeats
    of the per-repeat median), ``ci_low_s`` / ``ci_high_s`` (95 % Student-t interval of that mean; NaN for one
    repeat), ``rel_halfwidth`` (half-width / mean).
    """
    from scipy import stats as sst

    phases = (grid or {}).get("phases") or []
    rows = []
    for (ph, kind), g in steps.groupby(["phase", "kind"]):
        if ph < 0 or not np.isfinite(g[col]).any():
            continue
        per = g.groupby("repeat")[col].median().dropna()
        n = len(per)
        m = float(per.mean())
        if n >= 2:
            h = float(sst.t.ppf(0.975, n - 1) * per.std(ddof=1) / np.sqrt(n))
        else:
            h = float("nan")
        spec = phases[int(ph)] if int(ph) < len(phases) else {}
        rows.append({"phase": int(ph), "kind": kind, "phase_kind": spec.get("kind"), "batch": spec.get("batch"),
                     "prompt": spec.get("prompt"), "held_out": bool(spec.get("held_out", False)), "repeats": n,
                     "steps": len(g) / max(n, 1), "mean_s": m, "ci_low_s": m - h, "ci_high_s": m + h,
                     "rel_halfwidth": h / m if m > 0 else float("nan")})
    return pd.DataFrame(rows)


def calibrate(meas: dict[str, Any], *, model: str = "qwen3-tiny", fit_repeats: Sequence[int] | None = None,
              machine: dict | None = None) -> tuple[dict, FitResult, pd.DataFrame]:
    """Fit the profile from ``run_grid``'s measurements.

    The fit sees the steps of the fitted phases (step shapes); the held-out phases' steps are only predicted
    (``held_out_mask``; with ``fit_repeats``, or measurements of a grid without held-out phases, the split is
    by repeat instead). Steps outside any phase (the engine warm-up, ``repeat == -1``) are dropped.

    With the model runner's parts in the measurements, the device coefficients are fitted to ``device_s``
    (forward pass, LM head, sampler) and the host fields to their own parts (``fit_host``); the whole step
    from ``schedule()``'s end to ``update_from_output`` is then predicted as prep + device + bookkeeping
    (``predicted_step_s``) and held against ``execute_s``. Without them (older measurements) the device
    coefficients are fitted to ``execute_s``.

    Returns:
        ``(profile dict, device FitResult, steps with columns predicted_s (device model), predicted_step_s,
        rel_residual, held_out)``.

    Raises:
        CalibrationError: no steps to fit, or a fit fails (see ``fit_device``, ``fit_host``).
    """
    from dlfp.devices.host import HostCosts

    steps = meas["steps"]
    steps = steps[steps["repeat"] >= 0].copy()
    grid = dict(meas.get("grid") or {})
    held = held_out_mask(steps, grid, fit_repeats)
    if held.all():
        raise CalibrationError("calibrate: every step is held out; nothing to fit")
    parts = "device_s" in steps and bool(steps["device_s"].notna().any())
    if parts:  # steps without the model runner's parts (none expected) are left out, not guessed
        keep = steps["device_s"].notna().to_numpy()
        steps, held = steps[keep].copy(), held[keep]
    target = "device_s" if parts else "execute_s"
    dev = fit_device_parts(steps[~held]) if parts else fit_device(steps[~held], time_col=target)
    host = fit_host(steps[~held], meas.get("tokens"), meas.get("ingest"))
    hc = HostCosts.from_dict(host)
    steps["predicted_s"] = predict_execute(steps, dev.coef)
    n = steps["num_scheduled"].to_numpy(float)
    steps["predicted_step_s"] = (steps["predicted_s"] + hc.prep_base_s + hc.prep_per_req_s * n
                                 + hc.prep_per_token_s * steps["tokens"].to_numpy(float)
                                 + hc.bookkeeping_base_s + hc.bookkeeping_per_req_s * n)
    steps["rel_residual"] = steps["predicted_s"] / steps[target] - 1.0
    steps["held_out"] = held
    ho = steps[held]
    holdout = residual_stats(ho[target].to_numpy(), ho["predicted_s"].to_numpy())
    grid["fit_target"] = target
    grid["split"] = "phases" if split_by_phase(grid, fit_repeats) \
        else f"repeats {list(fit_repeats if fit_repeats is not None else (0,))}"
    grid["by_kind"] = _residuals_by_kind(steps, "predicted_s", target)
    if parts:
        grid["whole_step"] = {
            "in_sample": residual_stats(steps.loc[~held, "execute_s"].to_numpy(),
                                        steps.loc[~held, "predicted_step_s"].to_numpy()),
            "held_out": residual_stats(ho["execute_s"].to_numpy(), ho["predicted_step_s"].to_numpy())}
        grid["part_medians_s"] = {c: float(np.nanmedian(steps[c])) for c in
                                  ("schedule_cost_s", "prep_s", "forward_s", "logits_s", "sample_s",
                                   "bookkeeping_s", "update_s", "loop_s")}
    else:
        grid["host_medians_s"] = {c: float(np.nanmedian(steps[c])) for c in ("schedule_cost_s", "update_cost_s")}
    pt = phase_table(steps, grid, target)
    if len(pt):
        grid["phase_ci"] = {"repeats": int(pt["repeats"].max()),
                            "median_rel_halfwidth": float(np.nanmedian(pt["rel_halfwidth"])),
                            "max_rel_halfwidth": float(np.nanmax(pt["rel_halfwidth"]))
                            if pt["rel_halfwidth"].notna().any() else float("nan")}
    kv_cache_gib = float((meas.get("config") or {}).get("backend_options", {}).get("kv_cache_space_gib", 2.0))
    prof = make_profile(dev, host, model=model, machine=machine or machine_description(), grid=grid,
                        holdout=holdout, kv_cache_gib=kv_cache_gib)
    quiet = (machine or {}).get("quiet")
    if quiet:  # measured on a machine that was not quiet (dlfp.studies.calibration.quiet): say so in the profile
        prof["fit"]["provisional"] = quiet.get("verdict") != "quiet"
    return prof, dev, steps
