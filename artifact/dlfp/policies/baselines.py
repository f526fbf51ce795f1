"""The two non-adaptive baselines: stock chunked prefill (NoCap) and a fixed prefill cap (FixedCap)."""
from __future__ import annotations

from dlfp.policies.base import Observation, PolicyBase, ScheduleContext, check_count, is_int


class NoCap(PolicyBase):
    """Stock chunked prefill: the engine's token budget is the only limit.

    Raises:
        ValueError: unknown ``signal``.
    """

    name = "nocap"

    def prefill_cap(self, num_decoding: int, *, now_s: float = 0.0, oldest_waiting_s: float | None = None,
                    oldest_remaining_tokens: int | None = None, context: ScheduleContext | None = None) -> None:
        """Always ``None`` (no cap)."""
        check_count("num_decoding", num_decoding)
        return None

    def observe(self, obs: Observation) -> None:
        """Record the observation; nothing changes."""
        self._record(obs, None, None, "nocap")


class FixedCap(PolicyBase):
    """A fixed prefill cap of ``cap`` tokens while at least one request decodes.

    Raises:
        ValueError: ``cap`` not a positive integer, or an unknown ``signal``.
    """

    name = "fixed"
    config_fields = ("cap", "signal")

    def __init__(self, cap: int, signal: str = "host_cadence") -> None:
        super().__init__(signal)
        if not is_int(cap) or cap <= 0:
            raise ValueError(f"fixed cap must be a positive integer number of tokens, got {cap!r}")
        self.cap = int(cap)

    def prefill_cap(self, num_decoding: int, *, now_s: float = 0.0, oldest_waiting_s: float | None = None,
                    oldest_remaining_tokens: int | None = None, context: ScheduleContext | None = None) -> int | None:
        """``cap`` tokens while ``num_decoding > 0``, else ``None``."""
        check_count("num_decoding", num_decoding)
        return self.cap if num_decoding > 0 else None

    def observe(self, obs: Observation) -> None:
        """Record the observation; the cap never moves."""
        self._record(obs, self.cap, self.cap, "fixed")

    def params(self) -> dict:
        return {**super().params(), "cap": self.cap}


__all__ = ["FixedCap", "NoCap"]
