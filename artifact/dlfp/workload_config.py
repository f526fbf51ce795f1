"""The ``workload:`` section of an experiment config (``dlfp.config.ExperimentConfig.workload``), and the strict
pydantic base and number types every config model shares (re-exported by ``dlfp.config``).

Every field is checked before anything runs; a bad value is a one-line error naming the field
(``dlfp.config.validation_message``). Times are seconds; rates are requests per second.

How requests are sent (``kind``):

* ``agent``, ``fixed``, ``trace``, ``requests``: open loop, every request sent at its precomputed arrival time.
* ``burst``: every request sent at t = 0, as ``vllm bench serve --request-rate inf`` without
  ``--max-concurrency``.
* ``closed_loop``: ``concurrency`` clients, as ``vllm bench serve --max-concurrency N`` (vLLM 0.17.1,
  ``vllm/benchmarks/serve.py``, ``benchmark``: ``limited_request_func`` holds an ``asyncio.Semaphore(N)``
  from before a request is sent until its response stream has ended). Requests are released on the schedule
  ``rate`` gives (a Poisson process, as ``serve.py``'s ``get_request`` with ``--burstiness 1``; no ``rate`` =
  ``--request-rate inf``: all released at t = 0) and sent, in order, when released and a slot is free.

``burst`` and ``closed_loop`` take their prompt lengths from ``prompts``: ``agent`` (the agent profile's
quantiles, ``prompt_source``, ``prompt_scale``) or ``fixed`` (``prompt_tokens``), both clipped to
``[min_prompt_tokens, max_prompt_tokens]`` exactly as the kinds of the same names.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_serializer, model_validator

from dlfp.policies.base import reject_bool

#: An int field that rejects booleans (``num_requests: true`` is a typo, not 1).
Int = Annotated[int, BeforeValidator(reject_bool)]
#: A float field that rejects booleans; non-finite values are rejected model-wide (``allow_inf_nan=False``).
Float = Annotated[float, BeforeValidator(reject_bool)]

#: Workload fields a dump leaves out while they hold their default, so every config written before the field
#: existed dumps (and hashes, ``dlfp.trial_config``) exactly as before; an override may still set them.
OMITTED_AT_DEFAULT = {"prompt_source": "mooncake-conversation", "concurrency": None, "prompts": "agent"}
#: Kinds whose requests are not sent at precomputed times, or are all sent at once, and take ``prompts``.
LOAD_KINDS = ("closed_loop", "burst")


class Strict(BaseModel):
    """Base of every config model: unknown fields rejected, immutable, no NaN or infinity."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TraceReplay(Strict):
    """Replay of a production trace file (Mooncake JSONL or Azure LLM CSV)."""

    path: str
    format: Literal["mooncake", "azure"]
    window: Int = Field(default=0, ge=0, description="first N usable requests; 0 = all")
    start: Int = Field(default=0, ge=0, description="skip this many rows first")
    nonmatching: bool = True
    follow_hash_ids: bool = False
    use_trace_output_lengths: bool = False
    max_prompt_tokens: Int = Field(default=32768, gt=0)
    start_by_seed: dict[Annotated[int, Field(ge=0)], Annotated[Int, Field(ge=0)]] | None = Field(
        default=None, description="seed -> start row; paired seeds replay different trace windows")
    timing: Literal["rate", "native"] | None = Field(
        default=None, description="rate (default): time-scale the window to workload.rate; native: the trace's own "
                                  "timestamps (workload.rate unused)")


class RequestRow(Strict):
    """One request of an explicit request list: arrival (s from the trial start), prompt and output tokens."""

    arrival_s: Float = Field(ge=0)
    prompt_tokens: Int = Field(gt=0)
    output_tokens: Int = Field(gt=0)


class Workload(Strict):
    """The request workload shared by every backend (module docstring: how each kind sends its requests).

    ``rate`` is requests per second of a Poisson process (kinds agent, fixed, and closed_loop's release
    schedule) or the target mean rate a replayed trace is time-scaled to. ``num_warmup`` requests come first and
    are excluded from metrics (in a closed loop they hold client slots like any other request).
    """

    kind: Literal["agent", "fixed", "trace", "requests", "closed_loop", "burst"] = "agent"
    rate: Float | None = Field(default=None, gt=0, description="requests/s; not used by request lists, natively "
                                                               "timed traces and bursts; optional for closed_loop")
    concurrency: Int | None = Field(default=None, gt=0, description="kind=closed_loop: clients (requests in flight "
                                                                    "at most), as bench serve's --max-concurrency")
    prompts: Literal["agent", "fixed"] = Field(default="agent", description="kind=closed_loop/burst: prompt lengths "
                                                                            "as kind=agent or kind=fixed gives them")
    num_requests: Int = Field(gt=0, description="measured requests")
    num_warmup: Int = Field(default=0, ge=0)
    output_tokens: Int = Field(default=128, gt=0)
    prompt_tokens: Int | None = Field(default=None, gt=0, description="for kind=fixed and prompts=fixed")
    prompt_scale: Float = Field(default=1.0, gt=0, description="multiply sampled prompt lengths")
    prompt_source: Literal["mooncake-conversation", "mooncake-synthetic", "azure-code", "azure-conversation"] = Field(
        default="mooncake-conversation", description="agent prompts: the trace whose prompt-length quantiles are "
                                                     "sampled (dlfp.workload.profiles.PROMPT_SOURCES)")
    min_prompt_tokens: Int = Field(default=16, gt=0)
    max_prompt_tokens: Int = Field(default=32768, gt=0)
    vocab_size: Int = Field(default=151936, gt=1000)
    trace: TraceReplay | None = None
    requests: list[RequestRow] | None = Field(default=None, description="kind=requests: the request list, in order")
    requests_csv: str | None = Field(default=None, description="kind=requests: a CSV with columns arrival_s, "
                                                               "prompt_tokens, output_tokens (repo-relative path)")

    @model_validator(mode="after")
    def _kind_fields(self) -> "Workload":
        if self.kind == "fixed" and self.prompt_tokens is None:
            raise ValueError("workload.prompt_tokens is required when kind=fixed")
        if self.kind == "trace" and self.trace is None:
            raise ValueError("workload.trace is required when kind=trace")
        if self.kind == "requests" and (self.requests is None) == (self.requests_csv is None):
            raise ValueError("workload: kind=requests needs exactly one of requests and requests_csv")
        if self.kind != "requests" and (self.requests is not None or self.requests_csv is not None):
            raise ValueError(f"workload.requests: only for kind=requests, not kind={self.kind}")
        self._load_fields()
        if self.rate is None and self.uses_rate():
            raise ValueError(f"workload.rate is required for kind={self.kind}")
        if self.min_prompt_tokens > self.max_prompt_tokens:
            raise ValueError("workload.min_prompt_tokens is larger than max_prompt_tokens")
        if self.requests is not None and len(self.requests) != self.num_warmup + self.num_requests:
            raise ValueError(f"workload.requests: {len(self.requests)} rows, but num_warmup + num_requests = "
                             f"{self.num_warmup + self.num_requests}")
        return self

    def _load_fields(self) -> None:
        """The fields of ``closed_loop`` and ``burst``: ``concurrency``, ``prompts`` and the rate of a burst.

        Raises:
            ValueError: one line naming the field.
        """
        if self.kind == "closed_loop" and self.concurrency is None:
            raise ValueError("workload.concurrency is required when kind=closed_loop")
        if self.kind != "closed_loop" and self.concurrency is not None:
            raise ValueError(f"workload.concurrency: only for kind=closed_loop, not kind={self.kind}")
        if self.kind not in LOAD_KINDS and self.prompts != "agent":  # (the default, which any kind may carry)
            raise ValueError(f"workload.prompts: only for kind=closed_loop or kind=burst, not kind={self.kind} "
                             f"(its kind sets its prompt lengths)")
        if self.kind == "burst" and self.rate is not None:
            raise ValueError("workload.rate: not used by kind=burst (every request is sent at t = 0); "
                             "kind=closed_loop takes a rate")
        if self.kind in LOAD_KINDS and self.prompts == "fixed" and self.prompt_tokens is None:
            raise ValueError("workload.prompt_tokens is required when prompts=fixed")
        if self.kind in LOAD_KINDS and self.prompts == "agent" and self.prompt_tokens is not None:
            raise ValueError("workload.prompt_tokens: only used with prompts=fixed (prompts=agent samples lengths)")

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        """Dumps leave out the fields of ``OMITTED_AT_DEFAULT`` at their default, so every config written before
        those fields existed (trace metadata, derived-experiment names, trial-config hashes) dumps as before."""
        d = handler(self)
        if isinstance(d, dict):
            for name, default in OMITTED_AT_DEFAULT.items():
                if name in d and d[name] == default:
                    d.pop(name)
        return d

    def uses_rate(self) -> bool:
        """Whether arrivals depend on ``rate`` (Poisson arrivals or releases, or a trace time-scaled to it)."""
        if self.kind in ("requests", "burst"):
            return False
        if self.kind == "closed_loop":
            return self.rate is not None
        return not (self.kind == "trace" and self.trace is not None and self.trace.timing == "native")

    def prompt_lengths(self) -> Literal["agent", "fixed"] | None:
        """How prompt lengths are drawn: ``"agent"`` (profile quantiles), ``"fixed"`` (``prompt_tokens``), or
        ``None`` for a trace replay or a request list (their own lengths)."""
        if self.kind in ("agent", "fixed"):
            return self.kind
        return self.prompts if self.kind in LOAD_KINDS else None

    def longest_prompt(self) -> int:
        """The longest prompt (tokens) this workload can produce after clipping."""
        hi = self.max_prompt_tokens
        if self.prompt_lengths() == "fixed" and self.prompt_tokens is not None:
            hi = max(self.min_prompt_tokens, min(self.prompt_tokens, hi))
        if self.kind == "trace" and self.trace is not None:
            hi = min(hi, self.trace.max_prompt_tokens)
        return hi


__all__ = ["Float", "Int", "LOAD_KINDS", "OMITTED_AT_DEFAULT", "RequestRow", "Strict", "TraceReplay", "Workload"]
