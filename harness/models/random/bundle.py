"""Randomly initialised model bundles built from config: for tests and smoke runs. Their speed
numbers are real; their acceptance rates and quality scores mean nothing."""
from __future__ import annotations

import torch

from harness.api import ConfigValueError, ModelBundle, checked_number
from harness.models.conditioners import HashedWordConditioner
from harness.models.eagle_head import random_head
from harness.models.image_model import TokenImageModel
from harness.models.random.patch_tokenizer import PatchTokenizer
from harness.shapes.gpt import ShapesConfig, ShapesGPT


def _model(grid: int, vocab: int, dim: int, n_layer: int, n_head: int, prefix_len: int,
           word_vocab: int, pos_embed: str, tokenizer: PatchTokenizer, seed: int) -> TokenImageModel:
    torch.manual_seed(seed)
    cfg = ShapesConfig(vocab_size=vocab, grid=(grid, grid), dim=dim, n_layer=n_layer, n_head=n_head,
                       prefix_len=prefix_len, caption_dim=dim, word_vocab=word_vocab, pos_embed=pos_embed)
    gpt = ShapesGPT(cfg)  # word-id captions (hashed words), like the shapes world's models
    # LlamaGen zero-initialises the output head; a random model needs non-trivial logits.
    torch.nn.init.normal_(gpt.output.weight, std=0.5 / dim**0.5)
    return TokenImageModel(gpt.eval(), tokenizer, image_size=grid * tokenizer.patch)


def build(name: str = "random", grid: int = 8, vocab: int = 64, dim: int = 64, n_layer: int = 2,
          n_head: int = 4, prefix_len: int = 8, word_vocab: int = 97, pos_embed: str = "rope2d",
          draft_ratio: int = 2, seed: int = 0, eagle_head: bool = True) -> ModelBundle:
    """Target at `grid x grid`, drafter at `grid / draft_ratio` (same family), small drafter at the
    target's grid with one layer, and (`eagle_head`) a random EAGLE head on the target; all share
    one patch tokenizer and one conditioner."""
    for key, value in (("grid", grid), ("vocab", vocab), ("dim", dim), ("n_layer", n_layer),
                       ("n_head", n_head), ("prefix_len", prefix_len), ("word_vocab", word_vocab),
                       ("draft_ratio", draft_ratio)):
        checked_number(f"model.{key}", value, integer=True, low=1)
    if grid % draft_ratio:
        raise ConfigValueError(f"model.grid ({grid}) must be a multiple of model.draft_ratio ({draft_ratio})")
    if dim % n_head:
        raise ConfigValueError(f"model.dim ({dim}) must be a multiple of model.n_head ({n_head})")
    tok = PatchTokenizer(vocab, patch=4, seed=seed)
    common = dict(vocab=vocab, n_head=n_head, prefix_len=prefix_len, word_vocab=word_vocab,
                  pos_embed=pos_embed, tokenizer=tok)
    target = _model(grid, dim=dim, n_layer=n_layer, seed=seed, **common)
    drafter = _model(grid // draft_ratio, dim=dim, n_layer=n_layer, seed=seed + 1, **common)
    small = _model(grid, dim=dim, n_layer=1, seed=seed + 2, **common)
    if eagle_head:
        target.eagle_head = random_head(target.gpt.cfg, target.gpt.tok_embeddings.weight, seed + 3)
    return ModelBundle(name=name, target=target, drafter=drafter, small_drafter=small,
                       conditioner=HashedWordConditioner(word_vocab, prefix_len))
