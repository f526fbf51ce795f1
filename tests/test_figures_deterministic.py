"""The same traces give byte-identical figure files (PNG and PDF), and a file is never half-written."""
from __future__ import annotations

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
