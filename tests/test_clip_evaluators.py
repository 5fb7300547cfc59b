"""HPSv2 and CLIP score on tiny random open_clip models through the real loading path, and HPSv2's
reference preprocessing on fixed images."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from evaluators.clip_models import OPENAI_MEAN, OPENAI_STD, MissingModelError, resize_max_size
from evaluators.clip_score import CLIPScoreEvaluator
from evaluators.hpsv2 import HPSv2Evaluator
from harness.api import METRIC_COLUMNS, Prompt
from harness.store.samples import CorruptImageError, SampleSet, plan

TINY = "tiny-test-clip"
TINY_CFG = {"embed_dim": 16,
            "vision_cfg": {"image_size": 224, "layers": 1, "width": 32, "head_width": 16, "patch_size": 56},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


@pytest.fixture(scope="module")
def tiny_arch(tmp_path_factory: pytest.TempPathFactory) -> str:
    import open_clip

    if TINY not in open_clip.list_models():
        path = tmp_path_factory.mktemp("cfg") / f"{TINY}.json"
        path.write_text(json.dumps(TINY_CFG))
        open_clip.add_model_config(path)
    return TINY


def save_random(arch: str, path: Path, seed: int = 0, wrap: bool = True) -> Path:
    import open_clip

    torch.manual_seed(seed)
    model = open_clip.create_model(arch, pretrained=None)
    state = model.state_dict()
    torch.save({"state_dict": {f"module.{k}": v for k, v in state.items()}} if wrap else state, path)
    return path


def sample_set(root: Path, n: int = 5) -> SampleSet:
    prompts = [Prompt(id=f"p/{i}", text=f"a photo of {i} red cubes", meta={"style": "anime" if i % 2 else "photo"})
               for i in range(n)]
    samples = SampleSet(root)
    rng = np.random.default_rng(0)
    for spec in plan(prompts, 1, 0):
        samples.write(spec, rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), {})
    return samples


def test_hps_preprocessing_matches_reference_transform() -> None:
    from torchvision import transforms as T

    image = np.random.default_rng(0).integers(0, 256, (100, 50, 3), dtype=np.uint8)
    reference = T.Compose([T.ToTensor(), T.Resize([224, 112], T.InterpolationMode.BICUBIC, antialias=True),
                           T.Pad([56, 0, 56, 0], fill=0), T.Normalize(OPENAI_MEAN, OPENAI_STD)])
    ours = resize_max_size(image)
    assert ours.shape == (3, 224, 224)
    assert torch.allclose(ours, reference(Image.fromarray(image)), atol=1e-6)
    pad_value = (0 - torch.tensor(OPENAI_MEAN)) / torch.tensor(OPENAI_STD)
    assert torch.allclose(ours[:, :, :56].mean(dim=(1, 2)), pad_value, atol=1e-6)
    square = np.random.default_rng(1).integers(0, 256, (448, 448, 3), dtype=np.uint8)
    plain = T.Compose([T.ToTensor(), T.Resize([224, 224], T.InterpolationMode.BICUBIC, antialias=True),
                       T.Normalize(OPENAI_MEAN, OPENAI_STD)])
    assert torch.allclose(resize_max_size(square), plain(Image.fromarray(square)), atol=1e-6)
    native = square[:224, :224]
    expected = (torch.from_numpy(native).permute(2, 0, 1).float() / 255 - torch.tensor(OPENAI_MEAN)[:, None, None]) \
        / torch.tensor(OPENAI_STD)[:, None, None]
    assert torch.allclose(resize_max_size(native), expected, atol=1e-6)


def test_hpsv2_loads_a_checkpoint_and_scores(tiny_arch: str, tmp_path: Path) -> None:
    ckpt = save_random(tiny_arch, tmp_path / "HPS_v2.1_compressed.pt")
    ev = HPSv2Evaluator(checkpoint=str(ckpt), arch=tiny_arch, batch_size=2, device="cpu", show_progress=False)
    samples = sample_set(tmp_path / "s")
    res = ev.evaluate(samples)
    assert list(res.summary.columns) == list(METRIC_COLUMNS)
    assert set(res.summary["subset"]) == {"all", "anime", "photo"}
    scores = res.per_sample["score"]
    assert len(scores) == 5 and scores.abs().max() <= 100 and scores.std() > 0
    assert res.summary["value"].iloc[0] == pytest.approx(scores.mean())
    assert ev.version.startswith(f"hpsv2-1/v2.1/{tiny_arch}:HPS_v2.1_compressed.pt:")
    again = HPSv2Evaluator(checkpoint=str(ckpt), arch=tiny_arch, batch_size=5, device="cpu", show_progress=False)
    assert np.allclose(again.evaluate(samples).per_sample["score"], scores, atol=1e-4)  # batching-invariant


def test_hpsv2_bad_checkpoints(tiny_arch: str, tmp_path: Path) -> None:
    with pytest.raises(MissingModelError, match="hf download xswu/HPSv2"):
        HPSv2Evaluator(checkpoint=str(tmp_path / "absent.pt"), arch=tiny_arch, device="cpu").load()
    wrong = tmp_path / "wrong.pt"
    torch.save({"state_dict": {"visual.proj": torch.zeros(2)}}, wrong)
    with pytest.raises(ValueError, match="does not fit the model"):
        HPSv2Evaluator(checkpoint=str(wrong), arch=tiny_arch, device="cpu").load()
    with pytest.raises(ValueError, match="hps_version"):
        HPSv2Evaluator(hps_version="v3")


def test_clip_score_clamps_and_names_corrupt_images(tiny_arch: str, tmp_path: Path) -> None:
    ckpt = save_random(tiny_arch, tmp_path / "clip.pt", seed=3, wrap=False)
    ev = CLIPScoreEvaluator(arch=tiny_arch, checkpoint=str(ckpt), batch_size=3, device="cpu", show_progress=False)
    samples = sample_set(tmp_path / "s", 4)
    res = ev.evaluate(samples)
    mean = res.per_sample["score"].mean()
    assert res.summary["value"].iloc[0] == pytest.approx(max(mean, 0.0))
    assert ev.version.startswith(f"clip_score-1/{tiny_arch}:clip.pt:")
    victim = samples.records()["sample_id"].iloc[2]
    path = samples.image_path(victim)
    size = path.stat().st_size
    path.write_bytes(b"\0" * size)
    with pytest.raises(CorruptImageError, match=victim):
        ev.evaluate(samples)


@pytest.mark.slow
def test_hpsv2_real_architecture_round_trip(tmp_path: Path) -> None:
    """ViT-H-14 (986M parameters), randomly initialised, saved as {'state_dict'} and scored (minutes, ~8 GB RAM)."""
    ckpt = save_random("ViT-H-14", tmp_path / "HPS_v2.1_compressed.pt")
    ev = HPSv2Evaluator(checkpoint=str(ckpt), batch_size=2, device="cpu", show_progress=False)
    res = ev.evaluate(sample_set(tmp_path / "s", 2))
    assert res.per_sample["score"].notna().all()
