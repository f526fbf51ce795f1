"""The same traces give byte-identical figure files (PNG and PDF), and a file is never half-written."""
from __future__ import annotations

import pytest

from dlfp.analysis import figures, tables
from test_pipeline import EXP, write_fake_experiment


def test_one_figure_rendered_twice_gives_the_same_bytes(tmp_path):
    root = tmp_path / "traces"
    write_fake_experiment(root, EXP, (801, 802, 803))
    outs = []
    for name in ("a", "b"):
        ts = tables.load_traces(root)  # fresh load each time
        png, pdf = figures.save(figures.itl_cdf_figure(ts), tmp_path / name, "itl_cdf")
        outs.append((png.read_bytes(), pdf.read_bytes()))
    (png_a, pdf_a), (png_b, pdf_b) = outs
    assert png_a[:8] == b"\x89PNG\r\n\x1a\n" and pdf_a[:5] == b"%PDF-"
    assert png_a == png_b and pdf_a == pdf_b
    assert b"CreationDate" not in pdf_a and b"ModDate" not in pdf_a and b"Producer" not in pdf_a
    assert figures.plt.rcParams["svg.hashsalt"] == figures.SVG_HASHSALT
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["itl_cdf.pdf", "itl_cdf.png"]  # no temporaries


def test_figures_drawn_by_worker_processes_are_the_bytes_drawn_here(tmp_path, monkeypatch):
    from dlfp.pipeline import figure_workers

    monkeypatch.setenv("DLFP_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "traces"
    write_fake_experiment(root, EXP, (801, 802, 803))
    ts = tables.load_traces(root)
    here = figure_workers.start(ts, tmp_path / "here", workers=1)
    there = figure_workers.start(ts, tmp_path / "there", workers=2)
    assert not here.parallel and there.parallel
    names = figure_workers.figure_names(ts)
    assert names == ["itl_cdf", "tradeoff", "root_cause", "frontier", f"cap_trajectory_sim_{EXP}"]
    for name in reversed(names):
        a, b = here.result(name), there.result(name)
        assert [p.name for p in a] == [p.name for p in b] == [f"{name}.png", f"{name}.pdf"]
        assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    there.close()
    with pytest.raises(figure_workers.PipelineError, match="no figure 'nope'"):
        here.result("nope")
