"""benchmarks/decoders.py and benchmarks/overhead.py on tiny random models: each is pipeline runs
whose summary.csv holds what the script prints (issue 27: one timing path)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmarks import decoders, overhead
from tests.single_thread import single_thread  # noqa: F401  (autouse)

TINY = ["model.grid=8", "model.vocab=32", "model.dim=32", "model.n_layer=1"]


def test_decoders_runs_the_baselines_experiment_at_each_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summaries = decoders.main(["--images", "4", "--reps", "2", "--batches", "1", "2", "--decoders", "raster", "zipar",
                               "sjd", "--device", "cpu", "--out", str(tmp_path), *TINY])
    out = capsys.readouterr().out
    assert "### decoders at batch 1" in out and "### decoders at batch 2" in out
    for batch, summary in summaries.items():
        stats = pd.read_csv(tmp_path / f"batch_{batch}" / "samples" / "zipar" / "stats.csv")
        assert (stats.batch_size == batch).all() and stats.timed.all()
        written = pd.read_csv(tmp_path / f"batch_{batch}" / "summary.csv")
        assert set(written.experiment) == {"baselines"} and set(written.decoder) == {"raster", "zipar", "sjd"}
        for decoder in ("raster", "zipar", "sjd"):
            lag = decoders.value(summary, decoder, "lag")
            expected = decoders.value(written, decoder, "step_compression") / decoders.value(
                written, decoder, "speedup_vs_raster")
            assert lag == pytest.approx(expected)
    with pytest.raises(SystemExit):
        decoders.main(["--decoders", "zipar", *TINY])


def test_overhead_times_the_bare_loop_as_a_decoder_of_the_same_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = overhead.main(["--images", "2", "--reps", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "images: the same" in out, "the bare loop decodes exactly what raster decodes"
    assert set(summary.decoder) == {"raster", "bare"}
    ratio = summary[(summary.decoder == "bare") & (summary.metric == "speedup_vs_raster")].iloc[0]
    line = next(line for line in out.splitlines() if line.startswith("RasterDecoder"))
    assert f"{ratio.value:.3f} [{ratio.ci_low:.3f}, {ratio.ci_high:.3f}]" in line
    stats = pd.read_csv(tmp_path / "samples" / "bare" / "stats.csv")
    assert stats.latency_reps_s.str.split().str.len().eq(2).all() and (stats.target_forwards == 256).all()


def test_engine_counts_loop_and_model_operators(capsys) -> None:  # noqa: ANN001
    from benchmarks import engine

    assert engine.main(["--steps", "2", "--decoders", "raster,zipar", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    raster = [c.strip() for c in rows["raster"].split("|")[1:-1]]
    # decoder, target fwd, steps, loop ops / fwd, model ops / fwd, host reads / step and / image, CUDA syncs
    assert raster[1] == raster[2] == "256" and float(raster[3]) > 0 and float(raster[4]) > float(raster[3])
    assert float(raster[5]) == 0 and raster[6] == "0"  # raster reads nothing on the host
    assert "zipar" in rows and "llamagen_tiny" in rows and "tar_tiny" in rows


def test_rejection_sites_finds_object_cells_and_their_top_edges() -> None:
    from benchmarks.rejection_sites import object_cells, top_edges

    image = np.full((32, 32, 3), 200, dtype=np.uint8)  # plain background, 4x4 cells of 8 px
    image[8:24, 16:24] = (255, 0, 0)  # an object over cells rows 1-2, col 2
    image[26:28, 0:8] = (0, 0, 255)  # a quarter of cell (3, 0): not an object cell (> 1/4 needed)
    image[0:8, 0:8] = (190, 205, 200)  # close to the background colour: not an object
    objects = object_cells(image, (4, 4))
    want = np.zeros((4, 4), dtype=bool)
    want[1:3, 2] = True
    assert (objects == want).all()
    edges = top_edges(objects)
    assert edges[1, 2] and not edges[2, 2] and edges.sum() == 1
