"""Preemption as vLLM 0.17.1 does it with prefix caching: a resumed request hits its own blocks until evicted.

The hand-worked example (block size 4, 6 KV blocks, sync scheduling, no cap):

* step 1: A and B (8-token prompts) prefill, 2 blocks each; 2 blocks free. Every later step decodes both.
* step k: each has ``8 + k - 1`` computed tokens before the step. At step 2 each takes its 3rd block (free 0).
* step 6: A (12 computed) needs a 4th block; none is free, so B, the last running request, is preempted: its 3
  blocks go to the free queue's tail, tail block first; its 12 computed tokens of 13 known ones fill 3 whole
  blocks, all cached. A's new block comes from the queue's head, which is B's tail block: B keeps 2 cached blocks.
* step 7: A samples its 7th and last token; B (13 tokens, needs 4 blocks of which 2 cached) does not fit in the 2
  free blocks (vLLM counts the hit blocks it takes out of the free queue too), so it waits.
* step 8: A's 4 blocks are free (6 in all). B hits 2 blocks = 8 tokens (at most 13 - 1 tokens, whole blocks) and
  recomputes the other 5; without prefix caching it recomputes all 13.
"""
from __future__ import annotations

import pytest

from dlfp.backends.sim.scheduler import FINISHED, Scheduler, SimRequest


class _NoCap:
    signal = "host_cadence"

    def prefill_cap(self, num_decodes, **_kw):
        return None


def _sched(prefix_caching: bool) -> Scheduler:
    return Scheduler(max_num_batched_tokens=64, max_num_seqs=8, block_size=4, num_gpu_blocks=6, max_model_len=64,
                     async_scheduling=False, prefix_caching=prefix_caching)


def _step(s: Scheduler) -> list[tuple]:
    """One sync engine step: schedule, then each sampling entry emits a token (finishing at ``M`` tokens)."""
    entries, _cap = s.schedule(0.0, _NoCap())
    for r, _n, _c, _dec, smp in entries:
        if smp:
            r.out += 1
            if r.out >= r.M:
                s.finish(r)
    _check_blocks(s)
    return [(r.rid, n, c) for r, n, c, _d, _s in entries]


def _check_blocks(s: Scheduler) -> None:
    """Invariants: the free count is the free queue's total; free + held blocks = all blocks."""
    held = sum(r.blocks for r in s.running) + sum(r.blocks for r in s.waiting)
    assert s.free_blocks + held == s.num_gpu_blocks
    if s.prefix_caching:
        assert sum(n for _o, n in s.free_queue) == s.free_blocks
        assert all(n > 0 for _o, n in s.free_queue)


def _run_example(prefix_caching: bool):
    s = _sched(prefix_caching)
    a, b = SimRequest(0, "A", 0.0, 8, 7), SimRequest(1, "B", 0.0, 8, 20)
    s.waiting.extend([a, b])
    steps = [_step(s) for _ in range(8)]
    return s, a, b, steps


def test_resumed_request_recomputes_only_what_was_evicted():
    s, a, b, steps = _run_example(True)
    assert steps[0] == [("A", 8, 0), ("B", 8, 0)]
    assert steps[5] == [("A", 1, 12)]  # B preempted to give A its 4th block
    assert b.preemptions == 1 and s.num_preemptions == 1
    assert steps[6] == [("A", 1, 13)]  # B does not fit: 2 new + 2 hit blocks > 2 free
    assert a.status == FINISHED
    assert steps[7] == [("B", 5, 8)]  # 2 cached blocks hit: 8 tokens; 13 - 8 recomputed
    assert s.num_cached_tokens_hit == 8
    assert b.blocks == 4 and s.free_blocks == 2 and [n for _o, n in s.free_queue] == [2]


def test_without_prefix_caching_a_resumed_request_recomputes_everything():
    s, _a, b, steps = _run_example(False)
    assert steps[5] == [("A", 1, 12)] and steps[6] == [("A", 1, 13)]
    assert steps[7] == [("B", 13, 0)]
    assert s.num_cached_tokens_hit == 0 and b.blocks == 4 and s.free_blocks == 2


def _preempted(prompt: int, out: int) -> tuple[Scheduler, SimRequest]:
    """A scheduler whose only request B (12 tokens computed in 3 blocks, 3 blocks free) has just been preempted."""
    s = _sched(True)
    b = SimRequest(1, "B", 0.0, prompt, 20)
    b.computed, b.out, b.blocks, b.status = 12, out, 3, 1
    s.running.append(b)
    s.free_blocks = 3
    s.free_queue.clear()
    s.free_queue.append([None, 3])
    s._preempt(s.running.pop())
    return s, b


def test_eviction_takes_a_preempted_requests_tail_blocks_first():
    """B's 3 cached blocks lose 1 to A (the tail one), so B hits 2; had nothing been taken it would hit 3."""
    s, b = _preempted(prompt=8, out=5)
    assert b.cached_full == 3 and s._cache_hit(b) == 3  # 12 computed of 13 known: 3 whole blocks
    s._take(3)  # the never-used blocks at the head go first
    assert s._cache_hit(b) == 3
    s._take(1)  # then B's tail block
    assert s._cache_hit(b) == 2
    s._take(2)
    assert s._cache_hit(b) == 0 and b.free_seg is None


def test_a_hit_never_covers_the_last_known_token():
    """All 12 tokens of a preempted request cached in 3 whole blocks: the hit stops at (12 - 1) // 4 = 2 blocks."""
    s, b = _preempted(prompt=11, out=1)
    assert b.cached_full == 3 and s._cache_hit(b) == 2


@pytest.mark.parametrize("scheduling", ["sync", "async"])
def test_engine_recomputes_fewer_tokens_with_prefix_caching_and_keeps_every_block(scheduling):
    """A KV-bound run of the simulator engine: the same requests finish; with prefix caching the preempted requests
    recompute fewer prefill tokens; without preemptions both runs are identical."""
    from types import SimpleNamespace

    from dlfp.backends.sim.engine import SimEngine
    from dlfp.config import load_experiment
    from dlfp.backends.sim.runner import build_engine_parts
    from dlfp.policies.baselines import NoCap

    cfg = load_experiment("qwen3-0.6b-tp1")
    _m, _g, dm, host, _blocks = build_engine_parts(cfg)
    reqs = [SimpleNamespace(request_id=f"r{i}", arrival_s=0.01 * i, prompt_tokens=300 + 7 * i, output_tokens=60)
            for i in range(24)]

    def run(blocks: int, cached: bool):
        eng = SimEngine(dm, NoCap(), scheduling=scheduling, max_num_batched_tokens=512, max_num_seqs=64,
                        block_size=16, num_gpu_blocks=blocks, max_model_len=4096, host=host, prefix_caching=cached)
        res = eng.run(reqs)
        assert res.finished.all()
        return res

    tight_on, tight_off = run(400, True), run(400, False)
    assert tight_on.num_preemptions > 0 and tight_off.num_preemptions > 0
    assert tight_on.extra["num_cached_tokens_hit"] > 0
    assert tight_on.iterations["prefill_tokens"].sum() < tight_off.iterations["prefill_tokens"].sum()
    roomy_on, roomy_off = run(10_000, True), run(10_000, False)
    assert roomy_on.num_preemptions == 0
    assert roomy_on.iterations.equals(roomy_off.iterations)
