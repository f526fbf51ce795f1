"""The API server in front of the engine: one event loop and one tokenizer thread, as queues.

vLLM 0.17.1's ``vllm serve`` runs the OpenAI-compatible server in one process on one asyncio event loop
(``vllm/entrypoints/openai/api_server.py``, ``run_server``):

* per request, on the event loop: HTTP and the pydantic body, the chat template for ``/v1/chat/completions``, the
  engine request (``InputProcessor``) and ``AsyncLLM.add_request``, which sends it to the EngineCore process;
* a text prompt is tokenized on one extra thread (``vllm/utils/async_utils.py``, ``AsyncMicrobatchTokenizer``:
  ``ThreadPoolExecutor(max_workers=1)``), which waits up to ``batch_wait_timeout_s`` = 2 ms for more prompts to
  encode in one call; a token-id prompt skips it;
* per engine output (``vllm/v1/engine/async_llm.py``, ``_run_output_handler``): the output handler task takes one
  ``EngineCoreOutputs``, detokenizes each request's new token (``OutputProcessor.process_outputs``), records the
  iteration's statistics, and each request's stream writes one server-sent event.

``FrontEnd`` queues that work: a request sent at ``s`` starts on the event loop at ``max(s, loop free)`` and holds it
``request_s + request_per_token_s x prompt tokens``; a text prompt then waits for the tokenizer thread (at least the
2 ms window when the thread is idle: ``max(ready + window, tokenizer free)``) and holds it ``tokenize_per_token_s x
prompt tokens``; the request reaches the engine ``HostCosts.ingest_s`` after that. The outputs of an iteration
processed by the engine at ``t`` start on the event loop at ``max(t, loop free)``, hold it ``output_s +
output_per_token_s x tokens`` and reach the client ``HostCosts.frontend_output_s`` after that. Work is taken in the
order it arrives (FIFO). The micro-batch's encode call is modelled as its prompts encoded one after the other.

Constants: ``ENDPOINTS``, fitted by ``dlfp.studies.frontend.fit`` to the API server's CPU time on the real
``vllm serve`` on this project's 2-core Xeon (``data/results/frontend/``), taken unchanged for the paper's host
(``FrontendCosts`` docstring). Endpoint ``none`` (all zero) is the engine without an API server, as the
real-engine trials here drive it (``AsyncLLM`` in the harness).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from dlfp.devices.host import check_non_negative_fields

#: ``AsyncMicrobatchTokenizer.batch_wait_timeout_s`` (vLLM 0.17.1, ``vllm/utils/async_utils.py``).
TOKENIZE_WINDOW_S = 0.002


@dataclass(frozen=True)
class FrontendCosts:
    """Per-request and per-token work of the API server (seconds of one CPU).

    * ``request_s`` + ``request_per_token_s`` x prompt tokens: event-loop work of one request before it is sent to
      the engine (HTTP, body validation, chat template, ``InputProcessor``; the per-token term is the JSON of a
      token-id prompt);
    * ``tokenize_per_token_s`` x prompt tokens: the tokenizer thread (text prompts; 0 for token ids);
    * ``output_s`` per engine output and ``output_per_token_s`` per request token in it: the output handler,
      detokenization and the server-sent event.

    Scaling to the paper's host: this work is single-threaded, so it scales with one core's speed. The one
    comparison available (a pure-Python scheduler benchmark, ``data/gpu-measurements/h200/step_floor_host.json``)
    found a GPU server's host no faster than this VM, so the values are used unscaled (an assumption).

    Raises:
        ValueError: a negative or non-finite value (naming the field).
    """

    request_s: float = 0.0
    request_per_token_s: float = 0.0
    tokenize_per_token_s: float = 0.0
    output_s: float = 0.0
    output_per_token_s: float = 0.0

    def __post_init__(self):
        check_non_negative_fields(self, "frontend")

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def enabled(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))


#: Fitted by ``dlfp frontend`` (``dlfp.studies.frontend.fit``) on this project's host; the test suite refits them
#: from the committed measurements (``data/results/frontend/requests.csv``, ``phases.csv``) and compares.
ENDPOINTS: dict[str, FrontendCosts] = {
    "completions": FrontendCosts(request_s=3862.15e-6, tokenize_per_token_s=5.81e-6, output_s=637.34e-6,
                                 output_per_token_s=23.12e-6),
    "completions_ids": FrontendCosts(request_s=2537.86e-6, request_per_token_s=1.60e-6, output_s=637.34e-6,
                                     output_per_token_s=23.12e-6),
    "chat": FrontendCosts(request_s=4003.52e-6, tokenize_per_token_s=5.35e-6, output_s=637.34e-6,
                          output_per_token_s=23.12e-6),
    "none": FrontendCosts(),
}


def frontend_costs(endpoint: str) -> FrontendCosts:
    """The costs of ``endpoint`` (a key of ``ENDPOINTS``).

    Raises:
        ValueError: unknown endpoint (naming the known ones).
    """
    try:
        return ENDPOINTS[endpoint]
    except KeyError:
        raise ValueError(f"field backend_options.sim.frontend: unknown endpoint {endpoint!r}; known: "
                         f"{', '.join(ENDPOINTS)}") from None


class FrontEnd:
    """The event loop and tokenizer thread of one run (module docstring). Times are seconds from the trial start.

    ``request(send_s, prompt_tokens)`` must be called in send order, and ``output(t, n)`` with ``t`` never
    decreasing; the caller interleaves them by time (``dlfp.backends.sim.engine``).
    """

    __slots__ = ("c", "text", "loop_free", "tok_free", "ingest_s", "output_delay_s")

    def __init__(self, costs: FrontendCosts, ingest_s: float, frontend_output_s: float):
        self.c = costs
        self.text = costs.tokenize_per_token_s > 0
        self.loop_free = 0.0
        self.tok_free = 0.0
        self.ingest_s = ingest_s
        self.output_delay_s = frontend_output_s

    def request(self, send_s: float, prompt_tokens: int) -> float:
        """A request sent at ``send_s``: returns when it reaches the engine (s)."""
        c = self.c
        start = send_s if send_s > self.loop_free else self.loop_free
        done = start + c.request_s + c.request_per_token_s * prompt_tokens
        self.loop_free = done
        if self.text:
            ready = done + TOKENIZE_WINDOW_S
            start = ready if ready > self.tok_free else self.tok_free
            done = start + c.tokenize_per_token_s * prompt_tokens
            self.tok_free = done
        return done + self.ingest_s

    def output(self, t: float, num_tokens: int) -> float:
        """An engine output of ``num_tokens`` request tokens processed by the engine at ``t``: returns when its
        tokens reach the client (s)."""
        c = self.c
        start = t if t > self.loop_free else self.loop_free
        done = start + c.output_s + c.output_per_token_s * num_tokens
        self.loop_free = done
        return done + self.output_delay_s
