"""Checks of the model contract that every transformers-backed backbone must pass, written once and
called by each backbone's test module (test_emu3, test_janus, test_lumina) with its own tiny bundle:

- a draft-tree node written to a scratch slot equals the same token written at its position, and
  moving it there gives a later query what a direct write gives;
- the rows of a batch are independent (a prompt decoded alone equals its row of the batch);
- a speculative decoder at temperature 0 returns raster decoding's tokens.
"""
from __future__ import annotations

from typing import Sequence

import torch

from baselines.methods.raster import RasterDecoder
from harness.api import ARImageModel, Condition, Decoder, Generation, ModelBundle, SamplingParams
from harness.run import guided

_TOL = {"rtol": 1e-5, "atol": 1e-5}


@torch.inference_mode()
def check_scratch_node(model: ARImageModel, cond: Condition, at: int) -> None:
    """A draft-tree node at position `at` (a row's last included, with its end-of-row twin where the
    model has one): written to the first scratch slot at its position's rotation, it gives the logits
    a write at its position gives, a tree child in the next scratch slot sees it, and moved to its
    position's slot it gives a later query what the direct write gives.

    model: an image model of the contract; cond: the condition of one prompt (batch 1).
    """
    tokens = torch.randint(0, model.vocab_size, (1, at + 1), generator=torch.Generator().manual_seed(2))
    later = torch.tensor([[7]])
    model.setup_cache(1)
    model.prefill(cond)
    direct_node = model.forward(tokens, torch.arange(at + 1))[:, -1:]
    direct = model.forward(later, torch.tensor([at + 1]))
    model.setup_cache(1, scratch=2)
    assert model.total == model.cache_len + 2
    model.prefill(cond)
    model.forward(tokens[:, :at], torch.arange(at))
    scratch = model.cache_len  # the first scratch slot
    mask = torch.arange(model.total)[None, None] < model.prefix_len + at
    mask[..., scratch] = True
    node = model.forward(tokens[:, at:], torch.tensor([at]), mask, slots=torch.tensor([[scratch]]))
    torch.testing.assert_close(node, direct_node, **_TOL)  # at a row end: its end-of-row twin's logits
    child_mask = mask.clone()
    child_mask[..., scratch + 1] = True  # itself
    child = model.forward(later, torch.tensor([at + 1]), child_mask, slots=torch.tensor([[scratch + 1]]))
    torch.testing.assert_close(child, direct, **_TOL)  # a tree child sees the node (and its twin)
    unmoved = model.forward(later, torch.tensor([at + 1]))  # position `at`'s slot still empty
    assert not torch.allclose(unmoved, direct, atol=1e-3)
    model.move_cache(torch.tensor([[scratch]]), torch.tensor([[model.prefix_len + at]]))
    torch.testing.assert_close(model.forward(later, torch.tensor([at + 1])), direct, **_TOL)


def check_rows_independent(bundle: ModelBundle, params: SamplingParams, prompts: Sequence[str],
                           seeds: Sequence[int]) -> None:
    """Raster decoding of `prompts` in one batch equals each prompt decoded alone with its seed, and
    the rows differ (so the check is not met by a constant image)."""
    models = guided(bundle, params)
    together = RasterDecoder(params).generate(models, models.condition(list(prompts)), list(seeds)).tokens
    for row, (prompt, seed) in enumerate(zip(prompts, seeds)):
        alone = RasterDecoder(params).generate(models, models.condition([prompt]), [seed]).tokens
        assert torch.equal(alone[0], together[row]), prompt
    assert not torch.equal(together[0], together[1])


def greedy_equals_raster(bundle: ModelBundle, decoder: Decoder, prompts: Sequence[str],
                         seeds: Sequence[int]) -> Generation:
    """Decode `prompts` with `decoder` (at temperature 0) and assert its tokens equal raster
    decoding's under the same sampling, every image complete in at most one target forward per
    token. Returns the decoder's output for the caller's own checks."""
    sampling: SamplingParams = decoder.sampling  # type: ignore[attr-defined]  (every decoder here holds one)
    models = guided(bundle, sampling)
    cond = models.condition(list(prompts))
    raster = RasterDecoder(sampling).generate(models, cond, list(seeds))
    out = decoder.generate(models, cond, list(seeds))
    assert torch.equal(out.tokens, raster.tokens)
    assert len(set(raster.tokens.flatten().tolist())) > 3, "a constant image would make the check vacuous"
    n = raster.tokens.shape[1]
    assert all(s.tokens == n and s.target_forwards <= n for s in out.stats)
    return out
