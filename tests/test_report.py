"""Figures and the static HTML reports of `python -m harness.tables` on a fabricated results store."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.report.figures import Panel, common_samples, heatmap_of
from harness.store.samples import SampleSet
from harness.report.tables import Regenerated, regenerate
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
