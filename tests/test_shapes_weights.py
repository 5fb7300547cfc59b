"""The shipped shapes-world weights: hash-checked strict loading, and a short raster sampling run
of the shipped target that must score above a floor on shapes-GenEval."""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from baselines.methods.raster import RasterDecoder
from evaluators.geneval import ShapesBackend
from evaluators.geneval_rules import GenEvalRules
from harness.api import SamplingParams
from harness.datasets.prompts import shapes
from harness.run import guided
from harness.shapes.gpt import ShapesGPT
from harness.shapes.bundle import load
from harness.shapes.captions import ENCODINGS
from harness.shapes.train_gpt import save_gpt
from harness.shapes.weights import WEIGHTS_DIR, WeightsError, load_gpt, read_manifest, write_manifest
from harness.runtime.seeding import image_seed


def test_manifest_lists_every_shipped_file_with_its_hash() -> None:
    manifest = read_manifest()
    names = set(manifest["files"])
    assert {"tokenizer.safetensors", "target.safetensors", "drafter.safetensors"} <= names
    total = sum(entry["bytes"] for entry in manifest["files"].values())
    assert total <= 25 * 2**20, f"shipped weights are {total / 2**20:.1f} MiB (limit 25 MiB)"
    assert "recipe" in manifest and "metrics" in manifest


def test_bundle_loads_with_the_documented_grids() -> None:
    bundle = load()
    assert bundle.target.grid == (16, 16) and bundle.drafter is not None and bundle.drafter.grid == (8, 8)
    assert bundle.target.codebook.shape == bundle.drafter.codebook.shape


def test_corrupt_weights_are_refused_with_path_and_expected_hash(tmp_path: Path) -> None:
    folder = tmp_path / "weights"
    shutil.copytree(WEIGHTS_DIR, folder)
    target = folder / "target.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    expected = read_manifest(folder)["files"]["target.safetensors"]["sha256"]
    with pytest.raises(WeightsError) as err:
        load(folder)
    assert str(target) in str(err.value) and expected in str(err.value)
    (folder / "drafter.safetensors").unlink()
    target.write_bytes(bytes(data[:-1]) + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(WeightsError, match="missing weights file"):
        load(folder)


def test_models_reading_different_caption_encodings_are_refused(tmp_path: Path) -> None:
    """One conditioner serves the whole bundle, so a drafter trained on another caption encoding
    than the target is refused, naming both."""
    folder = tmp_path / "weights"
    shutil.copytree(WEIGHTS_DIR, folder)
    shipped = load_gpt(folder / "drafter.safetensors")
    _, slots, vocab = [e for name, e in ENCODINGS.items() if e[1] != shipped.cfg.prefix_len][0]
    other = ShapesGPT(replace(shipped.cfg, prefix_len=slots, word_vocab=vocab))
    save_gpt(other, folder / "drafter.safetensors", {})
    manifest = read_manifest(folder)
    write_manifest(folder, list(manifest["files"]), {k: v for k, v in manifest.items() if k != "files"})
    with pytest.raises(WeightsError, match="different caption encodings.*drafter"):
        load(folder)


def test_shipped_target_samples_score_above_a_floor() -> None:
    """A short raster run of the shipped target on 24 prompts (4 per GenEval tag) with the model's
    CFG scale. Measured with benchmarks/shapes_world.py on 576 prompts: 0.79 overall (cfg 1.5);
    0.79 on these 24. The floor catches broken weights, a broken caption path and a broken decode
    path."""
    prompts = shapes(24)
    params = SamplingParams(temperature=1.0, cfg_scale=1.5)
    models = guided(load(small_drafter=False), params)
    cond = models.condition([p.text for p in prompts])
    seeds = [image_seed(0, p.id, 0) for p in prompts]
    tokens = RasterDecoder(params).generate(models, cond, seeds).tokens
    images = models.target.decode(tokens).permute(0, 2, 3, 1).numpy()
    detections = ShapesBackend().detect(list(images))
    rules = GenEvalRules()
    correct = [rules.evaluate(d, p.meta)[0] for d, p in zip(detections, prompts)]
    score = float(np.mean(correct))
    assert score >= 0.65, f"shipped target scores {score:.2f} on 24 prompts"
