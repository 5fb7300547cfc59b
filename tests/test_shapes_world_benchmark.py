"""benchmarks/shapes_world.py: its raster rows are pipeline runs (the drafter's through a bundle whose
target is the drafter), and its up-sampler table (benchmarks/shapes_drafts.py): the rejected shares
are the pooled-threshold rule's (baselines/methods/pooled.py) on the guided target, and every shipped
up-sampler gets a row."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.shapes_drafts import (POOL_K, POOL_TAU, UPSAMPLERS, guided_probs, raster_tokens,  # noqa: E402
                                      rejected_shares, upsampler_rows)
from benchmarks.shapes_world import raster_rows  # noqa: E402
from PIL import Image  # noqa: E402
from harness.datasets.prompts import shapes  # noqa: E402
from harness.shapes.bundle import load  # noqa: E402
from tests.single_thread import single_thread  # noqa: F401,E402  (autouse)


def test_rejected_shares_fall_with_k_and_with_tau() -> None:
    g = torch.Generator().manual_seed(0)
    p = (4 * torch.randn(3, 40, 16, generator=g)).softmax(-1)  # peaked: some drafts fall under tau
    tokens = torch.randint(16, (3, 40), generator=g)
    codebook = torch.randn(16, 4, generator=g)
    shares = rejected_shares(p, tokens, codebook)
    assert set(shares) == {f"k={k} tau={t:g}" for k in POOL_K for t in POOL_TAU}
    own = p.gather(-1, tokens[..., None])[..., 0]
    assert shares["k=1 tau=0.1"] == float((own < 0.1).float().mean()) > 0
    for tau in POOL_TAU:
        ladder = [shares[f"k={k} tau={tau:g}"] for k in POOL_K]
        assert ladder == sorted(ladder, reverse=True), ladder
    for k in POOL_K:
        assert shares[f"k={k} tau=0.1"] >= shares[f"k={k} tau=0.001"]
    assert shares["k=64 tau=0.1"] == 0.0  # 64 neighbours cover all 16 codes: the pooled mass is 1


def test_every_upsampler_gets_a_row_on_the_x1_world() -> None:
    prompts = shapes(2)
    bundle = load(world="x1", small_drafter=False)
    low = raster_tokens(bundle, prompts, 1.5, drafter=True)
    rows = upsampler_rows(bundle, prompts, low, 1.5)
    assert set(rows) == set(UPSAMPLERS)
    for values in rows.values():
        assert 0.0 <= values["geneval"] <= 1.0
        assert all(0.0 <= v <= 1.0 for k, v in values.items() if k.startswith("k="))



def test_guided_probs_are_the_teacher_forced_distributions() -> None:
    """Through the KV cache at cfg 1 they equal the training forward's softmax; CFG changes them."""
    prompts = shapes(2)
    bundle = load(world="x1", small_drafter=False)
    tokens = raster_tokens(bundle, prompts, 1.5, drafter=False)
    cond = bundle.condition([p.text for p in prompts])
    with torch.inference_mode():
        reference = bundle.target.gpt.forward_train(cond, tokens).softmax(-1)
    plain = guided_probs(bundle, prompts, tokens, 1.0)
    assert plain.shape == reference.shape == (2, 256, bundle.target.codebook.shape[0])
    assert torch.allclose(plain, reference, atol=1e-4)
    assert not torch.allclose(guided_probs(bundle, prompts, tokens, 1.5), reference, atol=1e-2)


def test_raster_rows_are_pipeline_runs_of_the_target_and_of_the_drafter(tmp_path: Path) -> None:
    rows = raster_rows("x1", None, 6, 1.5, tmp_path)
    assert list(rows) == ["target raster cfg=1.0", "target raster cfg=1.5", "drafter raster cfg=1.5"]
    for scores in rows.values():
        assert 0.0 <= scores["overall"] <= 1.0 and len(scores) == 7  # six tags (one prompt each) + overall
    sizes = {folder: Image.open(next((tmp_path / folder / "samples" / "raster" / "images").glob("*.png"))).size
             for folder in ("target_cfg1.0", "drafter")}
    assert sizes == {"target_cfg1.0": (64, 64), "drafter": (32, 32)}
    summary = (tmp_path / "drafter" / "summary.csv").read_text()
    assert "shapes_drafter" in summary and "geneval" in summary
