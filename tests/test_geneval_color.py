"""GenEval's CLIP colour classifier on a tiny random open_clip model, alone and plugged into the evaluator."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from evaluators.geneval import GenEvalEvaluator
from evaluators.geneval_color import BACKGROUND, ClipColorClassifier, object_crop
from evaluators.geneval_rules import GENEVAL_COLORS, Detection
from harness.api import Prompt
from harness.store.samples import SampleSet, plan
from tests.test_clip_evaluators import save_random, tiny_arch  # noqa: F401  (fixture)


def test_object_crop_composites_on_grey_and_crops_to_box() -> None:
    image = np.zeros((10, 12, 3), np.uint8)
    image[2:6, 3:8] = (255, 0, 0)
    mask = np.zeros((10, 12), bool)
    mask[3:5, 4:7] = True
    crop = object_crop(image, Detection("cup", (3, 2, 8, 6), 0.9, mask))
    assert crop.shape == (4, 5, 3)
    assert (crop[1:3, 1:4] == (255, 0, 0)).all()
    assert (crop[0] == BACKGROUND).all() and (crop[:, 0] == BACKGROUND).all()
    with pytest.raises(ValueError, match="empty box"):
        object_crop(image, Detection("cup", (5, 5, 5, 9), 0.9, None))


class StubDetector:
    """One detection per image: a box over the left half with its mask."""

    name = "stub"
    classes = ("cup", "dog")

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        out = []
        for image in images:
            h, w = image.shape[:2]
            mask = np.zeros((h, w), bool)
            mask[:, : w // 2] = True
            out.append([Detection("cup", (0, 0, w // 2, h), 0.95, mask)])
        return out


def test_classifier_plugs_into_geneval(tiny_arch: str, tmp_path: Path) -> None:  # noqa: F811
    ckpt = save_random(tiny_arch, tmp_path / "clip.pt", seed=5)
    clf = ClipColorClassifier(arch=tiny_arch, checkpoint=str(ckpt), device="cpu")
    weights = clf.class_weights("cup")
    assert weights.shape == (16, len(GENEVAL_COLORS))
    assert torch.allclose(weights.norm(dim=0), torch.ones(len(GENEVAL_COLORS)), atol=1e-5)
    metas = [{"tag": "colors", "include": [{"class": "cup", "count": 1, "color": c}], "prompt": f"a photo of a {c} cup"}
             for c in GENEVAL_COLORS[:4]]
    prompts = [Prompt(id=f"geneval/{i:05d}", text=m["prompt"], meta=m) for i, m in enumerate(metas)]
    samples = SampleSet(tmp_path / "s")
    rng = np.random.default_rng(0)
    for spec in plan(prompts, 1, 0):
        samples.write(spec, rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), {})
    image = samples.load_image(samples.records()["sample_id"].iloc[0])
    colors = clf.classify(image, StubDetector().detect([image])[0] * 2)
    assert len(colors) == 2 and colors[0] == colors[1] and colors[0] in GENEVAL_COLORS
    ev = GenEvalEvaluator(detector=StubDetector(), color_classifier=clf, show_progress=False)
    res = ev.evaluate(samples)
    for row, meta in zip(res.per_sample.itertuples(), metas):
        image = samples.load_image(row.sample_id)
        predicted = clf.classify(image, StubDetector().detect([image])[0])[0]
        assert row.correct == (predicted == meta["include"][0]["color"]), (row, predicted)
    lines = [json.loads(line) for line in (samples.root / "results.jsonl").read_text().splitlines()]
    assert [line["correct"] for line in lines] == res.per_sample["correct"].tolist()
    assert "clip-color-" in ev.version and tiny_arch in ev.version
