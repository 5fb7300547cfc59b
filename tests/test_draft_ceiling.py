"""benchmarks/draft_ceiling.py: the ceiling rows are the prompts' scenes through exactly the steps
they name, written as resumable SampleSets beside a run's own."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from baselines.methods.upsamplers import resize_images  # noqa: E402
from benchmarks.draft_ceiling import SEED_OFFSET, main, scenes, tokenized, write_row  # noqa: E402
from harness.api import Prompt  # noqa: E402
from harness.store.samples import SampleSet, SampleSpec  # noqa: E402
from harness.shapes.bundle import load  # noqa: E402
from harness.shapes.scenes import render, scene_for_caption  # noqa: E402
from tests.single_thread import single_thread  # noqa: F401,E402  (autouse)

METAS = [{"include": [{"class": "triangle", "count": 1}], "prompt": "a photo of a triangle",
          "tag": "single_object"},
         {"include": [{"class": "square", "count": 1}, {"class": "circle", "count": 1}],
          "prompt": "a photo of a square and a circle", "tag": "two_object"}]


def _template(root: Path, size: int) -> SampleSet:
    """A run's SampleSet of two shapes prompts (its images are never read by the ceiling)."""
    samples = SampleSet(root)
    samples.bind({"decoder": "raster"})
    for i, meta in enumerate(METAS):
        prompt = Prompt(id=f"shapes/{i:05d}", text=meta["prompt"], meta=meta)
        spec = SampleSpec(sample_id=f"shapes-{i:05d}_00", prompt=prompt, image_index=0, seed=11 + i)
        samples.write(spec, np.zeros((size, size, 3), np.uint8), {"decoder": "raster"})
    samples.consolidate()
    return samples


def test_rows_are_the_scenes_through_the_named_steps(tmp_path: Path) -> None:
    bundle = load(world="x1")  # target 64 px (16x16 tokens), drafter 32 px
    records = _template(tmp_path / "raster", 64).records()
    truth = write_row(tmp_path / "c", "truth", records, bundle)
    first = truth.load_image("shapes-00000_00")
    expected = render(scene_for_caption(METAS[0], np.random.default_rng([11, SEED_OFFSET])), 64)
    assert np.array_equal(first, expected)
    tok = write_row(tmp_path / "c", "truth_tokenized", records, bundle)
    through = tokenized(bundle.target, scenes(records, 64)).permute(0, 2, 3, 1).numpy()
    assert np.array_equal(tok.load_image("shapes-00001_00"), through[1])
    assert not np.array_equal(tok.load_image("shapes-00000_00"), first), "the tokenizer is lossy"
    drafted = write_row(tmp_path / "c", "truth_low_drafted", records, bundle)
    image = drafted.load_image("shapes-00000_00")
    assert image.shape == (64, 64, 3)
    # drafter size (32 px) -> drafter tokens -> bicubic to 64 px -> target tokens
    low = tokenized(bundle.drafter, scenes(records, 32))
    manual = tokenized(bundle.target, resize_images(low, (64, 64), "bicubic"))[0].permute(1, 2, 0).numpy()
    assert np.array_equal(image, manual)
    assert not np.array_equal(image, tok.load_image("shapes-00000_00")), "the low-res path loses detail"
    stamp = drafted.image_path("shapes-00000_00").stat().st_mtime_ns
    write_row(tmp_path / "c", "truth_low_drafted", records, bundle)
    assert drafted.image_path("shapes-00000_00").stat().st_mtime_ns == stamp, "complete samples are kept"


def test_a_set_of_another_world_or_an_empty_one_is_refused(tmp_path: Path) -> None:
    _template(tmp_path / "x1", 64)
    with pytest.raises(SystemExit):
        main(["--samples", str(tmp_path / "x1"), "--model", "shapes_x2", "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit):
        main(["--samples", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])
