"""`python -m baselines.training.train_eagle`: a head for any bundle's target (the tiny official stacks on an
img2dataset folder, the shapes world on its scenes), its file and metadata, and a resumed run that
ends where an uninterrupted one does."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from baselines.training import train_eagle
from harness.models.eagle_head import check_compatible, load_trained, read_info
from tests.single_thread import single_thread  # noqa: F401  (autouse)


def _folder(path: Path, n: int = 4) -> Path:
    rng = np.random.default_rng(0)
    path.mkdir()
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(path / f"{i:03d}.jpg")
        (path / f"{i:03d}.txt").write_text(f"a photo of {i} red cubes on a table")
    return path


@pytest.mark.parametrize("model", ["llamagen_tiny", "tar_tiny"])
def test_a_head_for_a_tiny_official_stack_from_an_image_folder(model: str, tmp_path: Path) -> None:
    data = _folder(tmp_path / "data")
    out = tmp_path / "head.safetensors"
    train_eagle.main(["--model", model, "--data-dir", str(data), "--steps", "2", "--batch-size", "2",
                      "--eval-batches", "0", "--log-every", "1", "--out", str(out)])
    bundle, _ = train_eagle.build_bundle(model)
    head = load_trained(out)
    check_compatible(head.cfg, bundle.target.gpt.cfg, str(out))
    info = read_info(out)
    assert info["steps"] == 2 and info["data"] == "folder" and info["model"] == model
    assert set(info["train_ema"]) == {"vloss", "ploss", "top1"}
    assert not out.with_suffix(".ckpt").exists(), "a finished run leaves no checkpoint"
    frozen = bundle.target.gpt.tok_embeddings.weight.half().float()  # the file stores float16
    torch.testing.assert_close(head.embed_tokens.weight, frozen)


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path: Path) -> None:
    bundle, _ = train_eagle.build_bundle("shapes")

    def stream(stop: int | None):
        def make(start: int):
            batches = train_eagle.shapes_batches(bundle, 0, 2, 0.1, start)
            for step, batch in enumerate(batches, start):
                if stop is not None and step == stop:
                    raise KeyboardInterrupt("stopped")
                yield batch
        return make

    whole, _ = train_eagle.train(bundle, stream(None), steps=3, out=tmp_path / "a.safetensors", ckpt_every=1)
    with pytest.raises(KeyboardInterrupt):
        train_eagle.train(bundle, stream(2), steps=3, out=tmp_path / "b.safetensors", ckpt_every=1)
    assert (tmp_path / "b.ckpt").exists()
    resumed, _ = train_eagle.train(bundle, stream(None), steps=3, out=tmp_path / "b.safetensors", ckpt_every=1)
    for key, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key


def test_the_recipe_stage_trains_the_installed_targets_head_and_lists_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from harness.shapes import recipe
    from harness.shapes.bundle import load
    from harness.shapes.weights import WEIGHTS_DIR, read_manifest, verified

    dest = tmp_path / "weights"
    shutil.copytree(WEIGHTS_DIR, dest)
    monkeypatch.setitem(recipe.EAGLE_HEADS, "x1", dict(steps=1, batch_size=2, seed=0, threads=1, eval_batches=1))
    recipe.stage_eagle_head(tmp_path / "work", "x1", dest)
    manifest = read_manifest(dest)
    assert manifest["metrics"]["eagle_head"]["steps"] == 1
    assert f"model.weights_dir={dest}" in manifest["recipe"]["eagle_head"]["command"]
    verified("eagle_head.safetensors", dest)
    assert not list(dest.glob("*.ckpt")), "checkpoints stay in the working folder"
    assert load(weights_dir=dest, drafter=False, small_drafter=False).eagle_head is not None
