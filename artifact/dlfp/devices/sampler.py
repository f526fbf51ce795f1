"""The sampler's device time per iteration, from the greedy sampler measured on an H200.

vLLM 0.17.1 samples outside the CUDA graph (``GPUModelRunner.sample_tokens`` -> ``Sampler.forward``): the
logits of the sampled rows are cast to float32, greedy decoding takes their argmax, and the ids are copied to the
host. ``benchmarks/gpu/step_floor.py`` timed exactly that on the lent H200 (vocabulary 151,936, medians of 25,
``data/gpu-measurements/h200/step_floor.csv``, ``sampler_greedy``): 33.6 us for 1 row, 33.7 us for 16, 66.2 us
for 64 and 186.3 us for 256. Up to 16 rows the time is the launches' floor; above it grows with the bytes of the
logits read, so on another GPU the growth above the one-row time is scaled by the H200's HBM bandwidth over that
GPU's (4.8 TB/s, ``hardware/gpus.yaml``; an assumption: the argmax streams the logits). Between the measured row
counts it is linear; above 256 rows it continues the last segment's slope. A step that samples no row (only
partial prefills) still runs the LM head and sampler over one row per request in vLLM 0.17.1, so it is costed as
one row.

It replaces ``DeviceAssumptions.iteration_overhead_s`` (30 us assumed for embedding, final norm and sampler) in the
kernel model; the embedding and final norm are two kernels inside the graph (about 1.2 us each measured,
``graph_replay_device``), left in that figure's noise.
"""
from __future__ import annotations

#: (rows, seconds) of the greedy sampler on the H200 (``step_floor.csv``, ``sampler_greedy``, rounded to 0.1 us).
H200_GREEDY: tuple[tuple[int, float], ...] = ((1, 33.6e-6), (16, 33.7e-6), (64, 66.2e-6), (256, 186.3e-6))
#: HBM bandwidth of the measured H200 (B/s; NVIDIA H200 SXM datasheet, 4.8 TB/s).
H200_HBM_BW = 4800e9


def sampler_time(rows: int, hbm_bw: float) -> float:
    """Device time (s) of greedy sampling ``rows`` rows (at least one) on a GPU of ``hbm_bw`` B/s (module docstring)."""
    pts = H200_GREEDY
    n = max(1, int(rows))
    for (r0, t0), (r1, t1) in zip(pts, pts[1:]):
        if n <= r1:
            t = t0 + (t1 - t0) * (n - r0) / (r1 - r0)
            break
    else:
        (r0, t0), (r1, t1) = pts[-2], pts[-1]
        t = t1 + (t1 - t0) * (n - r1) / (r1 - r0)
    base = pts[0][1]
    return base + (t - base) * H200_HBM_BW / hbm_bw
