"""``vllm serve`` on this CPU as a subprocess, and an asyncio client that times each streamed token.

The server: the tiny Qwen3 of ``tokenizer.build_model_dir`` with dummy weights, float32, eager, chunked prefill,
prefix caching off (every repeat pays its prefill), its caches, sockets and temp files under the run directory,
the engine's OpenMP threads pinned as a trial's are (``dlfp.backends.vllm.runner.pin_cpu_threads``).
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dlfp.backends import BackendUnavailable

PORT = 18321
START_TIMEOUT_S = 600.0


def _metric_sums(text: str) -> dict[str, float]:
    """``{name: value}`` of every ``*_sum``/``*_count``/``*_total`` sample of vLLM's Prometheus text (summed over
    label sets)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, _, val = line.rpartition(" ")
        base = name.split("{", 1)[0]
        if base.endswith(("_sum", "_count", "_total")):
            out[base] = out.get(base, 0.0) + float(val)
    return out


class Server:
    """A running ``vllm serve`` (context manager). ``pid`` is the API server process (the front end).

    Raises:
        BackendUnavailable: vLLM missing, or the server did not answer ``/health`` within ``START_TIMEOUT_S``
            (its log is in ``run_dir/serve.log``).
    """

    def __init__(self, model: Path, run_dir: Path, max_model_len: int = 4096):
        self.model, self.run_dir, self.max_model_len = model, run_dir, max_model_len
        self.url = f"http://127.0.0.1:{PORT}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        from dlfp.backends.vllm.runner import pin_cpu_threads, require_vllm, setup_run_dir

        require_vllm()
        setup_run_dir(self.run_dir)
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="2")
        pin_cpu_threads(env)
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--port", str(PORT),
               "--load-format", "dummy", "--dtype", "float32", "--enforce-eager", "--max-model-len",
               str(self.max_model_len), "--max-num-batched-tokens", str(self.max_model_len),
               "--no-enable-prefix-caching", "--seed", "0", "--served-model-name", "tiny"]
        self.log = open(self.run_dir / "serve.log", "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, cwd=self.run_dir)
        asyncio.run(self._wait_healthy())
        self.pid = self.proc.pid
        return self

    async def _wait_healthy(self) -> None:
        import aiohttp

        deadline = time.monotonic() + START_TIMEOUT_S
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    async with s.get(self.url + "/health") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(1.0)
        self.__exit__()
        raise BackendUnavailable(f"vllm serve did not start; see {self.run_dir / 'serve.log'}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()

    def cpu_s(self) -> float:
        """CPU seconds every thread of the API server process has run so far (``/proc/<pid>/task/*/schedstat``,
        nanoseconds; the ``cpu_times`` ticks of 10 ms are too coarse for one request)."""
        total = 0
        for f in Path(f"/proc/{self.pid}/task").glob("*/schedstat"):
            try:
                total += int(f.read_text().split()[0])
            except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
                continue
        return total * 1e-9


async def metrics(session, url: str) -> dict[str, float]:
    """The server's Prometheus sums and counts now (``_metric_sums``)."""
    async with session.get(url + "/metrics") as r:
        return _metric_sums(await r.text())


async def stream(session, url: str, endpoint: str, prompt, max_tokens: int) -> dict:
    """Send one streamed request; returns ``send_s`` (``time.perf_counter``) and ``token_s`` (arrival of each
    server-sent event carrying a token). ``endpoint``: ``completions`` (``prompt`` a string or token ids) or
    ``chat`` (``prompt`` the user message)."""
    body = {"model": "tiny", "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True}
    if endpoint == "chat":
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/v1/completions", prompt
    t0 = time.perf_counter()
    times: list[float] = []
    async with session.post(url + path, json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status}: {(await r.text())[:200]}")
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"]
            delta = choice[0].get("delta", {}) if choice else {}
            if choice and (choice[0].get("text") is not None or ("content" in delta and "role" not in delta)):
                times.append(time.perf_counter())  # the chat stream's first event only names the role
    return {"send_s": t0, "token_s": times}
