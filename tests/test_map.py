"""The workload map: its grid, the paired cell table, the anchor inference, resume, the mixed-cache check and the
Dask executor (a local cluster started here)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dlfp.paths import REPO_ROOT
from dlfp.studies.map import MapError, MapSpec, get_map, load_rows, run_map
from dlfp.studies.map import inference, run as map_run
from dlfp.studies.map.cli import main_map
from dlfp.studies.map.grid import SCALES
from dlfp.studies.map.store import read_table, table_path
from dlfp.studies.map.table import cell_table
from reproduce_quotes import quoted_block, rendered

PUBLISHED = REPO_ROOT / "data/paper/published.csv"


def tiny(seeds=(801,)) -> MapSpec:
    """Two cells of the Qwen3-8B configuration (short Azure prompts, 20 requests: fast trials)."""
    return MapSpec("qwen3-8b", "qwen3-8b-r0.10", rates=(0.1, 0.25), budgets=(8192,), paper_rates=(0.1,),
                   scales=(1.0,), sources=("azure-conversation",), seeds=seeds)


def test_grid_axes_and_size_of_the_headline_map():
    assert SCALES[0] == 0.25 and SCALES[-1] == 4.0 and len(SCALES) == 9 and 1.0 in SCALES
    assert all(math.isclose(b / a, math.sqrt(2), rel_tol=1e-3) for a, b in zip(SCALES, SCALES[1:]))
    spec = get_map("qwen3-0.6b-tp1")
    assert len(spec.cells()) == 9 * 5 * 3 * 4
    tasks = spec.tasks()
    assert len(tasks) == 9 * 5 * 3 * 4 * 2 * 3 and len({t.key for t in tasks}) == len(tasks)
    assert 1.0 in spec.rates and {0.1, 0.25} <= set(get_map("qwen3-8b").rates)


def _trial_rows(itl_base, itl_dlfp, ttft=(1.0, 1.0)):
    rows = []
    for seed, (b, c) in zip((801, 802), zip(itl_base, itl_dlfp)):
        for arm, v in (("baseline", b), ("dlfp", c)):
            rows.append({"map": "m", "source": "s", "scale": 1.0, "rate": 1.0, "budget": 8192, "arm": arm,
                         "seed": seed, "itl_p99_s": v, "ttft_p99_s": ttft[arm == "dlfp"], "e2el_p99_s": 2.0,
                         "slo_passes": 10, "measured": 20, "stall_frac": 0.02, "gap_over_slo_frac": 0.01,
                         "stalled_s_per_request": 0.5, "utilisation": 0.3})
    return pd.DataFrame(rows)


def test_cell_table_paired_change_by_hand():
    # seed 801: 0.100 -> 0.080 (-20 %); seed 802: 0.200 -> 0.220 (+10 %); mean -5 %; arm means 0.150 -> 0.150 (0 %)
    cells = cell_table(_trial_rows((0.100, 0.200), (0.080, 0.220), ttft=(1.0, 1.3)))
    r = cells.iloc[0]
    assert r["d_itl_pct"] == pytest.approx(-5.0)
    assert r["d_itl_armmean_pct"] == pytest.approx(0.0)
    assert r["d_itl_signs"] == "-+"
    assert r["d_ttft_pct"] == pytest.approx(30.0)
    assert r["slo_passes_baseline"] == 20 and r["seeds"] == 2
    # t interval over 2 seeds: -5 +- t(0.975, 1) * sd / sqrt(2), sd = 21.2132 -> +- 190.6
    assert r["d_itl_hi"] - r["d_itl_pct"] == pytest.approx(12.7062 * 21.2132 / math.sqrt(2), rel=1e-4)


def test_unpaired_cell_is_refused():
    df = _trial_rows((0.1, 0.2), (0.1, 0.2))
    with pytest.raises(MapError, match="not paired"):
        cell_table(df[~((df["arm"] == "dlfp") & (df["seed"] == 802))])


def test_inference_finds_the_one_consistent_workload():
    anchors = inference.anchors(PUBLISHED)
    published = {a.name: a.published for a in anchors}
    assert published["8B 0.1 req/s baseline P99 ITL"] == 19 and published["0.6B P99 ITL change"] == -27.7
    good = {"source": "mooncake-synthetic", "scale": 2.0, "budget": 8192}
    bad = {"source": "azure-code", "scale": 1.0, "budget": 8192}
    rows = []
    for w, f in ((good, 1.0), (bad, 3.0)):
        for rate, itl_b, itl_d, pb, pd_ in ((0.1, 19, 281, 10, 7), (0.25, 1763, 707, 5, 0)):
            rows.append({**w, "map": "qwen3-8b", "rate": rate, "seeds": 3, "itl_p99_ms_baseline": itl_b * f,
                         "itl_p99_ms_dlfp": itl_d * f, "slo_passes_baseline": 3 * pb * f,
                         "slo_passes_dlfp": 3 * pd_ * f})
        rows.append({**w, "map": "qwen3-0.6b-tp1", "rate": 1.0, "seeds": 3, "d_itl_pct": -27.7 * f,
                     "d_ttft_pct": 34.8 * f, "d_e2el_pct": 7.8, "d_e2el_crosses_zero": True})
    cons = inference.consistency(pd.DataFrame(rows), anchors)
    inter = inference.intersection(cons, [a.name for a in anchors])
    assert len(inter) == 1 and inter.iloc[0]["source"] == "mooncake-synthetic"
    assert cons[(cons["source"] == "azure-code")]["holds"].sum() == 2  # only the e2el and 0-pass anchors
    cv = inference.cross_validate(cons, anchors)
    assert set(cv["workload"]) == {"mooncake-synthetic x2 budget 8192"} and cv["holds"].all()


def test_run_resume_and_mixed_cache(tmp_path, monkeypatch):
    spec = tiny()
    full = run_map(spec, tmp_path, jobs=1, progress=False)
    assert len(full) == 4 and set(full["arm"]) == {"baseline", "dlfp"}
    assert (full["completed"] == full["measured"]).all() and (full["itl_p99_s"] > 0).all()
    path = table_path(tmp_path, spec.name)
    df = read_table(path)
    df.iloc[:3].to_csv(path, index=False)  # an interrupted map: one trial lost
    calls = []
    real = map_run.summarize_task
    monkeypatch.setattr(map_run, "summarize_task", lambda s, t: calls.append(t.key) or real(s, t))
    again = run_map(spec, tmp_path, jobs=1, progress=False)
    assert calls == [df.iloc[3]["key"]]
    pd.testing.assert_frame_equal(again.reset_index(drop=True), read_table(path))
    np.testing.assert_allclose(again["itl_p99_s"], full["itl_p99_s"], rtol=1e-8)
    mixed = read_table(path)
    mixed.loc[0, "code"] = "0000000000000000"  # a row from another simulator version
    mixed.to_csv(path, index=False)
    with pytest.raises(MapError, match="another simulator version"):
        load_rows(spec, tmp_path, map_run.code_fingerprint(), strict=True)
    path.write_text("key,map\nx,y\n")
    with pytest.raises(MapError, match=str(path.name)):
        run_map(spec, tmp_path, jobs=1, progress=False)


def test_dask_executor_on_a_local_cluster(tmp_path):
    distributed = pytest.importorskip("distributed", reason="the 'distributed' package is not installed")
    spec = tiny()
    local = run_map(spec, tmp_path / "local", jobs=1, progress=False)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        remote = run_map(spec, tmp_path / "dask", executor="dask://" + c.scheduler_address.split("://")[1],
                         progress=False)
    cols = ["key", "arm", "seed", "itl_p99_s", "ttft_p99_s", "slo_passes", "iterations"]
    pd.testing.assert_frame_equal(local[cols], remote[cols])


def test_cli_bad_input_is_one_line(capsys):
    assert main_map(["no-such-map", "--no-render"]) == 2
    assert main_map(["qwen3-8b", "--executor", "ray://x:1", "--no-render"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "unknown map 'no-such-map'" in err[0] and "ray://x:1" in err[1]


def test_claim_directions_by_hand():
    from dlfp.studies.map.claims import holds

    cells = pd.DataFrame({"d_itl_pct": [-10.0, -10.0, 5.0], "d_itl_lo": [-20.0, -20.0, 1.0],
                          "d_itl_hi": [-1.0, 4.0, 9.0], "d_itl_armmean_pct": [-3.0, 2.0, 6.0],
                          "gap_over_slo_dlfp": [0.01, 0.02, 0.03], "gap_over_slo_baseline": [0.02, 0.01, 0.03]})
    assert list(holds(cells, "itl", "lowers", "paper")) == [True, False, False]
    assert list(holds(cells, "itl", "not_a_win", "paper")) == [False, True, True]
    assert list(holds(cells, "itl", "raises", "paper")) == [False, False, True]
    assert list(holds(cells, "itl", "lowers", "armmean")) == [True, False, False]
    assert list(holds(cells, "itl", "lowers", "tail_share")) == [True, False, False]


def test_reproduce_calls_the_shipped_maps_stale_exactly_when_they_are():
    """The map section of REPRODUCE.md opens with "**Stale:**" if and only if a shipped map table does not hold
    every task of its map's plan at the simulator's current code fingerprint (what ``dlfp map`` would rerun)."""
    from dlfp.studies.map import MAPS

    fp = map_run.code_fingerprint()
    fresh = []
    for spec in MAPS.values():
        try:
            rows = load_rows(spec, REPO_ROOT / "data/results/map", fp, strict=True)
            fresh.append(len(rows) == len(spec.tasks()))
        except MapError:
            fresh.append(False)
    text = (REPO_ROOT / "REPRODUCE.md").read_text()
    start = text.index("## Where DLFP's claims hold: the workload map")
    section = text[start: text.index("\n## ", start + 1)]
    assert ("**Stale:**" in section) == (not all(fresh)), dict(zip(MAPS, fresh))


@pytest.mark.parametrize("name", ["map/map_claims.md", "map/inference_anchors.md"])
def test_reproduce_quotes_the_map_tables_verbatim(name):
    """REPRODUCE.md shows the map's claims and anchors as rendered, between markers: no count typed by hand."""
    assert quoted_block(name) == rendered(name)
