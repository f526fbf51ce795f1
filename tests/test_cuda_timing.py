"""Bookkeeping of the CUDA-event forward timer, on CPU with a fake event source (no GPU, no vLLM needed).

A fake clock (seconds) stands in for the device: each fake forward advances
it by a set duration, a fake event's ``record()`` reads it, and
``elapsed_time`` returns milliseconds between two recorded reads, as
``torch.cuda.Event`` does. Every expected value is worked out by hand.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from dlfp.backends.vllm.cuda_timing import ForwardTimer, install_forward_timer, wrap_forward


class Clock:
    def __init__(self) -> None:
        self.now = 100.0  # seconds


class FakeEvent:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.t: float | None = None
        self.synced = 0

    def record(self) -> None:
        self.t = self.clock.now

    def synchronize(self) -> None:
        self.synced += 1

    def elapsed_time(self, other: "FakeEvent") -> float:
        assert self.t is not None and other.t is not None, "event not recorded"
        return (other.t - self.t) * 1e3  # milliseconds


def make_runner_cls(clock: Clock) -> type:
    """A fresh fake runner class per test (wrapping patches the class)."""

    class Runner:
        def __init__(self) -> None:
            self.durations: list[float] = []

        def _model_forward(self, input_ids=None, positions=None, **model_kwargs):
            clock.now += self.durations.pop(0)
            return ("out", input_ids, positions, model_kwargs)

        def _dummy_run(self, num_tokens: int, **kw):
            # vLLM 0.17.1's _dummy_run calls self.model(...) directly; this one routes
            # through _model_forward so the guard is exercised.
            return self._model_forward(input_ids=num_tokens)

    return Runner


def cfg(world_size: int = 1, backend: str | None = "uni") -> SimpleNamespace:
    return SimpleNamespace(parallel_config=SimpleNamespace(world_size=world_size, distributed_executor_backend=backend))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def timer(clock: Clock) -> ForwardTimer:
    return ForwardTimer(lambda: FakeEvent(clock))


def test_fifo_order_and_values(clock, timer):
    cls = make_runner_cls(clock)
    wrap_forward(cls, timer)
    r = cls()
    r.durations = [0.010, 0.025, 0.040]
    for _ in range(3):
        r._model_forward(input_ids=[1])
    assert timer.pending == 3
    assert timer.pop_elapsed_s() == pytest.approx(0.010, rel=1e-9)
    assert timer.pop_elapsed_s() == pytest.approx(0.025, rel=1e-9)
    assert timer.pop_elapsed_s() == pytest.approx(0.040, rel=1e-9)
    assert timer.pending == 0
    assert timer.pop_elapsed_s() is None


def test_pop_synchronizes_end_event(clock, timer):
    cls = make_runner_cls(clock)
    wrap_forward(cls, timer)
    r = cls()
    r.durations = [0.5]
    r._model_forward()
    start, end = timer._pairs[0]
    assert timer.pop_elapsed_s() == pytest.approx(0.5, rel=1e-9)
    assert (start.synced, end.synced) == (0, 1)


def test_passes_args_and_returns_value(clock, timer):
    cls = make_runner_cls(clock)
    original = cls._model_forward
    wrap_forward(cls, timer)
    assert cls._model_forward is not original
    assert cls._model_forward.__name__ == "_model_forward"
    r = cls()
    r.durations = [0.002]
    out = r._model_forward([7, 8], positions=[0, 1], inputs_embeds=None, extra=3)
    assert out == ("out", [7, 8], [0, 1], {"inputs_embeds": None, "extra": 3})
    assert timer.pending == 1


def test_raising_forward_queues_nothing(clock, timer):
    cls = make_runner_cls(clock)
    wrap_forward(cls, timer)
    r = cls()
    r.durations = []  # pop(0) on an empty list raises IndexError inside the original
    with pytest.raises(IndexError):
        r._model_forward()
    assert timer.pending == 0


def test_wrap_twice_records_once(clock, timer):
    cls = make_runner_cls(clock)
    assert wrap_forward(cls, timer) is timer
    wrapped = cls._model_forward
    other = ForwardTimer(lambda: FakeEvent(clock))
    assert wrap_forward(cls, timer) is timer
    assert wrap_forward(cls, other) is timer  # the timer already in effect
    assert cls._model_forward is wrapped
    r = cls()
    r.durations = [0.003]
    r._model_forward()
    assert (timer.pending, other.pending) == (1, 0)
    assert timer.pop_elapsed_s() == pytest.approx(0.003, rel=1e-9)


def test_subclass_of_wrapped_class_not_rewrapped(clock, timer):
    cls = make_runner_cls(clock)
    wrap_forward(cls, timer)
    sub = type("Sub", (cls,), {})
    assert wrap_forward(sub, ForwardTimer(lambda: FakeEvent(clock))) is timer
    r = sub()
    r.durations = [0.004]
    r._model_forward()
    assert timer.pending == 1


def test_max_pending_drops_oldest(clock):
    t = ForwardTimer(lambda: FakeEvent(clock), max_pending=2)
    cls = make_runner_cls(clock)
    wrap_forward(cls, t)
    r = cls()
    r.durations = [0.001, 0.002, 0.003, 0.004]
    for _ in range(4):
        r._model_forward()
    assert (t.pending, t.dropped) == (2, 2)
    assert t.pop_elapsed_s() == pytest.approx(0.003, rel=1e-9)
    assert t.pop_elapsed_s() == pytest.approx(0.004, rel=1e-9)
    assert t.pop_elapsed_s() is None
    t.clear()
    assert t.dropped == 2  # clear keeps the counter


def test_default_max_pending_and_bad_value(clock):
    assert ForwardTimer(lambda: FakeEvent(clock)).max_pending == 4096
    with pytest.raises(ValueError, match="max_pending"):
        ForwardTimer(lambda: FakeEvent(clock), max_pending=0)


def test_dummy_run_not_recorded(clock, timer):
    cls = make_runner_cls(clock)
    wrap_forward(cls, timer)
    r = cls()
    r.durations = [0.020, 0.030, 0.015]
    assert r._dummy_run(16) == ("out", 16, None, {})
    r._model_forward()
    r._dummy_run(1)
    assert timer.pending == 1
    assert timer._dummy_depth == 0
    assert timer.pop_elapsed_s() == pytest.approx(0.030, rel=1e-9)


def test_dummy_run_guard_reset_after_error(clock, timer):
    cls = make_runner_cls(clock)
    wrap_forward(cls, timer)
    r = cls()
    r.durations = []
    with pytest.raises(IndexError):
        r._dummy_run(1)
    assert timer._dummy_depth == 0
    r.durations = [0.006]
    r._model_forward()
    assert timer.pop_elapsed_s() == pytest.approx(0.006, rel=1e-9)


def test_class_without_model_forward_raises(timer):
    with pytest.raises(TypeError, match="_model_forward"):
        wrap_forward(type("NoForward", (), {}), timer)


@pytest.mark.parametrize("config, cuda", [
    (cfg(), False),
    (cfg(world_size=2), True),
    (cfg(backend="mp"), True),
    (cfg(backend="ray"), True),
    (cfg(backend="external_launcher"), True),
])
def test_install_returns_none_and_patches_nothing(clock, config, cuda):
    cls = make_runner_cls(clock)
    forward, dummy = cls.__dict__["_model_forward"], cls.__dict__["_dummy_run"]
    got = install_forward_timer(config, runner_cls=cls, event_factory=lambda: FakeEvent(clock), cuda_available=cuda)
    assert got is None
    assert cls.__dict__["_model_forward"] is forward
    assert cls.__dict__["_dummy_run"] is dummy
    assert not hasattr(cls, "_dlfp_forward_timer")


@pytest.mark.parametrize("backend", [None, "uni"])
def test_install_in_process_and_idempotent(clock, backend):
    cls = make_runner_cls(clock)
    kw = dict(runner_cls=cls, event_factory=lambda: FakeEvent(clock), cuda_available=True)
    timer = install_forward_timer(cfg(backend=backend), **kw)
    assert isinstance(timer, ForwardTimer) and timer.max_pending == 4096
    wrapped = cls._model_forward
    assert install_forward_timer(cfg(backend=backend), **kw) is timer
    assert cls._model_forward is wrapped
    r = cls()
    r.durations = [0.012]
    r._model_forward()
    assert timer.pending == 1
    assert timer.pop_elapsed_s() == pytest.approx(0.012, rel=1e-9)


def test_install_clears_earlier_pairs(clock):
    cls = make_runner_cls(clock)
    kw = dict(runner_cls=cls, event_factory=lambda: FakeEvent(clock), cuda_available=True)
    timer = ForwardTimer(lambda: FakeEvent(clock))
    wrap_forward(cls, timer)  # forwards before the scheduler exists (profiling, warm-up)
    r = cls()
    r.durations = [0.100, 0.200, 0.007]
    r._model_forward()
    r._model_forward()
    assert timer.pending == 2
    assert install_forward_timer(cfg(), **kw) is timer
    assert timer.pending == 0
    r._model_forward()
    assert timer.pop_elapsed_s() == pytest.approx(0.007, rel=1e-9)
    assert timer.pop_elapsed_s() is None
