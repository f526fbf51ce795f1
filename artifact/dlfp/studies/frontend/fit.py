"""Front-end costs (``dlfp.devices.frontend.FrontendCosts``) fitted to the ``vllm serve`` measurements.

Inputs: ``requests.csv`` and ``phases.csv`` of ``dlfp.studies.frontend.measure``. CPU is the API server process's.

1. Per request (``single`` phase, one output token, one request at a time): ``cpu = r0 + r1 x P + u`` per endpoint,
   least squares on the prompt lengths ``FIT_PROMPTS``; ``u`` (one engine output of one token) is the median per
   extra token of the 32-token requests over the 1-token ones. The middle prompt length is held out.
   Token ids: ``request_s = r0``, ``request_per_token_s = r1``. Text: ``request_s = r0``, ``tokenize_per_token_s =
   r1`` (the tokenizer thread).
2. Per engine output (``loaded`` phase of ``/v1/completions``, 16 requests at a time): ``output_per_token_s`` =
   (CPU - per-request work - outputs x u) / (tokens - outputs), ``output_s = u - output_per_token_s``. The chat
   endpoint's loaded phase is held out (its CPU is predicted).
3. Latency outside the API server's work: ``transport = ingest_s + frontend_output_s`` = median over the token-id
   requests of (client TTFT - engine queue - engine prefill) - (modelled event-loop work + u); split between the
   two in the proportion this host's ``dlfp calibrate`` measured for ``AsyncLLM`` without HTTP
   (``hardware/cpu-calibrated.yaml``). The text endpoints' TTFT overhead is held out (predicted, with the
   tokenizer's 2 ms window).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dlfp.devices.frontend import TOKENIZE_WINDOW_S, FrontendCosts

FIT_PROMPTS = (32, 2048)
TEXT_ENDPOINTS = ("completions", "chat")


def _one_token_output_s(single: pd.DataFrame) -> float:
    """``u``: median over (endpoint, prompt) of (CPU at 32 tokens - CPU at 1 token) / 31 extra tokens (s)."""
    g = single.groupby(["endpoint", "prompt_tokens", "output_tokens"])["api_cpu_s"].median().unstack()
    k = sorted(g.columns)
    return float(np.median((g[k[-1]] - g[k[0]]) / (k[-1] - k[0])))


def per_request(single: pd.DataFrame, u: float) -> dict[str, tuple[float, float]]:
    """``{endpoint: (r0, r1)}`` (s, s per prompt token) fitted on the one-token requests at ``FIT_PROMPTS``."""
    out = {}
    one = single[single.output_tokens == single.output_tokens.min()]
    lo, hi = FIT_PROMPTS
    for ep, g in one.groupby("endpoint"):
        # Least squares over two prompt lengths is the line through the two groups' means; exactly rounded sums
        # (math.fsum) keep the fit identical on every host, where LAPACK's polyfit differs in the last bits.
        y_lo, y_hi = (_mean(g.api_cpu_s[g.prompt_tokens == p] - u, f"{ep} at {p} prompt tokens") for p in (lo, hi))
        r1 = (y_hi - y_lo) / (hi - lo)
        out[ep] = (max(0.0, y_lo - r1 * lo), max(0.0, r1))
    return out


def _mean(x: pd.Series, what: str) -> float:
    """Exactly rounded mean of ``x``; raises ``ValueError`` naming ``what`` when ``x`` is empty (not measured)."""
    if x.empty:
        raise ValueError(f"requests.csv: no one-token request of {what}")
    return math.fsum(x.to_numpy(float)) / len(x)


def costs_of(req: dict, ep: str, out_s: float, out_tok_s: float) -> FrontendCosts:
    r0, r1 = req[ep]
    if ep in TEXT_ENDPOINTS:
        return FrontendCosts(request_s=r0, tokenize_per_token_s=r1, output_s=out_s, output_per_token_s=out_tok_s)
    return FrontendCosts(request_s=r0, request_per_token_s=r1, output_s=out_s, output_per_token_s=out_tok_s)


def _work_s(c: FrontendCosts, p) -> np.ndarray:
    return c.request_s + (c.request_per_token_s + c.tokenize_per_token_s) * np.asarray(p, float)


def fit(requests: pd.DataFrame, phases: pd.DataFrame, calibrated_host: dict) -> dict:
    """The fitted costs and the held-out checks.

    Returns ``{"endpoints": {name: FrontendCosts}, "ingest_s", "frontend_output_s", "checks": DataFrame}``; the
    checks hold, per quantity, the measured and modelled values (s) and whether it was fitted or held out.
    """
    single = requests[requests.phase == "single"]
    u = _one_token_output_s(single)
    req = per_request(single, u)
    lc = phases[(phases.phase == "loaded") & (phases.endpoint == "completions")].iloc[0]
    loaded_req = requests[(requests.phase == "loaded") & (requests.endpoint == "completions")]
    work = math.fsum(_work_s(costs_of(req, "completions", 0, 0), loaded_req.prompt_tokens))
    d = max(0.0, float((lc.api_cpu_s - work - lc.engine_outputs * u) / (lc.output_tokens - lc.engine_outputs)))
    c = max(0.0, u - d)
    eps = {"completions_ids": costs_of(req, "completions_ids", c, d),
           "completions": costs_of(req, "completions", c, d), "chat": costs_of(req, "chat", c, d)}
    one = single[single.output_tokens == single.output_tokens.min()].copy()
    one["overhead_s"] = one.client_ttft_s - one.queue_s - one.prefill_s
    ids = one[one.endpoint == "completions_ids"]
    transport = float(np.median(ids.overhead_s - _work_s(eps["completions_ids"], ids.prompt_tokens) - u))
    share = calibrated_host["ingest_s"] / (calibrated_host["ingest_s"] + calibrated_host["frontend_output_s"])
    rows = []
    for ep, g in one.groupby("endpoint"):
        for p, h in g.groupby("prompt_tokens"):
            model = float(_work_s(eps[ep], p) + u + transport + (TOKENIZE_WINDOW_S if ep in TEXT_ENDPOINTS else 0))
            rows.append({"quantity": "API-server CPU per request, 1 token", "endpoint": ep, "prompt_tokens": p,
                         "measured_s": float(h.api_cpu_s.median()), "modelled_s": float(_work_s(eps[ep], p) + u),
                         "role": "fitted" if p in FIT_PROMPTS else "held out"})
            rows.append({"quantity": "TTFT minus engine queue and prefill, 1 request at a time", "endpoint": ep,
                         "prompt_tokens": p, "measured_s": float(h.overhead_s.median()), "modelled_s": model,
                         "role": "fitted" if ep == "completions_ids" else "held out"})
    for ep in ("completions", "chat"):
        ph = phases[(phases.phase == "loaded") & (phases.endpoint == ep)].iloc[0]
        lr = requests[(requests.phase == "loaded") & (requests.endpoint == ep)]
        model = math.fsum(_work_s(eps[ep], lr.prompt_tokens)) + ph.engine_outputs * c + ph.output_tokens * d
        rows.append({"quantity": f"API-server CPU, {int(ph.requests)} requests {int(ph.concurrency)} at a time",
                     "endpoint": ep, "prompt_tokens": int(lr.prompt_tokens.median()), "measured_s": ph.api_cpu_s,
                     "modelled_s": model, "role": "fitted" if ep == "completions" else "held out"})
    checks = pd.DataFrame(rows)
    checks["error"] = checks.modelled_s / checks.measured_s - 1
    return {"endpoints": eps, "ingest_s": transport * share, "frontend_output_s": transport * (1 - share),
            "checks": checks}
