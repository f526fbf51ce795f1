"""The requests sent to ``vllm serve`` and what is recorded about each.

Phases (every request streamed, greedy, ``ignore_eos``, prefix caching off):

* ``single``: one request at a time. For each endpoint (``completions`` with a text prompt, ``completions`` with
  token ids, ``chat``), prompt length ``P`` in ``PROMPT_TOKENS`` and output length ``K`` in ``OUTPUT_TOKENS``,
  ``REPEATS`` requests. Per request: the client's TTFT and token times; the server's own metrics over the request
  (their sums before and after: TTFT from ``AsyncLLM``'s arrival, queue and prefill time from the engine core);
  the API server's CPU time over the request.
* ``loaded``: ``LOADED_REQUESTS`` requests per endpoint, ``LOADED_CONCURRENCY`` at a time (P 128, K 64): the API
  server's CPU time with many requests per engine output.
* ``burst``: ``BURST_REQUESTS`` requests sent at once (completions, text, P 128, K 1).

Rows go to ``requests.csv`` (one per request) and ``phases.csv`` (one per phase and endpoint: CPU seconds, requests,
prompt and output tokens, engine outputs = the count of ``vllm:iteration_tokens_total``).
"""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pandas as pd

from dlfp.studies.frontend.serve import Server, metrics, stream

PROMPT_TOKENS = (32, 512, 2048)
OUTPUT_TOKENS = (1, 32)
REPEATS = 4
ENDPOINTS = ("completions", "completions_ids", "chat")
LOADED_REQUESTS, LOADED_CONCURRENCY = 48, 16
BURST_REQUESTS = 128
_SERVER_KEYS = {"server_ttft_s": "vllm:time_to_first_token_seconds_sum",
                "queue_s": "vllm:request_queue_time_seconds_sum",
                "prefill_s": "vllm:request_prefill_time_seconds_sum",
                "decode_s": "vllm:request_decode_time_seconds_sum",
                "server_e2e_s": "vllm:e2e_request_latency_seconds_sum",
                "engine_outputs": "vllm:iteration_tokens_total_count"}


def prompt_of(tok, n: int, rng: random.Random) -> tuple[str, list[int]]:
    """A text of exactly ``n`` tokens (random regular token ids, decoded and re-encoded until stable) and its ids."""
    ids = [rng.randrange(256, 151_000) for _ in range(n)]
    for _ in range(8):
        text = tok.decode(ids)
        ids = tok.encode(text).ids
        ids = (ids + [rng.randrange(256, 151_000) for _ in range(n)])[:n]
    text = tok.decode(ids)
    return text, tok.encode(text).ids


def _prompt(endpoint: str, text: str, ids: list[int]):
    return ids if endpoint == "completions_ids" else text


async def _single(server: Server, session, tok, rng) -> list[dict]:
    rows = []
    for rep in range(REPEATS):
        for ep in ENDPOINTS:
            for p in PROMPT_TOKENS:
                for k in OUTPUT_TOKENS:
                    text, ids = prompt_of(tok, p, rng)
                    m0, c0 = await metrics(session, server.url), server.cpu_s()
                    r = await stream(session, server.url, ep, _prompt(ep, text, ids), k)
                    await asyncio.sleep(0.05)  # the server's last bookkeeping of the request
                    c1, m1 = server.cpu_s(), await metrics(session, server.url)
                    row = {"phase": "single", "endpoint": ep, "repeat": rep, "prompt_tokens": len(ids),
                           "output_tokens": len(r["token_s"]), "client_ttft_s": r["token_s"][0] - r["send_s"],
                           "client_e2e_s": r["token_s"][-1] - r["send_s"], "api_cpu_s": c1 - c0}
                    row.update({k2: m1.get(v, 0.0) - m0.get(v, 0.0) for k2, v in _SERVER_KEYS.items()})
                    rows.append(row)
    return rows


async def _many(server: Server, session, tok, rng, phase: str, ep: str, n: int, conc: int, p: int, k: int):
    sem = asyncio.Semaphore(conc)
    prompts = [prompt_of(tok, p, rng) for _ in range(n)]

    async def one(i):
        async with sem:
            return await stream(session, server.url, ep, _prompt(ep, *prompts[i]), k)

    m0, c0 = await metrics(session, server.url), server.cpu_s()
    res = await asyncio.gather(*(one(i) for i in range(n)))
    await asyncio.sleep(0.05)
    c1, m1 = server.cpu_s(), await metrics(session, server.url)
    t0 = min(r["send_s"] for r in res)
    rows = [{"phase": phase, "endpoint": ep, "repeat": i, "prompt_tokens": len(prompts[i][1]),
             "output_tokens": len(r["token_s"]), "send_s": r["send_s"] - t0, "client_ttft_s": r["token_s"][0] -
             r["send_s"], "client_e2e_s": r["token_s"][-1] - r["send_s"]} for i, r in enumerate(res)]
    summary = {"phase": phase, "endpoint": ep, "requests": n, "concurrency": conc, "api_cpu_s": c1 - c0,
               "prompt_tokens": sum(len(x[1]) for x in prompts), "output_tokens": sum(r["output_tokens"] for r
                                                                                        in rows),
               "engine_outputs": m1.get(_SERVER_KEYS["engine_outputs"], 0) - m0.get(_SERVER_KEYS["engine_outputs"],
                                                                                    0),
               "wall_s": max(r["token_s"][-1] for r in res) - t0}
    return rows, summary


async def _all(server: Server, tok, seed: int) -> tuple[list[dict], list[dict]]:
    import aiohttp

    rng = random.Random(seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        for ep in ENDPOINTS:  # warm-up: the first requests of each path pay one-off costs
            for _ in range(3):
                await stream(session, server.url, ep, _prompt(ep, *prompt_of(tok, 64, rng)), 4)
        rows = await _single(server, session, tok, rng)
        phases = []
        for ep in ("completions", "chat"):
            r, s = await _many(server, session, tok, rng, "loaded", ep, LOADED_REQUESTS, LOADED_CONCURRENCY, 128, 64)
            rows += r
            phases.append(s)
        r, s = await _many(server, session, tok, rng, "burst", "completions", BURST_REQUESTS, BURST_REQUESTS, 128, 1)
        return rows + r, phases + [s]


def run(model: Path, run_dir: Path, out: Path, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Start the server, send every phase, write ``requests.csv`` and ``phases.csv`` into ``out``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    with Server(model, run_dir) as server:
        rows, phases = asyncio.run(_all(server, tok, seed))
    out.mkdir(parents=True, exist_ok=True)
    req, ph = pd.DataFrame(rows), pd.DataFrame(phases)
    req.to_csv(out / "requests.csv", index=False, float_format="%.6g")
    ph.to_csv(out / "phases.csv", index=False, float_format="%.6g")
    return req, ph
