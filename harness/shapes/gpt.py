"""The shapes world's GPT: the official architecture (harness/models/gpt.py) plus what the embedded
world's small models need and official checkpoints never have. The random test bundle
(harness/models/random/bundle.py) is one of these too (hashed word ids).

- `word_vocab` > 0: the model owns a word embedding; captions are word ids [B, P].
- `word_pos`: a learned embedding per caption slot [P, caption_dim] added to the word embeddings.
  Word ids carry no order by themselves (a real text encoder's features do), and with
  prefix_rope "zero" "a red circle and a blue square" and "a blue circle and a red square" are the
  same bag of words. Zero at initialisation.
- `cond_broadcast`: the whole caption, flattened and projected to one vector [dim], is also added to
  every image token's input embedding, so each position reads the caption without attention.
- `rope_fraction`: the fraction of each head's dimension pairs that rotate (LlamaGen: all). The
  other pairs carry no position for any slot, so with prefix_rope "zero" an image query can still
  pick caption slots by content there (with all pairs zeroed it sees the caption as one average).
- `pos_embed="learned"`: a learned absolute table [S, dim] instead of rotary positions.
- `forward_train(..., hidden=)`: parallel-decoding gaps in training (harness/shapes/parallel_masks.py).

Files from `train_gpt.save_gpt` carry every field of `ShapesConfig` in their 'config' metadata.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from harness.models.condition import TextCondition
from harness.models.gpt import GPT, GPTConfig, rope_2d_table
from harness.models.masks import attention_mask


@dataclass(frozen=True)
class ShapesConfig(GPTConfig):
    """GPTConfig plus the shapes world's options (module docstring)."""

    word_vocab: int = 0
    word_pos: bool = False
    cond_broadcast: bool = False
    rope_fraction: float = 1.0
    OPTIONS: ClassVar[dict[str, tuple[str, ...]]] = {
        **GPTConfig.OPTIONS, "pos_embed": ("rope2d", "learned", "abs_pe")}

    def __post_init__(self) -> None:
        if self.word_pos and self.word_vocab <= 0:
            raise ValueError("word_pos needs word-id captions (word_vocab > 0)")
        super().__post_init__()
        rotary = self.head_dim // 2 * self.rope_fraction
        if not 0 < self.rope_fraction <= 1 or rotary != int(rotary) or int(rotary) % 2:
            raise ValueError(f"rope_fraction {self.rope_fraction} must be in (0, 1] and rotate an even "
                             f"number of the {self.head_dim // 2} dimension pairs of a head")


def partial_rope_table(grid: tuple[int, int], head_dim: int, base: float, prefix_len: int,
                       prefix: str = "identity", fraction: float = 1.0) -> Tensor:
    """rope_2d_table [prefix_len + rows*cols, head_dim/2, 2] in which only the first `fraction` of
    the dimension pairs rotate (LlamaGen's layout over those); the other pairs are the identity
    (cos 1, sin 0) for every slot, prefix included."""
    pairs = head_dim // 2
    rotating = int(pairs * fraction)
    table = rope_2d_table(grid, 2 * rotating, base, prefix_len, prefix)  # [S, rotating, 2]
    still = torch.zeros(table.shape[0], pairs - rotating, 2)
    still[..., 0] = 1.0
    return torch.cat([table, still], dim=1)


class ShapesGPT(GPT):
    """A GPT over `ShapesConfig`: word-id captions, slot embeddings, broadcast condition, partial
    RoPE, learned positions and training gaps. Parameter names: `word_embeddings`, `word_pos`,
    `cond_broadcast`, `pos_embedding` on top of the GPT's."""

    cfg: ShapesConfig

    def __init__(self, cfg: ShapesConfig) -> None:
        super().__init__(cfg)
        if cfg.pos_embed == "learned":
            self.pos_embedding = nn.Parameter(torch.zeros(self.slots, cfg.dim))
        if cfg.rope_fraction < 1:
            self.rope_table = partial_rope_table(cfg.grid, cfg.head_dim, cfg.rope_base, cfg.prefix_len,
                                                 cfg.prefix_rope, cfg.rope_fraction)

    def _build_inputs(self, cfg: GPTConfig) -> None:
        """Word embedding and slot embeddings first, then the GPT's caption and token embeddings,
        then the broadcast projection (this order fixes a seeded initialisation)."""
        assert isinstance(cfg, ShapesConfig)
        if cfg.word_vocab > 0:
            self.word_embeddings = nn.Embedding(cfg.word_vocab, cfg.caption_dim)
        if cfg.word_pos:
            self.word_pos = nn.Parameter(torch.zeros(cfg.prefix_len, cfg.caption_dim))
        super()._build_inputs(cfg)
        if cfg.cond_broadcast:
            self.cond_broadcast = nn.Linear(cfg.prefix_len * cfg.caption_dim, cfg.dim)

    def _features(self, cond: TextCondition) -> Tensor:
        """Word ids [B, P] -> features [B, P, caption_dim] (+ the slot embedding with word_pos);
        feature captions pass through."""
        if cond.ids is None:
            return super()._features(cond)
        feats = self.word_embeddings(cond.ids)
        return feats + self.word_pos if self.cfg.word_pos else feats

    def _token_bias(self, feats: Tensor) -> Tensor | None:
        """features [B, P, caption_dim] -> the broadcast condition [B, 1, dim], or None."""
        if not self.cfg.cond_broadcast:
            return None
        return self.cond_broadcast(feats.flatten(1).to(self.cond_broadcast.weight.dtype))[:, None]

    def _positional(self, h: Tensor, slots: Tensor) -> tuple[Tensor, Tensor | None]:
        if self.cfg.pos_embed == "learned":
            return h + self.pos_embedding[slots].to(h.dtype), None
        return super()._positional(h, slots)

    def forward_train(self, cond: TextCondition, tokens: Tensor, prefix_mask: Tensor | None = None,
                      hidden: Tensor | None = None) -> Tensor:
        """GPT.forward_train; hidden [B, N, N] bool or None: hidden[b, i, j] hides token j from the
        prediction of token i, on top of the causal mask (harness/shapes/parallel_masks.py)."""
        if hidden is None:
            return super().forward_train(cond, tokens, prefix_mask)
        b, n = tokens.shape
        if hidden.shape != (b, n, n):
            raise ValueError(f"hidden must have shape {(b, n, n)}, got {tuple(hidden.shape)}")
        p, width = self.cfg.prefix_len, self.cfg.prefix_len + n - 1  # input slots
        gaps = torch.zeros(b, width, width, dtype=torch.bool, device=tokens.device)
        # the query predicting token i sits on slot p - 1 + i; token j sits on slot p + j
        gaps[:, p - 1:, p:] = hidden[:, :, :n - 1].to(tokens.device)
        slots = torch.arange(width, device=tokens.device).expand(b, -1)
        return super().forward_train(cond, tokens, prefix_mask, attention_mask(slots, width, gaps, own=False))
