"""The GPU path's launch costs: measured on a GPU server's host, and ``--enforce-eager`` as a modelled mode."""
from __future__ import annotations

import csv

import pytest

from dlfp.devices.host import HostCosts
from dlfp.paths import REPO_ROOT

MEASURED = REPO_ROOT / "data" / "gpu-measurements" / "h200" / "step_floor.csv"


def _measured() -> dict[tuple[str, str], float]:
    with open(MEASURED, newline="") as f:
        return {(r["measure"], r["param"]): float(r["value_us"]) for r in csv.DictReader(f)}


def test_launch_defaults_are_the_measured_values():
    """HostCosts' launch constants are the H200 host's medians (microseconds, one decimal), derived as documented."""
    m, h = _measured(), HostCosts()
    assert h.launch_eager_per_kernel_s == pytest.approx(round(m[("eager_op", "add_")], 1) * 1e-6)
    assert h.launch_graph_s == pytest.approx(round(m[("graph_replay_launch", "512")], 1) * 1e-6)
    piecewise = m[("graph_replay_launch", "64")] + 2 * m[("eager_op", "add_")]  # pieces' replay + 2 attention kernels
    assert h.launch_piecewise_per_layer_s == pytest.approx(round(piecewise, 1) * 1e-6)


def test_graph_replay_costs_the_host_less_than_launching_its_kernels():
    """An invariant of the measurement: replaying 512 captured kernels takes the host less time than enqueueing
    two of them eagerly, and the device runs a captured kernel in under 2 us."""
    m = _measured()
    assert m[("graph_replay_launch", "512")] < 2 * m[("eager_op", "add_")]
    assert m[("graph_replay_device", "512")] / 512 < 2.0


def test_enforce_eager_launches_every_batch_kernel_by_kernel():
    """28 layers x 12 kernels x 7.6 us = 2.5536 ms for every batch under --enforce-eager; with graphs a decode-only
    batch costs one replay (7.7 us) and a small mixed batch 28 x 18.7 us."""
    h = HostCosts()
    graphs, eager = h.launch_rule(28, 12), h.launch_rule(28, 12, enforce_eager=True)
    assert eager(16, 0) == pytest.approx(28 * 12 * 7.6e-6) == pytest.approx(2.5536e-3)
    assert eager(4096, 1) == eager(16, 0)
    assert graphs(16, 0) == pytest.approx(7.7e-6)
    assert graphs(256, 1) == pytest.approx(28 * 18.7e-6)
    assert graphs(4096, 1) == eager(16, 0)  # beyond the largest capture size vLLM runs eagerly anyway


def test_an_eager_trial_is_launch_bound_on_small_decodes():
    """Simulated with --enforce-eager, no batch ends before its last kernel is launched (issue + 2.5536 ms for
    Qwen3-0.6B's 28 layers), and decodes get slower than with CUDA graphs."""
    from dlfp.backends.sim.runner import run_trial
    from dlfp.config import load_experiment

    cfg = load_experiment("qwen3-0.6b-tp1", {"workload.num_requests": 12, "workload.num_warmup": 0})
    eager_cfg = cfg.with_overrides({"backend_options.enforce_eager": True})
    graph, eager = run_trial(cfg, "baseline", 801), run_trial(eager_cfg, "baseline", 801)
    it = eager.iterations
    assert ((it["device_end_s"] - it["issue_s"]) >= 28 * 12 * 7.6e-6 - 1e-12).all()
    dec_e = it.loc[it["prefill_tokens"] == 0, "device_time_s"].median()
    git = graph.iterations
    dec_g = git.loc[git["prefill_tokens"] == 0, "device_time_s"].median()
    assert dec_e > dec_g


def test_sampler_points_are_the_measured_greedy_sampler():
    """``dlfp.devices.sampler.H200_GREEDY`` is the H200 measurement (rows, microseconds to one decimal)."""
    from dlfp.devices.sampler import H200_GREEDY

    m = _measured()
    assert [(r, round(t * 1e6, 1)) for r, t in H200_GREEDY] == [
        (int(p), round(v, 1)) for (name, p), v in m.items() if name == "sampler_greedy"]


def test_sampler_time_interpolates_and_scales_its_growth_by_bandwidth():
    """Worked by hand: 40 rows on the H200 = 33.7 + (66.2 - 33.7) x 24/48 = 49.95 us; 512 rows continue the last
    slope, 186.3 + 120.1 x 256/192 = 346.43 us; on an A100-80GB (2,039 GB/s) the 40-row growth above 33.6 us is
    x 4800/2039: 33.6 + 16.35 x 2.35410 = 72.09 us; 0 rows cost one row."""
    from dlfp.devices.sampler import sampler_time

    assert sampler_time(40, 4800e9) == pytest.approx(49.95e-6)
    assert sampler_time(512, 4800e9) == pytest.approx(346.4333e-6, rel=1e-6)
    assert sampler_time(40, 2039e9) == pytest.approx(33.6e-6 + 16.35e-6 * 4800 / 2039)
    assert sampler_time(0, 2039e9) == sampler_time(1, 2039e9) == pytest.approx(33.6e-6)


def test_engine_loop_defaults_are_the_frozen_calibration_of_this_host():
    """``HostCosts``' Python parts are ``dlfp calibrate``'s fit on this project's host (microseconds, two decimals)."""
    import json

    from dlfp.paths import REPO_ROOT as root

    measured = json.loads((root / "data" / "host-measurements" / "engine_loop_xeon_2core.json").read_text())["host"]
    h = HostCosts()
    for name in ("schedule_base_s", "schedule_per_req_s", "prep_base_s", "prep_per_req_s", "prep_per_token_s",
                 "update_base_s", "update_per_req_s", "bookkeeping_base_s", "bookkeeping_per_req_s", "engine_loop_s"):
        assert getattr(h, name) == pytest.approx(round(measured[name] * 1e6, 2) * 1e-6, abs=1e-12), name
