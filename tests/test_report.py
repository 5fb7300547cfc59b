"""Figures and the static HTML reports of `python -m harness.tables` on a fabricated results store."""
from __future__ import annotations

import html
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from PIL import Image

from harness.report.figures import Panel, Point, _plot_points, common_samples, heatmap_of
from harness.report.tables import Regenerated, regenerate
from harness.store.samples import SampleSet
from tests.fabricated_store import add_samples, build_store, row, write_summary

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MAGIC = {".png": b"\x89PNG", ".pdf": b"%PDF"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Regenerated]:
    """The store with SampleSets for shapes in main and ablation_local, a tau sweep, and its output."""
    root = tmp_path_factory.mktemp("report")
    store = build_store(root)
    add_samples(store / "main" / "2026-01-02_09-00-00", ["raster", "lantern", "mulo_sd"])
    add_samples(store / "ablation_local" / "2026-01-04_07-00-00", ["raster", "mulo_raster_scope", "mulo_l0", "mulo_l3"])
    for job, (tau, latency, geneval) in enumerate([(0.05, 0.5, 0.7), (0.1, 0.8, 0.8), (0.4, 1.5, 0.9)]):
        write_summary(store / "tau_sweep" / "2026-01-05_00-00-00" / str(job), [
            row("tau_sweep", "shapes", "mulo_sd", "latency_s", latency, tau=tau),
            row("tau_sweep", "shapes", "mulo_sd", "geneval", geneval, tau=tau)], swept=True)
    write_summary(store / "tau_sweep" / "2026-01-05_00-00-00" / "raster",
                  [row("tau_sweep", "shapes", "raster", "latency_s", 2.0)], swept=True)
    out = root / "out"
    return out, regenerate([store], out, grid_images=2)


def test_figures_are_written_and_non_empty(site: tuple[Path, Regenerated]) -> None:
    out, _ = site
    expected = {
        "main": ["speed_quality_tar_1.5b_512", "speed_quality_shapes", "rejections_shapes", "samples_shapes"],
        "ablation_local": ["speed_quality_shapes", "rejections_shapes", "samples_shapes"],
        "ablation_pooling": ["speed_quality_shapes"],
        "tau_sweep": ["speed_quality_shapes"],
    }
    for experiment, stems in expected.items():
        for stem in stems:
            for suffix, magic in MAGIC.items():
                path = out / experiment / "figures" / f"{stem}{suffix}"
                assert path.is_file(), path
                assert path.stat().st_size > 2000 and path.read_bytes().startswith(magic), path
    grid = np.asarray(Image.open(out / "main" / "figures" / "samples_shapes.png").convert("L"), dtype=float)
    assert grid.std() > 10  # images, not a blank canvas


def test_heatmaps_and_grids_use_the_right_samples(site: tuple[Path, Regenerated]) -> None:
    out, done = site
    samples = next(p for p in out.parent.rglob("samples") if p.parent.name == "2026-01-02_09-00-00")
    assert heatmap_of(SampleSet(samples / "raster")) is None  # raster records no rejections
    heat = heatmap_of(SampleSet(samples / "mulo_sd"))
    assert heat is not None and heat.shape == (4, 4)
    picks = common_samples([Panel(d, SampleSet(samples / d)) for d in ("raster", "mulo_sd")], 2)
    assert picks["sample_id"].tolist() == ["p-0_00", "p-2_00"]  # spread over the shared ids


def test_reports_link_only_existing_local_files(site: tuple[Path, Regenerated]) -> None:
    out, done = site
    pages = sorted(p.parent.name for p in done.pages)
    assert pages == ["ablation_local", "ablation_pooling", "main", "tau_sweep"]
    index = (out / "index.html").read_text()
    for page in done.pages + [out / "index.html"]:
        text = page.read_text()
        links = re.findall(r'(?:src|href)="([^"]+)"', text)
        assert links, page
        for link in links:
            assert "://" not in link and not link.startswith("/"), link
            assert (page.parent / link).is_file(), (page, link)
    assert 'href="main/index.html"' in index
    main_page = (out / "main" / "index.html").read_text()
    assert "<table" in main_page and main_page.count("<img") == 4
    assert 'class="missing"' in main_page and "0.96×" in main_page


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (CI installs Debian's chromium)")
def test_report_renders_in_headless_chromium(site: tuple[Path, Regenerated], tmp_path: Path) -> None:
    out, _ = site
    page = (out / "main" / "index.html").resolve().as_uri()
    common = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--hide-scrollbars", "--window-size=1280,1400"]
    dom = subprocess.run([*common, "--dump-dom", page], capture_output=True, text=True, timeout=120, check=True)
    assert "Tar-1.5B (512p)" in dom.stdout and dom.stdout.count("<img") == 4
    shot = tmp_path / "shot.png"
    subprocess.run([*common, f"--screenshot={shot}", page], capture_output=True, timeout=120, check=True)
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (1400, 1280)
    assert (pixels < 128).mean() > 0.01  # text and figures drawn, not a blank page


# The report a run names: `python -m harness` writes <run dir>/report/index.html (harness.run._report).

@pytest.fixture(scope="module")
def run_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real job (the random model, 12 prompts: two per GenEval tag, so scores have a standard
    error) with LANTERN at a non-paper k, its report written as the run writes it."""
    from harness.run import run
    from tests.conftest import compose_cfg

    out = tmp_path_factory.mktemp("run")
    cfg = compose_cfg(["+experiment=smoke", "report=true", "dataset_limit=12", "decoder=[raster,lantern,mulo_sd]",
                       "decoder.lantern.accept.k=8"])
    run(cfg, out)
    return out / "report" / "index.html"


def _headers_and_legend(page: str) -> tuple[list[tuple[str, str]], set[str]]:
    """(header text, its tooltip) of every <th> and the terms the legend defines."""
    headers = [(html.unescape(text), html.unescape(tip)) for tip, text in
               re.findall(r'<th(?: [a-z]+="\d+")?(?: title="([^"]*)")?[^>]*>([^<]*)</th>', page)]
    return headers, {html.unescape(term) for term in re.findall(r"<dt>([^<]*)</dt>", page)}


def test_the_page_the_run_names_shows_its_table_and_figures(run_page: Path) -> None:
    text = run_page.read_text()
    assert '<table class="results">' in text and "Experiments</h2>" not in text  # the table, not links
    assert not (run_page.parent / "main").exists()  # the main experiment has no rows: not listed
    body = re.search(r"<tbody>(.*)</tbody>", text, re.DOTALL)
    assert body is not None
    rows = re.findall(r"<tr>(.*?)</tr>", body.group(1))
    assert [re.findall(r"<td[^>]*>([^<]*)</td>", r)[1] for r in rows] == \
        ["Raster AR", "LANTERN (k=8, δ=0.4, on_reject=neighbourhood)", "MuLo-SD"]
    images = re.findall(r'<img src="([^"]+)"', text)
    assert any("speed_quality_random.png" in src for src in images) and len(images) == 5
    # MuLo-SD's row adds its redraw panels and its one-pass tau curve
    assert any("redraws_random_" in src for src in images) and any("tau_curve_random" in src for src in images)
    for link in re.findall(r'(?:src|href)="([^"]+)"', text):
        assert (run_page.parent / link).is_file(), link


def test_every_column_is_defined_and_acceptance_renamed(run_page: Path, site: tuple[Path, Regenerated]) -> None:
    out, _ = site
    for page in (run_page.read_text(), (out / "main" / "index.html").read_text()):
        headers, legend = _headers_and_legend(page)
        assert len(headers) >= 5
        for name, tip in headers:
            assert name in legend and len(tip) > 20, name  # a legend entry and a tooltip per column
    run_headers = [name for name, _ in _headers_and_legend(run_page.read_text())[0]]
    assert "Drafts kept ↑" in run_headers and not any("Acceptance" in h for h in run_headers)


def test_quality_has_vertical_error_bars(run_page: Path) -> None:
    """GenEval's 95% interval (± 1.96 se) is drawn as a vertical bar and stated on the page."""
    summary = pd.read_csv(run_page.parent.parent / "summary.csv")
    raster = summary[(summary.metric == "geneval") & (summary.subset == "all") & (summary.decoder == "raster")]
    value, se = 100 * float(raster.value.iloc[0]), 100 * float(raster.stderr.iloc[0])
    assert se > 0
    expected = f"Raster AR: speed-up 1.00 [1.00, 1.00], GenEval ↑ {value:.1f} [{value - 1.959964 * se:.1f}, " \
               f"{value + 1.959964 * se:.1f}]"
    alt = html.unescape(re.search(r'<img src="[^"]*speed_quality_random.png" alt="([^"]*)"', run_page.read_text()).group(1))
    assert expected in alt and "quality: ± 1.96 standard errors" in alt

    figure = Figure()
    axis = figure.subplots()
    _plot_points(axis, [Point("A", 1.5, 70.0, speedup_ci=(1.2, 1.8), quality_ci=(65.0, 75.0)),
                        Point("B", 2.0, 60.0, speedup_ci=(1.9, 2.2))])
    bars = [c for c in axis.containers if isinstance(c, ErrorbarContainer)]
    assert [(c.has_xerr, c.has_yerr) for c in bars] == [(True, True), (True, False)]
    segment = bars[0].lines[2][1].get_segments()[0]  # A's vertical bar: from 65 to 75 at x = 1.5
    assert np.allclose(segment, [[1.5, 65.0], [1.5, 75.0]])


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (CI installs Debian's chromium)")
def test_run_report_renders_in_headless_chromium(run_page: Path, tmp_path: Path) -> None:
    page = run_page.resolve().as_uri()
    common = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--hide-scrollbars", "--window-size=1280,1400"]
    dom = subprocess.run([*common, "--dump-dom", page], capture_output=True, text=True, timeout=120, check=True)
    assert "LANTERN (k=8, δ=0.4, on_reject=neighbourhood)" in dom.stdout  # the run's table, labelled
    assert '<dl class="legend">' in dom.stdout and "Drafts kept" in dom.stdout
    assert "GenEval ↑" in dom.stdout and "quality: ± 1.96 standard errors" in dom.stdout  # the bars, stated
    shot = tmp_path / "shot.png"
    subprocess.run([*common, f"--screenshot={shot}", page], capture_output=True, timeout=120, check=True)
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert (pixels < 128).mean() > 0.01
