"""DLFP-S's TTFT guard: a larger prefill chunk for a request that would otherwise miss its TTFT SLO.

If the backend passes ``oldest_remaining_tokens`` (the oldest waiting
request's remaining prompt tokens ``R``) the guard picks the smallest
quantised chunk ``c`` in ``(cap, max_cap]`` with ``ceil(R / c) * T(c) <=
slack`` (``T`` is the iteration time of a ``c``-token chunk, from the
controller), or no cap if none fits. Without it the guard grants ``max_cap``
once the request has used ``guard_frac`` of its SLO. The guard never acts once
the SLO has already been missed (``slack <= 0``): the request fails anyway and
a bigger chunk would only stall the decoding streams.

Times are seconds; caps, chunks and prompt sizes are tokens.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from dlfp.policies.base import check_count


def guard_chunk(
    cap: int, *, slo_s: float, waited_s: float, remaining: int | None, guard_frac: float, quantum: int,
    max_cap: int, iter_time_s: Callable[[int], float],
) -> int | None:
    """The prefill chunk (tokens) the TTFT guard grants instead of ``cap``; ``None`` = no cap.

    Args:
        cap: the controller's cap for the next iteration (tokens).
        slo_s: the TTFT SLO (seconds).
        waited_s: how long the oldest request without a first token has waited (seconds).
        remaining: its prompt tokens still to prefill, or ``None`` when the backend does not say.
        guard_frac: without ``remaining``, the share of ``slo_s`` waited after which ``max_cap`` is granted.
        quantum: chunk sizes tried are ``cap + k * quantum`` (tokens).
        max_cap: the largest chunk tried (tokens).
        iter_time_s: iteration time (seconds) of a chunk of the given size.

    Returns:
        ``cap`` when the guard does not act, a larger chunk, or ``None`` when no
        chunk up to ``max_cap`` meets the slack.

    Raises:
        ValueError: ``remaining`` negative or not an integer.
    """
    slack = slo_s - waited_s
    if slack <= 0:  # already missed: a bigger chunk cannot save it
        return cap
    if remaining is None:
        if waited_s >= guard_frac * slo_s:
            return max(cap, max_cap)
        return cap
    check_count("oldest_remaining_tokens", remaining)
    if remaining == 0:
        return cap

    def need(c: int) -> float:
        return math.ceil(remaining / c) * iter_time_s(c)

    if need(cap) <= slack:
        return cap
    c = cap + quantum
    while c <= max_cap:
        if need(c) <= slack:
            return c
        c += quantum
    return None


__all__ = ["guard_chunk"]
