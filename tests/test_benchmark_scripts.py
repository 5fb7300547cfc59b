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


@pytest.mark.long
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


@pytest.mark.long
def test_engine_builds_the_full_size_models_at_full_width_without_downloads(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """LlamaGen-XL 512 and Tar-7B 1024 at full width and 2 layers, random weights, stand-in
    conditioners: no transformers import, no network; the floor reads the target GPT and its KV
    cache only (not the VQ decoder, not the EAGLE head)."""
    import sys

    import torch

    from benchmarks import engine

    monkeypatch.setitem(sys.modules, "transformers", None)  # importing transformers now fails
    assert engine.main(["--device", "cpu", "--tables", "steps", "--full-size", "--models",
                        "llamagen_xl_512,tar_7b_1024", "--layers", "2", "--steps", "1", "--no-compile",
                        "--threads", "1"]) == 0
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ")}
    assert {"llamagen_xl_512", "tar_7b_1024"} <= set(rows)
    bundle, target = engine._target("llamagen_xl_512", ["model.dtype=bf16"], torch.device("cpu"), 2)
    gpt = bundle.target.gpt
    assert (gpt.cfg.dim, gpt.cfg.n_layer, gpt.cfg.caption_dim, gpt.cfg.prefix_len) == (1280, 2, 2048, 120)
    target.setup_cache(1)
    weights = sum(p.numel() * 2 for p in gpt.parameters())
    cache = 2 * 2 * 2 * 20 * gpt.slots * 64 * 2  # layers x (k, v) x CFG rows x heads x slots x hd x bf16
    assert engine.floor_bytes(bundle) == weights + cache
    assert engine.floor_bytes(bundle) < sum(p.numel() * p.element_size() for p in bundle.target.parameters())


def test_engine_memory_table_counts_the_protocol_batch_and_the_chunked_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tar-7B 1024 at batch 16, full width, 2 layers on the meta device, scaled to 30 layers: the
    KV cache is the static cache's size, and MuLo-SD's whole-image verification needs less
    transient memory with guidance's chunked mix than without it; the conditioner is counted beside it."""
    from benchmarks import engine
    from harness.models import chunked_logits

    chunked = {row[1]: row for row in engine.memory_table(["tar_7b_1024"], 16, 2)}
    kv = 30 * 2 * 32 * 20 * (729 + 4096) * 64 * 2 / 1e9  # layers x (k, v) x rows x heads x slots x hd x bf16
    assert float(chunked["raster"][4]) == pytest.approx(kv, abs=0.01)
    monkeypatch.setattr(chunked_logits, "LOGITS_CHUNK", 10**9)
    whole = {row[1]: row for row in engine.memory_table(["tar_7b_1024"], 16, 2)}
    verify_logits = 32 * 4096 * 16384 * 4 / 1e9  # [2B, N, V] float: what the chunked mix never holds whole
    assert float(whole["mulo_sd"][5]) - float(chunked["mulo_sd"][5]) >= verify_logits
    assert chunked["raster"][5] == whole["raster"][5]
    assert max(float(row[6]) for row in chunked.values()) < 40.0  # the image models alone fit 40 GB
    # beside them Tar-7B's LLM on the same GPU (16.4 GB of bf16 weights at Tar's vocabulary, its KV):
    # the protocol's batch then needs more than 40 GB (docs/methodology.md)
    for row in chunked.values():
        assert 16.4 < float(row[7]) < 17.5 and float(row[8]) == pytest.approx(float(row[6]) + float(row[7]), abs=0.02)
    assert float(chunked["raster"][8]) > 40.0


def test_gpu_first_run_script_runs_its_parts_on_the_cpu_in_tiny_mode(tmp_path: Path) -> None:
    """benchmarks/gpu_first_run.sh with TINY=1: the step part on the CPU at a tiny scale, writing its
    output, the eager row printed before anything compiles; an unknown part is refused. (Both
    device calls whole, in a virtualenv of the image's packages: benchmarks/rehearse_gpu_first_run.sh.)"""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TINY": "1", "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "SITE": str(tmp_path / "site")}
    done = subprocess.run(["bash", "benchmarks/gpu_first_run.sh", "steps:any"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = (tmp_path / "steps_any.txt").read_text()
    rows = {cells[2]: cells for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in steps.splitlines()
                                          if line.startswith("| llamagen_tiny"))}
    assert set(rows) == {"eager", "compiled"}
    assert all(float(rows[e][3]) > 0 and float(rows[e][6]) >= float(rows[e][7]) > 0 for e in rows)  # filled <= full
    assert rows["eager"][4] == "-" and float(rows["compiled"][4]) > 0  # compile seconds on the compiled row
    assert rows["compiled"][5] == "-"  # cudagraph skips: CUDA only
    eager_at = steps.index("step row: llamagen_tiny | 1 | eager")
    assert eager_at < steps.index("engine=compiled") < steps.index("step row: llamagen_tiny | 1 | compiled")
    bad = subprocess.run(["bash", "benchmarks/gpu_first_run.sh", "nonsense"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown part nonsense" in bad.stderr
