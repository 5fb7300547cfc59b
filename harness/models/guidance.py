"""Classifier-free guidance as a model wrapper: the batch is doubled (conditional rows, then
unconditional rows) and logits are mixed as u + s * (c - u). Decoders never see the doubling."""
from __future__ import annotations

import torch
from torch import Tensor

from harness.api import ARImageModel, Condition


class Guided:
    """Wraps an ARImageModel; exposes the same contract at the caller's batch size."""

    def __init__(self, model: ARImageModel, scale: float) -> None:
        if scale < 0:
            raise ValueError(f"cfg scale must be >= 0, got {scale}")
        self.model = model
        self.scale = float(scale)
        self.grid = model.grid
        self.vocab_size = model.vocab_size

    @property
    def codebook(self) -> Tensor:
        return self.model.codebook

    @property
    def cache_len(self) -> int:
        return self.model.cache_len

    @property
    def device(self) -> torch.device:
        return self.model.device  # type: ignore[attr-defined]

    def setup_cache(self, batch_size: int) -> None:
        self.model.setup_cache(2 * batch_size)

    def _mix(self, logits: Tensor) -> Tensor:
        """logits [2B, ...] -> [B, ...]: u + s * (c - u)."""
        cond, uncond = logits.chunk(2, dim=0)
        return uncond + self.scale * (cond - uncond)

    def prefill(self, cond: Condition) -> Tensor:
        return self._mix(self.model.prefill(cond.with_null()))

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None) -> Tensor:
        tokens2 = torch.cat([tokens, tokens])
        pos2 = positions if positions.dim() == 1 else torch.cat([positions, positions])
        mask2 = None if mask is None else torch.cat([mask, mask])
        return self._mix(self.model.forward(tokens2, pos2, mask2))

    def decode(self, tokens: Tensor) -> Tensor:
        return self.model.decode(tokens)

    def encode(self, images: Tensor) -> Tensor:
        return self.model.encode(images)
