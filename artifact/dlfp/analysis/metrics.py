"""Serving metrics of one trial, with the definitions of vLLM's ``vllm bench serve``.

Definitions (vLLM 0.17.1, ``vllm/benchmarks/serve.py``), all in SECONDS in
code (milliseconds only in reports, via ``to_ms``):

* TTFT: request arrival -> first output token.
* ITL: every gap between consecutive output tokens of one request; the ITL
  distribution pools the gaps of all measured, completed requests.
* TPOT: per request, ``(E2EL - TTFT) / (output tokens - 1)``; undefined (NaN,
  left out of the percentiles) for a request with a single output token.
* E2EL: request arrival -> last output token.
* Percentiles: ``numpy.percentile`` with linear interpolation; P50, P90, P99
  are reported (plus the mean, as vLLM does). An empty sample gives NaN
  (vLLM reports 0 there; NaN cannot be mistaken for a measurement).

Which requests count: only measured requests (``warmup == False``). A
measured request that did not finish (``finished == False`` or no token) is
*failed*: it is left out of the latency percentiles (vLLM keeps only
successful requests there) and fails the SLO.

SLO (``dlfp.config.SLO``): a request passes when it completed, its TTFT <=
``slo.ttft_s`` and the ``slo.itl_quantile`` quantile (linear interpolation) of
its own inter-token gaps is <= ``slo.itl_s`` (``itl_quantile = 1.0``: the
worst gap). A completed request with one token has no gap and passes the ITL
part. Comparisons are exact (``<=``). Goodput = SLO-passing requests divided
by the measured duration, from the first measured arrival to the last token of
a measured request (seconds).

Energy per output token = joules / output tokens of the whole trial (warm-ups
included, because a meter covers the whole run); NaN with a stated reason
where no meter exists (see ``energy_per_token``).
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from dlfp.traces.format import Trial

PERCENTILES: tuple[int, ...] = (50, 90, 99)
LATENCY_METRICS: tuple[str, ...] = ("ttft", "itl", "tpot", "e2el")

REQUEST_METRIC_COLUMNS: tuple[str, ...] = (
    "request_id",
    "arrival_s",
    "output_tokens",
    "n_tokens",
    "completed",
    "ttft_s",
    "e2el_s",
    "tpot_s",
    "itl_max_s",
    "itl_slo_s",
    "slo_pass",
)


def to_ms(seconds: Any) -> Any:
    """Seconds -> milliseconds for reports (float, numpy array or pandas object; NaN stays NaN)."""
    if isinstance(seconds, (pd.Series, pd.DataFrame, np.ndarray)):
        return seconds * 1000.0
    return float(seconds) * 1000.0


def summary_to_ms(summary: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a ``summarize`` dict with every ``*_s`` latency key renamed ``*_ms`` and scaled x1000.

    ``duration_s`` and rates (``*_rps``) are left in their own units.
    """
    out: dict[str, Any] = {}
    for k, v in summary.items():
        if k.endswith("_s") and k != "duration_s" and k.split("_")[0] in LATENCY_METRICS + ("mean",):
            out[k[:-2] + "_ms"] = to_ms(v)
        else:
            out[k] = v
    return out


def percentile(values: Iterable[float] | np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0..100) by numpy's linear interpolation; NaN for an empty sample.

    Units follow the input. NaN entries are ignored.

    Raises:
        ValueError: ``q`` outside [0, 100].
    """
    if not 0.0 <= float(q) <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q!r}")
    a = np.asarray(values, dtype=float)
    a = a[~np.isnan(a)]
    if a.size == 0:
        return float("nan")
    return float(np.percentile(a, q, method="linear"))


def _measured_tokens(trial: Trial) -> pd.DataFrame:
    """Tokens of measured requests, sorted by request then index."""
    measured_ids = trial.measured_requests["request_id"]
    tk = trial.tokens[trial.tokens["request_id"].isin(measured_ids)]
    return tk.sort_values(["request_id", "index"], kind="stable").reset_index(drop=True)


def _resolve_slo(trial: Trial, slo: Any | None):
    """The SLO to judge against: the argument, else ``metadata["config"]["slo"]``, else None."""
    if slo is not None:
        return slo
    from dlfp.config import SLO

    cfg = trial.metadata.get("config")
    if isinstance(cfg, Mapping) and isinstance(cfg.get("slo"), Mapping):
        return SLO.model_validate(cfg["slo"])
    return None


def _slo_fields(slo: Any) -> tuple[float, float, float]:
    """(ttft_s, itl_s, itl_quantile) from a ``dlfp.config.SLO`` or a mapping with those keys."""
    get = slo.get if isinstance(slo, Mapping) else (lambda k, d=None: getattr(slo, k, d))
    ttft, itl, q = get("ttft_s"), get("itl_s"), get("itl_quantile", 1.0)
    if ttft is None or itl is None:
        raise ValueError(f"SLO needs ttft_s and itl_s (seconds), got {slo!r}")
    return float(ttft), float(itl), float(q)


def request_metrics(trial: Trial, slo: Any | None = None) -> pd.DataFrame:
    """One row per measured request (warm-ups excluded), in arrival order.

    Columns (times in seconds): ``request_id``, ``arrival_s``, ``output_tokens``
    (requested), ``n_tokens`` (emitted), ``completed`` (finished with >= 1
    token), ``ttft_s``, ``e2el_s`` (NaN unless completed), ``tpot_s`` (NaN
    unless completed with >= 2 tokens), ``itl_max_s`` (worst gap, NaN with < 2
    tokens), ``itl_slo_s`` (the request's gap quantile ``slo.itl_quantile``,
    NaN with < 2 tokens or no SLO), ``slo_pass`` (pandas nullable boolean;
    ``<NA>`` for every row when no SLO is given and ``trial.metadata["config"]``
    has none).

    Args:
        trial: the trial (``dlfp.traces.format.Trial``).
        slo: ``dlfp.config.SLO`` (or a mapping with ``ttft_s``, ``itl_s`` and
            optional ``itl_quantile``); default: the trial config's SLO.

    Raises:
        ValueError: an SLO without ``ttft_s``/``itl_s``.
    """
    rq = trial.measured_requests.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    slo = _resolve_slo(trial, slo)
    tk = _measured_tokens(trial)
    g = tk.groupby("request_id", sort=False)["time_s"]
    first = g.min()
    last = g.max()
    n_tok = g.size()
    gaps = tk.assign(gap=g.diff()).dropna(subset=["gap"])
    gap_groups = gaps.groupby("request_id", sort=False)["gap"]
    itl_max = gap_groups.max()

    ids = rq["request_id"]
    arrival = rq["arrival_s"].to_numpy(dtype=float)
    n_tokens = n_tok.reindex(ids).fillna(0).to_numpy(dtype=np.int64)
    finished = rq["finished"].to_numpy(dtype=bool)
    completed = finished & (n_tokens >= 1)
    first_t = first.reindex(ids).to_numpy(dtype=float)
    last_t = last.reindex(ids).to_numpy(dtype=float)
    ttft = first_t - arrival
    e2el = np.where(completed, last_t - arrival, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(completed & (n_tokens >= 2), (e2el - ttft) / (n_tokens - 1), np.nan)

    out = pd.DataFrame(
        {
            "request_id": ids.to_numpy(),
            "arrival_s": arrival,
            "output_tokens": rq["output_tokens"].to_numpy(dtype=np.int64),
            "n_tokens": n_tokens,
            "completed": completed,
            "ttft_s": ttft,
            "e2el_s": e2el,
            "tpot_s": tpot,
            "itl_max_s": itl_max.reindex(ids).to_numpy(dtype=float),
        }
    )
    if slo is None:
        out["itl_slo_s"] = np.nan
        out["slo_pass"] = pd.array([pd.NA] * len(out), dtype="boolean")
        return out
    ttft_lim, itl_lim, q = _slo_fields(slo)
    if q >= 1.0:
        itl_q = itl_max
    else:
        itl_q = gap_groups.quantile(q, interpolation="linear")
    itl_slo = itl_q.reindex(ids).to_numpy(dtype=float)
    itl_ok = np.isnan(itl_slo) | (itl_slo <= itl_lim)  # no gap (1 token): nothing to violate
    with np.errstate(invalid="ignore"):
        ttft_ok = ttft <= ttft_lim  # NaN (no token) -> False
    out["itl_slo_s"] = itl_slo
    out["slo_pass"] = pd.array(completed & ttft_ok & itl_ok, dtype="boolean")
    return out


def itl_samples(trial: Trial) -> np.ndarray:
    """All inter-token gaps (seconds) of measured, completed requests, pooled; shape (n_gaps,).

    Ordered by request id, then token index. A request with n tokens adds n - 1 gaps.
    """
    return _itl_samples(trial, _measured_tokens(trial))


def worst_gap_s(trial: Trial) -> float:
    """The largest gap (seconds) between two consecutive tokens of one measured, completed request; NaN if none."""
    gaps = itl_samples(trial)
    return float(gaps.max()) if len(gaps) else float("nan")


def _itl_samples(trial: Trial, tk: pd.DataFrame) -> np.ndarray:
    rq = trial.measured_requests
    n_tok = tk.groupby("request_id", sort=False).size()
    done_ids = rq.loc[rq["finished"].to_numpy(dtype=bool), "request_id"]
    done_ids = done_ids[done_ids.isin(n_tok.index[n_tok >= 1])]
    tk = tk[tk["request_id"].isin(done_ids)]
    gaps = tk.groupby("request_id", sort=False)["time_s"].diff().to_numpy(dtype=float)
    return gaps[~np.isnan(gaps)]


def energy_per_token(trial: Trial) -> tuple[float, str, float]:
    """Energy per output token of the whole trial: ``(joules_per_token, reason, joules)``.

    Source of joules, in order: ``metadata["energy"]["joules"]`` (a meter
    over the whole trial; a bare number is accepted too), else the sum of the
    iteration log's ``energy_j`` when every iteration has a finite value
    (modelled energy). Divided by every output token of the trial (warm-ups
    included, since the joules cover them). ``reason`` is ``""`` when a value
    exists, otherwise it says why the result is NaN (the metadata's own
    ``reason`` if given, e.g. "no NVML on this machine").
    """
    md = trial.metadata.get("energy")
    joules: float | None = None
    reason = ""
    if isinstance(md, (int, float)) and not isinstance(md, bool):
        joules = float(md)
    elif isinstance(md, Mapping):
        if md.get("joules") is not None:
            joules = float(md["joules"])
        reason = str(md.get("reason") or "")
    if joules is None:
        e = trial.iterations["energy_j"].to_numpy(dtype=float) if len(trial.iterations) else np.array([])
        if e.size and np.isfinite(e).all():
            joules = float(e.sum())
    if joules is None or not math.isfinite(joules):
        why = reason or f"no energy meter (metadata['energy'] = {md!r}; iterations.energy_j not all finite)"
        return float("nan"), why, float("nan")
    n = len(trial.tokens)
    if n == 0:
        return float("nan"), "no output tokens in the trial", joules
    return joules / n, "", joules


def summarize(trial: Trial, slo: Any | None = None) -> dict[str, Any]:
    """Headline metrics of one trial as a flat dict (seconds; rates per second).

    Keys: ``experiment``, ``arm``, ``seed``, ``backend`` (from metadata, None
    if absent); ``measured``, ``completed``, ``failed`` (counts);
    ``{ttft,itl,tpot,e2el}_{mean,p50,p90,p99}_s``; ``slo_passes`` (count),
    ``slo_fraction`` (passes / measured requests); ``duration_s`` (first
    measured arrival -> last measured token); ``goodput_rps`` (passes /
    duration_s); ``output_tokens`` (tokens of measured requests);
    ``energy_j``, ``energy_per_token_j``, ``energy_reason`` (see
    ``energy_per_token``).

    Args:
        trial: the trial.
        slo: ``dlfp.config.SLO`` or mapping; default the trial config's SLO.

    Raises:
        ValueError: no SLO given and none in ``trial.metadata["config"]``.
    """
    slo = _resolve_slo(trial, slo)
    if slo is None:
        raise ValueError("summarize: no SLO given and trial.metadata['config'] has no 'slo'")
    rm = request_metrics(trial, slo)
    done = rm[rm["completed"]]
    tk = _measured_tokens(trial)
    samples = {
        "ttft": done["ttft_s"].to_numpy(dtype=float),
        "itl": _itl_samples(trial, tk),
        "tpot": done["tpot_s"].to_numpy(dtype=float),
        "e2el": done["e2el_s"].to_numpy(dtype=float),
    }
    md = trial.metadata
    out: dict[str, Any] = {k: md.get(k) for k in ("experiment", "arm", "seed", "backend")}
    n = len(rm)
    out["measured"] = n
    out["completed"] = int(rm["completed"].sum())
    out["failed"] = n - out["completed"]
    for name, a in samples.items():
        a = a[~np.isnan(a)]
        out[f"{name}_mean_s"] = float(a.mean()) if a.size else float("nan")
        for p in PERCENTILES:
            out[f"{name}_p{p}_s"] = percentile(a, p)
    passes = int(rm["slo_pass"].sum())
    out["slo_passes"] = passes
    out["slo_fraction"] = passes / n if n else float("nan")
    if n and len(tk):
        duration = float(tk["time_s"].max()) - float(rm["arrival_s"].min())
    else:
        duration = float("nan")
    out["duration_s"] = duration
    out["goodput_rps"] = passes / duration if duration > 0 else float("nan")
    out["output_tokens"] = int(len(tk))
    ept, reason, joules = energy_per_token(trial)
    out["energy_j"] = joules
    out["energy_per_token_j"] = ept
    out["energy_reason"] = reason
    return out


def summarize_trials(trials: Iterable[Trial], slo: Any | None = None) -> pd.DataFrame:
    """``summarize`` of each trial, one row per trial (columns as the dict keys)."""
    return pd.DataFrame([summarize(t, slo) for t in trials])


__all__ = [
    "LATENCY_METRICS",
    "PERCENTILES",
    "REQUEST_METRIC_COLUMNS",
    "energy_per_token",
    "itl_samples",
    "percentile",
    "request_metrics",
    "summarize",
    "summarize_trials",
    "summary_to_ms",
    "to_ms",
    "worst_gap_s",
]
