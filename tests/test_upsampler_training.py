"""The learned latent up-sampler: row causality, save/load, and a few training steps of each
objective on a tiny, untrained shapes tokenizer (the real training runs offline)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from baselines.methods.latent_upsampler import LatentUpsampler, load_upsampler
from baselines.training.train_upsampler import OBJECTIVES, scene_pairs, train
from harness.shapes.vq import ShapesVQ
from tests.single_thread import single_thread  # noqa: F401  (autouse)


def _tiny_vq() -> ShapesVQ:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return ShapesVQ(codebook_size=16, code_dim=4, channels=(8, 8, 8), res_blocks=0)


def test_upsampled_rows_never_depend_on_later_low_res_rows() -> None:
    module = LatentUpsampler(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)), r=2, grid=(8, 8),
                             width=8)
    low = torch.randint(16, (1, 4, 4), generator=torch.Generator().manual_seed(1))
    changed = low.clone()
    changed[0, 2:] = (changed[0, 2:] + 1) % 16  # rows 2 and 3 differ
    a, b = module.up_latents(low), module.up_latents(changed)
    assert torch.equal(a[:, :, :4], b[:, :, :4]), "high-res rows 0-3 come from low-res rows 0-1 only"
    assert not torch.equal(a[:, :, 4:], b[:, :, 4:])
    assert module.upsample_tokens(low).shape == (1, 8, 8) and module.downsample_tokens(
        module.upsample_tokens(low)).shape == (1, 4, 4)


def test_scene_pairs_are_seeded_and_aligned() -> None:
    hi, lo = scene_pairs(3, 7, 2, 32, 2)
    assert hi.shape == (2, 3, 32, 32) and lo.shape == (2, 3, 16, 16) and hi.dtype == torch.uint8
    assert torch.equal(scene_pairs(3, 7, 2, 32, 2)[0], hi) and not torch.equal(scene_pairs(3, 8, 2, 32, 2)[0], hi)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_each_objective_trains_and_round_trips(objective: str, tmp_path: Path) -> None:
    out = tmp_path / f"up_{objective}.safetensors"
    module, metrics = train(_tiny_vq(), objective, steps=3, batch_size=2, target_size=32, width=8, depth=1,
                            gan_start=0.0, log_every=0, out=out)
    assert 0.0 <= metrics["up_token_acc"] <= 1.0 and metrics["objective"] == objective
    loaded = load_upsampler(out)
    low = torch.randint(16, (2, 4, 4), generator=torch.Generator().manual_seed(2))
    assert torch.equal(loaded.upsample_tokens(low), module.eval().upsample_tokens(low))
    assert loaded.grid == (8, 8) and metrics["target_size"] == 32
    with pytest.raises(ValueError, match="codebook"):
        loaded.check(torch.randn(32, 4), 2, (8, 8))
    loaded.check(loaded.codebook, 2, (8, 8))
    with pytest.raises(ValueError, match="8x8 high-res grid; this target's grid is 16x16"):
        loaded.check(loaded.codebook, 2, (16, 16))


def test_tokens_come_only_from_the_tokenizers_active_codes(tmp_path: Path) -> None:
    """The up- and down-sampler choose among the codes the encoder may emit (ShapesVQ.active),
    and the mask survives a save/load round trip."""
    codebook = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    low = torch.randint(16, (2, 4, 4), generator=torch.Generator().manual_seed(1))
    free = LatentUpsampler(codebook, r=2, grid=(8, 8), width=8).upsample_tokens(low)
    emitted = free.unique()
    assert len(emitted) > 1
    active = ~torch.isin(torch.arange(16), emitted[1:])  # of the codes it emits, keep only the first
    module = LatentUpsampler(codebook, r=2, grid=(8, 8), width=8, active=active)
    up = module.upsample_tokens(low)
    assert active[up].all() and active[module.downsample_tokens(up)].all()
    assert not torch.equal(up, free)
    vq = _tiny_vq()
    vq.restrict(torch.arange(16) % 2 == 0)
    out = tmp_path / "up.safetensors"
    trained, _ = train(vq, "ce", steps=2, batch_size=2, target_size=32, width=8, depth=1, log_every=0, out=out)
    assert torch.equal(load_upsampler(out).active, vq.active) and torch.equal(trained.active, vq.active)
    with pytest.raises(ValueError, match="non-empty bool mask"):
        LatentUpsampler(codebook, r=2, grid=(8, 8), active=torch.zeros(16, dtype=torch.bool))
