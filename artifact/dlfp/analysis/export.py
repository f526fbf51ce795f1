"""One trial as the JSON ``vllm bench serve --save-result --save-detailed`` writes (vLLM 0.17.1).

``export_bench_serve(trial)`` returns a dict whose every key is one that
vLLM 0.17.1's ``vllm/benchmarks/serve.py`` writes, with vLLM's units: per
request lists in seconds (``ttfts``, ``itls``, ``start_times``), summary
latencies in milliseconds (``mean_ttft_ms``, ``median_itl_ms``,
``p99_e2el_ms``, ...), throughputs per second. Only measured requests count
(warm-ups are left out, as vLLM's own warm-up is). The values are
``dlfp.analysis.metrics``' definitions, which are vLLM's: TTFT from arrival
to the first token, TPOT ``(e2el - ttft) / (n - 1)`` of requests with at
least two tokens, ITL every gap between consecutive tokens of a completed
request, pooled; percentiles linear; ``std`` with ``ddof = 0`` as numpy's
default. Percentiles written: 50, 90 and 99 (vLLM's
``--metric-percentiles 50,90,99``) for ttft, tpot, itl and e2el (vLLM's
``--percentile-metrics ttft,tpot,itl,e2el``). ``duration`` is the first
measured arrival to the last measured token (``metrics.summarize``'s
``duration_s``); ``start_times`` are arrival times on the trial's clock (in a closed loop the
send times, as bench serve's). ``request_rate``, ``burstiness`` and
``max_concurrency`` describe the workload as bench serve's flags would
(``traffic_fields``).
``generated_texts`` are empty (the modelled backends produce token ids, no
text). ``date`` is when the trial was written (its ``metadata.json``), so
the same trial exports the same bytes.

``main_export(argv)`` is ``dlfp export --format bench-serve TRIAL_DIR [--out FILE]``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dlfp.analysis import metrics
from dlfp.analysis.markdown import atomic_write
from dlfp.traces.format import TraceError, Trial, load_trial

FORMATS = ("bench-serve",)
#: Percentiles of each latency metric, as vLLM's ``--metric-percentiles``.
BENCH_PERCENTILES = (50, 90, 99)
#: Latency metrics with summaries, as vLLM's ``--percentile-metrics``.
BENCH_METRICS = ("ttft", "tpot", "itl", "e2el")
#: ``date`` format of vLLM's result JSON.
DATE_FORMAT = "%Y%m%d-%H%M%S"


def _num(v: Any) -> Any:
    """A JSON-safe number: numpy scalars as Python ones, NaN/inf as ``None``."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _stats_ms(name: str, samples_s: np.ndarray) -> dict[str, Any]:
    """vLLM's ``mean_/median_/std_/p<p>_<name>_ms`` of ``samples_s`` (seconds), in milliseconds."""
    a = np.asarray(samples_s, dtype=float)
    a = a[~np.isnan(a)]
    out: dict[str, Any] = {}
    out[f"mean_{name}_ms"] = _num(a.mean() * 1000) if a.size else None
    out[f"median_{name}_ms"] = _num(metrics.percentile(a, 50) * 1000)
    out[f"std_{name}_ms"] = _num(a.std() * 1000) if a.size else None
    for p in BENCH_PERCENTILES:
        out[f"p{p}_{name}_ms"] = _num(metrics.percentile(a, p) * 1000)
    return out


def _per_request(trial: Trial) -> tuple[list, list, list, list, list, list]:
    """Per measured request, in arrival order: input and output lengths, TTFT, ITLs, start time, error."""
    rq = trial.measured_requests.sort_values(["arrival_s", "request_id"], kind="stable")
    tk = trial.tokens[trial.tokens["request_id"].isin(rq["request_id"])]
    times = {rid: g.sort_values("index")["time_s"].to_numpy(float) for rid, g in tk.groupby("request_id")}
    ins, outs, ttfts, itls, starts, errors = [], [], [], [], [], []
    for rid, arrival, prompt, finished in zip(rq["request_id"], rq["arrival_s"], rq["prompt_tokens"],
                                              rq["finished"]):
        t = times.get(rid, np.array([]))
        done = bool(finished) and len(t) > 0
        ins.append(int(prompt))
        outs.append(int(len(t)) if done else 0)
        ttfts.append(float(t[0] - arrival) if done else 0.0)
        itls.append([float(x) for x in np.diff(t)] if done else [])
        starts.append(float(arrival))
        errors.append("" if done else "not finished in the trace")
    return ins, outs, ttfts, itls, starts, errors


def _setup(trial: Trial, date: str) -> dict[str, Any]:
    """The setup fields of vLLM's result JSON (``date`` ... ``max_concurrency``)."""
    md = trial.metadata
    cfg = md.get("config") if isinstance(md.get("config"), dict) else {}
    wl = cfg.get("workload") or {}
    model = cfg.get("model")
    return {
        "date": date,
        "endpoint_type": md.get("backend"),
        "backend": md.get("backend"),
        "label": f"dlfp {md.get('backend')}/{md.get('experiment')}/{md.get('arm')}/seed-{md.get('seed')}",
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": int(len(trial.measured_requests)),
        **traffic_fields(wl),
    }


def traffic_fields(wl: dict) -> dict[str, Any]:
    """bench serve's traffic fields of a recorded workload config ``wl`` (``metadata["config"]["workload"]``).

    As vLLM 0.17.1's ``vllm/benchmarks/serve.py`` (``main_async``) writes them: ``request_rate`` is the rate
    (requests/s) or the string ``"inf"`` (a burst, or a closed loop without a rate: ``--request-rate inf``);
    ``burstiness`` the gamma shape of the arrival gaps (1.0 = Poisson, bench serve's default, written also at
    ``inf``); ``max_concurrency`` the closed loop's clients, else ``None``. A replayed trace or a request list
    has no rate or shape of bench serve's: ``None``.
    """
    kind = wl.get("kind", "agent")
    load = kind in ("closed_loop", "burst")
    rate = "inf" if load and wl.get("rate") is None else _num(wl.get("rate"))
    return {"request_rate": rate,
            "burstiness": 1.0 if kind in ("agent", "fixed") or load else None,
            "max_concurrency": int(wl["concurrency"]) if kind == "closed_loop" else None}


def export_bench_serve(trial_or_dir: Trial | str | Path) -> dict[str, Any]:
    """A trial (or a trial directory, loaded and validated) as vLLM's ``--save-result`` JSON dict.

    Raises:
        TraceError: the directory is not a valid trial.
    """
    date = ""
    if isinstance(trial_or_dir, Trial):
        trial = trial_or_dir
    else:
        trial = load_trial(trial_or_dir)
        mtime = (Path(trial_or_dir) / "metadata.json").stat().st_mtime
        date = datetime.fromtimestamp(mtime, tz=timezone.utc).strftime(DATE_FORMAT)
    summary = metrics.summarize(trial)
    rm = metrics.request_metrics(trial)
    done = rm[rm["completed"]]
    ins, outs, ttfts, itls, starts, errors = _per_request(trial)
    completed = int(summary["completed"])
    total_in = int(sum(i for i, e in zip(ins, errors) if not e))
    total_out = int(sum(outs))
    dur = float(summary["duration_s"])

    def per_s(x: float) -> float | None:
        return _num(x / dur) if dur > 0 else None

    out = _setup(trial, date)
    out.update({
        "duration": _num(dur), "completed": completed, "failed": int(summary["failed"]),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": per_s(completed), "request_goodput": None,
        "output_throughput": per_s(total_out), "total_token_throughput": per_s(total_in + total_out),
        "input_lens": ins, "output_lens": outs, "ttfts": ttfts, "itls": itls, "start_times": starts,
        "generated_texts": ["" for _ in ins], "errors": errors,
    })
    samples = {"ttft": done["ttft_s"].to_numpy(float), "tpot": done["tpot_s"].to_numpy(float),
               "itl": metrics.itl_samples(trial), "e2el": done["e2el_s"].to_numpy(float)}
    for name in BENCH_METRICS:
        out.update(_stats_ms(name, samples[name]))
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlfp export", description="export a trial as JSON in another tool's format")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="bench-serve: the JSON of `vllm bench serve --save-result --save-detailed` (vLLM 0.17.1)")
    p.add_argument("trial_dir", metavar="TRIAL_DIR", help="a trial directory <traces>/<backend>/<exp>/<arm>/seed-<n>")
    p.add_argument("--out", default=None, metavar="FILE", help="output file (default: standard output)")
    return p


def main_export(argv: Sequence[str] | None = None) -> int:
    """``dlfp export --format bench-serve TRIAL_DIR [--out FILE]``; returns the exit status (2: bad input)."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        result = export_bench_serve(args.trial_dir)
    except TraceError as e:
        print(f"dlfp: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    text = json.dumps(result, allow_nan=False) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    out = Path(args.out)
    if out.is_dir():
        print(f"dlfp: error: --out {out} is a directory; give a file name", file=sys.stderr)
        return 2
    atomic_write(out, text)
    print(f"wrote {out}", file=sys.stderr)
    return 0


__all__ = ["BENCH_METRICS", "BENCH_PERCENTILES", "FORMATS", "export_bench_serve", "main_export", "traffic_fields"]
