"""dlfp.studies.validation: error computation on hand-made traces, the paired DLFP effect, step attribution, the
fingerprint check and the figures. No timing: all trace times are hand-made."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dlfp.studies import validation as vs
from dlfp.traces.format import ITERATION_COLUMNS, REQUEST_COLUMNS, TOKEN_COLUMNS, Trial, coerce
from reproduce_quotes import quoted_block, rendered

SLO = {"ttft_s": 10.0, "itl_s": 10.0, "itl_quantile": 1.0}


def _trial(arm: str, seed: int, first: float, gaps: list[float], *, n_req: int = 3, fp: str = "fp",
           iters: pd.DataFrame | None = None) -> Trial:
    """``n_req`` measured requests arriving at 0, 10, 20 s; first token after ``first`` s, then ``gaps``."""
    rq = pd.DataFrame({"request_id": [f"r{i}" for i in range(n_req)], "arrival_s": [10.0 * i for i in range(n_req)],
                       "prompt_tokens": 8, "output_tokens": len(gaps) + 1, "warmup": False, "finished": True,
                       "fingerprint": fp})
    rows = []
    for i in range(n_req):
        t = 10.0 * i + first
        rows.append((f"r{i}", 0, 1, t))
        for k, g in enumerate(gaps, start=1):
            t += g
            rows.append((f"r{i}", k, 1, t))
    tk = pd.DataFrame(rows, columns=["request_id", "index", "token_id", "time_s"])
    it = iters if iters is not None else pd.DataFrame({c: pd.Series(dtype=d) for c, d in ITERATION_COLUMNS.items()})
    md = {"arm": arm, "seed": seed, "experiment": "x", "backend": "test", "workload_fingerprint": fp,
          "config": {"slo": SLO}}
    return Trial(coerce(rq, REQUEST_COLUMNS), coerce(tk, TOKEN_COLUMNS), coerce(it, ITERATION_COLUMNS), md)


def test_rel_error():
    assert vs.rel_error(0.100, 0.110) == pytest.approx(0.10)
    assert vs.rel_error(0.100, 0.080) == pytest.approx(-0.20)
    assert math.isnan(vs.rel_error(0.0, 1.0)) and math.isnan(vs.rel_error(float("nan"), 1.0))


def test_error_table_on_hand_made_traces():
    # real: TTFT 1.0 s, gaps 10 ms x 9 and one 100 ms; sim: TTFT 1.2 s, gaps 11 ms x 9 and one 80 ms
    real = {("baseline", 1): _trial("baseline", 1, 1.0, [0.010] * 9 + [0.100])}
    sim = {("baseline", 1): _trial("baseline", 1, 1.2, [0.011] * 9 + [0.080])}
    err = vs.error_table(real, sim)
    r = err[err["seed"] == "1"].iloc[0]
    assert r["ttft_p50_err"] == pytest.approx(0.2) and not r["ttft_p50_ok"]  # 20 % > 10 % target
    assert r["ttft_p99_err"] == pytest.approx(0.2) and r["ttft_p99_ok"]  # 20 % <= 20 % target
    assert r["itl_p50_err"] == pytest.approx(0.1) and r["itl_p50_ok"]
    # P99 of 30 pooled gaps (27 x 10 ms, 3 x 100 ms), linear interpolation at rank 0.99 * 29 = 28.71:
    # between sorted[28] = 100 ms and sorted[29] = 100 ms -> 100 ms; sim likewise 80 ms -> -20 %
    assert r["itl_p99_real_s"] == pytest.approx(0.100) and r["itl_p99_sim_s"] == pytest.approx(0.080)
    assert r["itl_p99_err"] == pytest.approx(-0.2)
    # E2EL = 1.0 + 0.19 = 1.19 s real; 1.2 + 0.179 = 1.379 s sim
    assert r["e2el_p99_err"] == pytest.approx(1.379 / 1.19 - 1)
    m = err[err["seed"] == "mean"].iloc[0]
    assert m["ttft_p50_err"] == pytest.approx(0.2)
    with pytest.raises(vs.ValidationError, match="no simulated trial"):
        vs.error_table(real, {})


def test_seed_mean_row_averages_metrics_before_the_error():
    real = {("b", 1): _trial("b", 1, 1.0, [0.01] * 5), ("b", 2): _trial("b", 2, 3.0, [0.01] * 5)}
    sim = {("b", 1): _trial("b", 1, 1.5, [0.01] * 5), ("b", 2): _trial("b", 2, 2.5, [0.01] * 5)}
    err = vs.error_table(real, sim).set_index("seed")
    assert err.loc["1", "ttft_p50_err"] == pytest.approx(0.5)
    assert err.loc["2", "ttft_p50_err"] == pytest.approx(-1 / 6)
    assert err.loc["mean", "ttft_p50_err"] == pytest.approx(0.0)  # (1.5 + 2.5) / (1 + 3) - 1


def test_dlfp_effect_sign_and_size():
    # real: DLFP lowers the worst gap 100 -> 50 ms (-50 %); sim: 80 -> 60 ms (-25 %): same sign, +25 points
    real = {("baseline", 1): _trial("baseline", 1, 1.0, [0.01] * 9 + [0.100]),
            ("dlfp", 1): _trial("dlfp", 1, 1.0, [0.01] * 9 + [0.050])}
    sim = {("baseline", 1): _trial("baseline", 1, 1.0, [0.01] * 9 + [0.080]),
           ("dlfp", 1): _trial("dlfp", 1, 1.0, [0.01] * 9 + [0.060])}
    eff = vs.dlfp_effect(real, sim).set_index("seed")
    assert eff.loc["1", "real_change"] == pytest.approx(-0.5)
    assert eff.loc["1", "sim_change"] == pytest.approx(-0.25)
    assert bool(eff.loc["1", "same_sign"]) and eff.loc["1", "size_error"] == pytest.approx(0.25)
    # opposite sign
    sim[("dlfp", 1)] = _trial("dlfp", 1, 1.0, [0.01] * 9 + [0.120])
    eff = vs.dlfp_effect(real, sim).set_index("seed")
    assert not bool(eff.loc["1", "same_sign"]) and eff.loc["1", "sim_change"] == pytest.approx(0.5)


def _iters(sched_costs, exec_times, rests, prefill):
    """Back-to-back iterations (sync loop) with the given schedule cost, execute time and rest of the loop."""
    t = 0.0
    rows = []
    for i, (s, e, r, p) in enumerate(zip(sched_costs, exec_times, rests, prefill)):
        rows.append({"iteration": i, "schedule_s": t, "prefill_tokens": p, "num_prefills": int(p > 0),
                     "num_decodes": 2, "cap": None, "cap_after": None, "guarded": False, "signal": "host_cadence",
                     "observed_interval_s": np.nan, "host_interval_s": s + e + r, "device_time_s": e,
                     "issue_s": t + s, "device_start_s": t + s, "device_end_s": t + s + e, "energy_j": np.nan})
        t += s + e + r
    return pd.DataFrame(rows)


def test_step_parts_and_attribution():
    it_real = _iters([0.001] * 4, [0.010, 0.010, 0.500, 0.010], [0.002] * 4, [0, 0, 1000, 0])
    it_sim = _iters([0.001] * 4, [0.012, 0.012, 0.400, 0.012], [0.001] * 4, [0, 0, 1000, 0])
    real = {("b", 1): _trial("b", 1, 1.0, [0.01], iters=it_real)}
    sim = {("b", 1): _trial("b", 1, 1.0, [0.01], iters=it_sim)}
    parts = vs.step_parts(real, "real").set_index("kind")
    assert parts.loc["decode", "steps"] == 3 and parts.loc["prefill", "prefill_tokens"] == 1000
    assert parts.loc["decode", "schedule_s"] == pytest.approx(0.001)
    assert parts.loc["decode", "execute_s"] == pytest.approx(0.010)
    assert parts.loc["decode", "rest_s"] == pytest.approx(0.002)
    att = vs.attribution(real, sim).set_index("kind")
    assert att.loc["decode", "execute_s_err"] == pytest.approx(0.2)
    assert att.loc["prefill", "execute_s_err"] == pytest.approx(-0.2)
    assert att.loc["decode", "rest_s_err"] == pytest.approx(-0.5)
    fit = vs.decode_step_fit(real)
    assert fit["n"] == 3 and math.isnan(fit["per_seq_s"])  # one batch size only: no slope


def test_cap_trajectories_and_figures():
    it = _iters([0.001] * 3, [0.01] * 3, [0.001] * 3, [100, 100, 0])
    it["guarded"] = [True, True, False]
    it["cap_after"] = pd.array([256, 128, 128], dtype="Int64")
    real = {("dlfp", 1): _trial("dlfp", 1, 1.0, [0.01, 0.02], iters=it)}
    sim = {("dlfp", 1): _trial("dlfp", 1, 1.0, [0.01, 0.03], iters=it)}
    caps = vs.cap_trajectories(real, sim)
    assert caps.groupby("backend").size().to_dict() == {"real": 2, "sim": 2}
    assert caps[caps["backend"] == "real"]["cap_after"].tolist() == [256, 128]
    fig = vs.cap_trajectory_overlay_figure(real, sim)
    assert len(fig.axes[0].lines) == 2
    fig2 = vs.itl_cdf_overlay_figure(real, sim)
    lines = fig2.axes[0].lines
    assert len(lines) == 3  # real, sim, and the P99 guide line
    # the real CDF ends at the largest gap (20 ms) with probability 1
    assert lines[0].get_xdata()[-1] == pytest.approx(20.0) and lines[0].get_ydata()[-1] == 1.0
    from dlfp.studies import validation_audit as va

    md = va.audit_markdown(va.audit_errors("x", real, sim, {}), va.audit_effects("x", real, sim, {}))
    assert "| dlfp | itl_p99 |" in md


def test_simulate_like_checks_the_fingerprint():
    """A simulated 'real' trial of cpu-tiny, re-simulated, gives zero error; a changed fingerprint is refused."""
    from dlfp.devices import roofline as cm

    if "cpu" not in cm.known_gpus():
        pytest.skip("no calibrated CPU profile shipped yet (run `dlfp calibrate`)")
    from dlfp.config import load_experiment
    from dlfp.backends.sim.runner import run_trial

    cfg = load_experiment("cpu-tiny")
    base = run_trial(cfg, "baseline", 801)
    again = vs.simulate_like(base)
    err = vs.error_table({("baseline", 801): base}, {("baseline", 801): again})
    assert all(err[f"{m}_err"].abs().max() == 0 for m in vs.METRICS)
    base.metadata["workload_fingerprint"] = "0" * 64
    with pytest.raises(vs.ValidationError, match="fingerprint differs"):
        vs.simulate_like(base)


def test_audit_noise_targets_and_verdicts():
    """Hand-made real / replicate / simulated trials: noise, errors against target + noise, per-seed effects."""
    from dlfp.studies import validation_audit as va

    # real baseline TTFT 1.0 s, its replicate 1.05 s (noise 5 %); dlfp TTFT 2.0 s, replicate 2.0 s
    real = {("baseline", 1): _trial("baseline", 1, 1.0, [0.01] * 9 + [0.100]),
            ("dlfp", 1): _trial("dlfp", 1, 2.0, [0.01] * 9 + [0.050])}
    rep = {("baseline", 1): _trial("baseline", 1, 1.05, [0.01] * 9 + [0.100]),
           ("dlfp", 1): _trial("dlfp", 1, 2.0, [0.01] * 9 + [0.050])}
    # sim: baseline TTFT 1.12 s (+12 %: misses 10 %, within 10 % + 5 % noise); dlfp TTFT 2.4 s (+20 %: beyond)
    sim = {("baseline", 1): _trial("baseline", 1, 1.12, [0.01] * 9 + [0.100]),
           ("dlfp", 1): _trial("dlfp", 1, 2.4, [0.01] * 9 + [0.065])}
    noise = va.metric_noise(real, rep)
    assert noise["ttft_p50"] == pytest.approx(0.05) and noise["itl_p99"] == pytest.approx(0.0)
    # effect noise: real TTFT effect 2.0 / 1.0 - 1 = +100 %; replicated 2.0 / 1.05 - 1 = +90.476 %
    en = va.effect_noise(real, rep)
    assert en["ttft_p99"] == pytest.approx(100 * (1 - 2.0 / 1.05 + 1), rel=1e-9)
    err = va.audit_errors("x", real, sim, noise).set_index(["arm", "metric"])
    b = err.loc[("baseline", "ttft_p50")]
    assert b["error"] == pytest.approx(0.12) and not b["met"] and not b["beyond_noise"]
    d = err.loc[("dlfp", "ttft_p50")]
    assert d["error"] == pytest.approx(0.20) and not d["met"] and d["beyond_noise"]
    assert err.loc[("baseline", "itl_p99"), "met"]  # 100 ms both
    eff = va.audit_effects("x", real, sim, en).set_index(["metric", "seed"])
    # P99 ITL effect: real 50 / 100 - 1 = -50 %; sim 65 / 100 - 1 = -35 %: +15 points; the replicates' ITL is
    # identical (effect noise 0), so it is missed beyond noise
    e = eff.loc[("itl_p99", "1")]
    assert e["real_change"] == pytest.approx(-0.5) and e["sim_change"] == pytest.approx(-0.35)
    assert e["diff_pp"] == pytest.approx(15.0) and not e["met"] and e["beyond_noise"]
    # TTFT effect: real +100 %, sim 2.4 / 1.12 - 1 = +114.3 %: +14.3 points, within 10 + 9.5 points of noise
    t = eff.loc[("ttft_p99", "1")]
    assert t["diff_pp"] == pytest.approx(100 * (2.4 / 1.12 - 2.0)) and not t["met"] and not t["beyond_noise"]
    md = va.audit_markdown(err.reset_index(), eff.reset_index())
    assert "| x | dlfp | ttft_p50 |" in md and "no, within noise" in md and "| NO |" in md


def test_three_way_separates_device_and_engine_errors():
    from dlfp.studies import validation_audit as va

    real = {("baseline", 1): _trial("baseline", 1, 1.0, [0.010] * 10)}
    emu = {("baseline", 1): _trial("baseline", 1, 1.1, [0.012] * 10)}
    sim = {("baseline", 1): _trial("baseline", 1, 1.21, [0.012] * 10)}
    tw = va.three_way(real, emu, sim, "x").set_index("metric")
    assert tw.loc["itl_p50", "emu_error"] == pytest.approx(0.2)  # the device model's share
    assert tw.loc["itl_p50", "sim_vs_emu"] == pytest.approx(0.0)  # the engine model adds nothing here
    assert tw.loc["ttft_p50", "sim_vs_emu"] == pytest.approx(0.1) and tw.loc["ttft_p50", "sim_error"] == pytest.approx(
        0.21)


def test_shipped_fidelity_tables_regenerate_from_the_shipped_traces(tmp_path):
    """`dlfp validate-sim` on the committed real-engine traces rewrites the committed audit byte for byte."""
    from dlfp.paths import REPO_ROOT

    shipped = REPO_ROOT / "data" / "results" / "fidelity"
    status = vs.main_validate(["--out", str(tmp_path)])  # the replicates are read from the shipped folder
    assert status in (0, 1)  # 1: some target is missed beyond noise (the audit says which)
    for name in ("audit_errors.csv", "effects.csv", "errors.csv", "noise.csv", "fidelity.md"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes(), name


def test_reproduce_shows_the_audit_as_written():
    """REPRODUCE.md carries `fidelity/fidelity.md` verbatim between its markers: no number typed by hand."""

    assert quoted_block("fidelity/fidelity.md") == rendered("fidelity/fidelity.md")


def _host(cpu: str, threads: int) -> dict:
    from dlfp.hostinfo import host_key

    ident = {"cpu_model": cpu, "vector_flags": "avx2", "mhz": None, "mhz_max": None, "logical_cpus": 2,
             "affinity": [0, 1], "env": {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "1" if threads == 1
                                         else f"0-{threads - 1}"},
             "torch": {"num_threads": 2, "num_interop_threads": 2, "cpu_capability": "AVX2"}}
    return {"cpu": cpu, "cpus": 2, "identity": ident, "host_key": host_key(ident)}


def test_real_trials_of_two_hosts_are_refused_in_one_line():
    a, b = _trial("baseline", 801, 1.0, [0.1]), _trial("dlfp", 801, 1.0, [0.1])
    a.metadata["hardware"], b.metadata["hardware"] = _host("CPU A", 2), _host("CPU A", 2)
    assert vs.real_host("x", {("baseline", 801): a, ("dlfp", 801): b})["host_key"] == _host("CPU A", 2)["host_key"]
    rep = _trial("dlfp", 801, 1.0, [0.1])
    rep.metadata["hardware"] = _host("CPU A", 1)
    with pytest.raises(vs.ValidationError) as e:
        vs.real_host("x", {("baseline", 801): a, ("dlfp", 801): b}, {("dlfp", 801): rep})
    msg = str(e.value)
    assert msg.startswith("x: real-engine trials dlfp/seed-801 (replicate) and baseline/seed-801 were recorded on "
                          "different hosts (CPU A x2, 1 engine threads") and "2 engine threads" in msg
    assert "`dlfp run x --backend vllm --force`" in msg and "\n" not in msg


def test_replicate_runs_of_another_host_are_refused_naming_the_run():
    a = _trial("baseline", 801, 1.0, [0.1])
    a.metadata["hardware"] = _host("CPU A", 1)
    r1, r2 = _trial("baseline", 801, 1.0, [0.1]), _trial("baseline", 801, 1.0, [0.1])
    r1.metadata["hardware"], r2.metadata["hardware"] = _host("CPU A", 1), _host("CPU B", 1)
    assert vs.real_host("x", {("baseline", 801): a}, [{("baseline", 801): r1}])["host_key"] == _host("CPU A", 1)[
        "host_key"]
    with pytest.raises(vs.ValidationError, match=r"baseline/seed-801 \(replicate 2\)"):
        vs.real_host("x", {("baseline", 801): a}, [{("baseline", 801): r1}, {("baseline", 801): r2}])


def test_noise_is_the_largest_change_over_every_replicate_run():
    """Original TTFT 1.0 s, replicate runs 1.05 s and 0.90 s: the noise is 10 %; the second run's baseline and dlfp
    both move, so the TTFT effect changes from +100 % to 2.2 / 0.9 - 1 = +144.4 %."""
    from dlfp.studies import validation_audit as va

    real = {("baseline", 1): _trial("baseline", 1, 1.0, [0.01] * 10), ("dlfp", 1): _trial("dlfp", 1, 2.0, [0.01] * 10)}
    runs = [{("baseline", 1): _trial("baseline", 1, 1.05, [0.01] * 10)},
            {("baseline", 1): _trial("baseline", 1, 0.90, [0.01] * 10),
             ("dlfp", 1): _trial("dlfp", 1, 2.2, [0.01] * 10)}]
    assert va.metric_noise(real, runs)["ttft_p50"] == pytest.approx(0.10)
    assert va.metric_noise(real, runs[0])["ttft_p50"] == pytest.approx(0.05)  # a single map is one run
    assert va.effect_noise(real, runs)["ttft_p99"] == pytest.approx(100 * (2.2 / 0.9 - 2.0))


def test_a_profile_of_another_host_is_refused_and_an_unknown_host_is_noted():
    from dlfp.devices import roofline as cm

    if "cpu" not in cm.known_gpus():
        pytest.skip("no calibrated CPU profile shipped")
    machine = cm.load_gpu("cpu").machine or {}
    if machine.get("host_key"):
        pytest.skip("the shipped CPU profile carries a host identity; this case is about one that predates them")
    model = machine["cpu_model"]
    refusal, note = vs.profile_host_problem("cpu-tiny", "cpu", _host(model + " v2", 2))
    assert note is None and refusal.startswith("cpu-tiny: the CPU profile 'cpu' was fitted on another host than the "
                                               f"real-engine traces ({model} x{machine['cores']}, unknown host")
    assert refusal.endswith(f"`{vs.SAME_HOST_COMMAND.format(exp='cpu-tiny')}`") and "\n" not in refusal
    # the shipped profile and a trace that predates identities on the same CPU model and count: assumed, said so
    refusal, note = vs.profile_host_problem("cpu-tiny", "cpu", {"cpu": model, "cpus": machine["cores"]})
    assert refusal is None and note.endswith("one host is assumed, not checked") and note.count("unknown host") == 1
    # a datasheet GPU: nothing was measured on a host
    assert vs.profile_host_problem("cpu-tiny", "a100-sxm4-80gb", _host("CPU A", 2)) == (None, None)


def test_the_audit_names_its_host_only_when_every_side_is_one_known_host():
    one = {"label": "CPU A x2, host abc", "host_key": "k1", "identity": {}}
    assert vs.host_line({"e": {"real": one, "profile": one}}) == \
        "Real engine and CPU profile measured on one host: CPU A x2, host abc."
    assert vs.host_line({"e": {"real": one, "profile": {**one, "host_key": None}}}) is None
    assert vs.host_line({"e": {"real": one, "profile": {**one, "host_key": "k2"}}}) is None
