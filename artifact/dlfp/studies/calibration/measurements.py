"""Calibration measurements: the engine's step log, joining it with the client's times, and saving them.

``run_grid`` produces raw records (the scheduler's JSON-lines log and the client's send and receive times);
``assemble`` turns them into the tables the fit reads; ``save_measurements`` / ``load_measurements`` keep
them on disk so ``dlfp calibrate --refit`` can refit without the engine.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from dlfp.studies.calibration.features import CalibrationError
from dlfp.studies.calibration.profile import plain

#: AsyncLLM makes engine-side request ids unique by appending "-" + 8 hex digits
_ENGINE_ID_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
MEASUREMENT_FILES = ("steps.csv", "tokens.csv", "meta.json")


#: the named parts of one engine step (seconds), derived by ``step_parts`` from the scheduler's and the model
#: runner's timestamps; each stands for the vLLM 0.17.1 code named beside it
STEP_PARTS: dict[str, str] = {
    "schedule_cost_s": "Scheduler.schedule()",
    "prep_s": "UniProcExecutor.execute_model dispatch + GPUModelRunner._update_states + _prepare_inputs",
    "forward_s": "GPUModelRunner._model_forward (the model's forward pass)",
    "logits_s": "the rest of GPUModelRunner.execute_model: compute_logits of the sampled rows",
    "sample_s": "GPUModelRunner._sample (the sampler)",
    "bookkeeping_s": "the rest of GPUModelRunner.sample_tokens (_bookkeeping_sync, ModelRunnerOutput) and "
                     "EngineCore.step between the runner and update_from_output",
    "update_s": "Scheduler.update_from_output()",
    "loop_s": "EngineCoreProc._process_engine_step after step() (output queue) + _process_input_queue, until "
              "the next schedule()",
}
#: model-runner timestamps a step row needs for the parts beyond ``execute_s`` (written by ``runner_parts``)
RUNNER_COLUMNS = ("execute_model_s", "execute_model_start_s", "execute_model_end_s", "update_states_s",
                  "prepare_inputs_s", "model_forward_s", "sample_tokens_s", "sample_tokens_start_s",
                  "sample_tokens_end_s", "sample_s")


def steps_from_log(rows: Sequence[dict]) -> pd.DataFrame:
    """Step table from ``CalibrationScheduler`` log rows (engine clock, seconds).

    Adds ``schedule_cost_s`` (inside ``schedule()``), ``execute_s`` (end of ``schedule()`` ->
    start of ``update_from_output``: input preparation, forward pass, sampling) and
    ``update_cost_s`` (start of ``update_from_output`` -> next ``schedule()``, NaN when the engine
    had no request left after the step, i.e. went idle), ``one`` (1.0) and ``kind`` (decode, prefill, mixed).
    Where the rows carry the model runner's parts (``runner_parts``), also the named parts of ``STEP_PARTS``
    and ``device_s`` = ``forward_s + logits_s + sample_s`` (the compute the device cost model stands for);
    ``update_s`` and ``loop_s`` split ``update_cost_s``. Without them those columns are NaN.

    Raises:
        CalibrationError: no rows.
    """
    if not rows:
        raise CalibrationError("calibration log: no step rows")
    df = pd.DataFrame(list(rows)).sort_values("step").reset_index(drop=True)
    df["schedule_cost_s"] = df["schedule_end_s"] - df["schedule_start_s"]
    df["execute_s"] = df["update_start_s"] - df["schedule_end_s"]
    nxt = df["schedule_start_s"].shift(-1)
    busy = df["busy_after"].astype(bool)
    df["update_cost_s"] = np.where(busy, nxt - df["update_start_s"], np.nan)
    df["one"] = 1.0
    df["kind"] = np.where(df["num_prefills"] == 0, "decode", np.where(df["num_decodes"] == 0, "prefill", "mixed"))
    for c in RUNNER_COLUMNS:
        if c not in df:
            df[c] = np.nan
    for c in ("update_states_s", "prepare_inputs_s", "sample_s"):
        df[c] = df[c].fillna(0.0).where(df["execute_model_s"].notna())
    df["prep_s"] = df["execute_model_start_s"] - df["schedule_end_s"] + df["update_states_s"] + df["prepare_inputs_s"]
    df["forward_s"] = df["model_forward_s"]
    df["logits_s"] = df["execute_model_s"] - df["update_states_s"] - df["prepare_inputs_s"] - df["model_forward_s"]
    df["bookkeeping_s"] = ((df["sample_tokens_s"] - df["sample_s"])
                           + (df["sample_tokens_start_s"] - df["execute_model_end_s"])
                           + (df["update_start_s"] - df["sample_tokens_end_s"]))
    df["device_s"] = df["forward_s"] + df["logits_s"] + df["sample_s"]
    df["update_s"] = df["update_end_s"] - df["update_start_s"]
    df["loop_s"] = np.where(busy, nxt - df["update_end_s"], np.nan)
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


def _assign_phases(steps: pd.DataFrame, add_t: Mapping[str, float],
                   phase_of: Mapping[str, tuple[int, int]]) -> None:
    """Set ``steps["repeat"]`` and ``steps["phase"]``: those of the last phase started before each step (-1: none)."""
    starts = sorted((add_t[r], ph) for r, ph in phase_of.items() if r in add_t)
    st = np.array([s for s, _ in starts]) if starts else np.zeros(0)
    idx = np.searchsorted(st, steps["schedule_start_s"].to_numpy(), side="right") - 1
    steps["repeat"] = [starts[i][1][0] if i >= 0 else -1 for i in idx]
    steps["phase"] = [starts[i][1][1] if i >= 0 else -1 for i in idx]


def _token_table(steps: pd.DataFrame, toks: Sequence[tuple[str, int, float]]) -> pd.DataFrame:
    """Client token receipts joined with the producing step (token k of a request <- k-th step that sampled it)."""
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
    return pd.DataFrame(trows, columns=["request_id", "index", "client_s", "update_start_s", "num_scheduled"])


def _idle_ingest_times(sent: Mapping[str, float], add_t: Mapping[str, float],
                       phase_of: Mapping[str, tuple[int, int]]) -> list[float]:
    """Seconds from client send to scheduler ``add_request`` of the first request of each phase (engine idle)."""
    first_of_phase: dict[tuple[int, int], str] = {}
    for r, ph in phase_of.items():
        if r in sent and (ph not in first_of_phase or sent[r] < sent[first_of_phase[ph]]):
            first_of_phase[ph] = r
    return [add_t[r] - sent[r] for r in first_of_phase.values() if r in add_t]


def assemble(rows, adds, sent, toks, phase_of, *, config=None, grid=None) -> dict[str, Any]:
    """Join the engine log with the client's send/receive times.

    Args:
        rows, adds: step rows and ``add`` events of ``read_calibration_log``.
        sent: ``{client request id: send time}`` (``time.monotonic()``, seconds).
        toks: ``(client request id, token index, receive time)`` per token.
        phase_of: ``{client request id: (repeat, phase index)}``.
        config, grid: stored as given (``{}`` for None).

    Returns:
        ``{"steps", "tokens", "ingest", "config", "grid"}`` (see ``run_grid``).

    Raises:
        CalibrationError: no step rows.
    """
    steps = steps_from_log(rows)
    known = set(sent) | set(phase_of)

    def client_id(r: str) -> str:
        base = _ENGINE_ID_SUFFIX.sub("", r)
        return base if base in known and r not in known else r

    adds = [{**a, "request_id": client_id(a["request_id"])} for a in adds]
    steps["sampled_ids"] = [[client_id(r) for r in ids] for ids in steps["sampled_ids"]]
    add_t = {a["request_id"]: a["t"] for a in adds}
    _assign_phases(steps, add_t, phase_of)
    tokens = _token_table(steps, toks)
    ingest = _idle_ingest_times(sent, add_t, phase_of)
    return {"steps": steps, "tokens": tokens, "ingest": ingest, "config": config or {}, "grid": grid or {}}


def save_measurements(meas: dict, directory: str | Path) -> Path:
    """Save ``run_grid``'s output as ``steps.csv``, ``tokens.csv``, ``meta.json`` (and ``raw.json.gz``).

    Each file is written atomically (temp file + rename). Returns the directory.
    """
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
    tmp.write_text(json.dumps(plain(meta), indent=1))
    os.replace(tmp, d / "meta.json")
    if meas.get("raw"):
        import gzip

        tmp = d / ".raw.json.gz.tmp"
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            json.dump(plain(meas["raw"]), f)
        os.replace(tmp, d / "raw.json.gz")
    return d


def load_measurements(directory: str | Path) -> dict:
    """Inverse of ``save_measurements``.

    Raises:
        CalibrationError: a file is missing.
        KeyError, ValueError: a file lacks a column or holds an unparsable cell.
    """
    d = Path(directory)
    for n in MEASUREMENT_FILES:
        if not (d / n).is_file():
            raise CalibrationError(f"measurements {d}: {n} missing")
    st = pd.read_csv(d / "steps.csv")
    st["sampled_ids"] = st["sampled_ids"].map(json.loads)
    meta = json.loads((d / "meta.json").read_text())
    return {"steps": st, "tokens": pd.read_csv(d / "tokens.csv"), **meta}
