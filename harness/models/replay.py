"""`ReplayModel`: an ARImageModel whose predictions are fixed token grids (an oracle).

It wraps a real model and keeps everything of it (grid, vocabulary, codebook, tokenizer) except
its next-token distribution, which is one-hot on a reference token at every position. As the
drafter of a speculative decoder it drafts exactly the reference, whatever the sampling, so a
benchmark can separate what a drafter costs from what the rest of the method costs: MuLo-SD with
the low-resolution view of the target's own raster sample as its draft (benchmarks/mulo.py
--diagnose) has a drafter that makes no layout mistakes.
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.api import ARImageModel, Condition
from harness.models.wrapper import ModelWrapper

# The logit of every non-reference token: exp(-1e4) underflows to 0 in float32, and the value stays
# finite so that temperature, top-k/top-p and guidance mixing never meet inf - inf.
OFF = -1e4


class ReplayModel(ModelWrapper):
    """Wraps `model`; `forward`/`prefill` return one-hot logits on `reference` [B, rows*cols].

    Args:
        model: the model whose grid, vocabulary, codebook, decode and encode are kept.
        reference: int64 [B, rows*cols] tokens to replay; set per batch with `replay`.
    """

    def __init__(self, model: ARImageModel, reference: Tensor | None = None) -> None:
        super().__init__(model)
        self.reference: Tensor | None = None
        if reference is not None:
            self.replay(reference)

    @property
    def n_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    def replay(self, reference: Tensor) -> "ReplayModel":
        """Set the tokens to replay: int64 [B, rows*cols] in [0, vocab)."""
        if reference.dim() != 2 or reference.shape[1] != self.n_tokens:
            raise ValueError(f"replay reference must be [batch, {self.n_tokens}] tokens for grid {self.grid}, "
                             f"got shape {tuple(reference.shape)}")
        if reference.numel() and (int(reference.min()) < 0 or int(reference.max()) >= self.vocab_size):
            raise ValueError(f"replay reference tokens must lie in [0, {self.vocab_size}), "
                             f"got [{int(reference.min())}, {int(reference.max())}]")
        self.reference = reference.long()
        return self

    def setup_cache(self, batch_size: int) -> None:
        """No cache to keep; checks that the reference has one row per image."""
        if self.reference is None or self.reference.shape[0] != batch_size:
            have = None if self.reference is None else self.reference.shape[0]
            raise ValueError(f"ReplayModel: a batch of {batch_size} needs a reference of {batch_size} rows "
                             f"(replay(tokens) before decoding), has {have}")

    def _one_hot(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> logits [B, T, V]: 0 on the token, OFF elsewhere."""
        logits = torch.full((*tokens.shape, self.vocab_size), OFF, device=tokens.device)
        return logits.scatter_(-1, tokens[..., None], 0.0)

    def prefill(self, cond: Condition) -> Tensor:
        """Logits [B, V] of position 0 (the condition is ignored)."""
        assert self.reference is not None, "setup_cache checks the reference"
        return self._one_hot(self.reference[:, :1].to(self.device))[:, 0]

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None) -> Tensor:
        """tokens [B, T] (ignored) at positions [T] or [B, T] -> logits [B, T, V] one-hot on the
        reference at positions + 1 (the last position past the grid repeats the last token)."""
        assert self.reference is not None, "setup_cache checks the reference"
        b = tokens.shape[0]
        after = (positions + 1).clamp(max=self.n_tokens - 1).to(self.reference.device)
        after = after.expand(b, -1) if after.dim() == 1 else after
        return self._one_hot(self.reference.gather(1, after).to(self.device))
