"""A fixed, training-free tokenizer: every token is a flat colour patch. Used by randomly
initialised test models so that the whole pipeline (tokens -> images -> evaluators) runs without
any weights."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class PatchTokenizer(nn.Module):
    """V tokens <-> V seeded RGB colours, each painted as a `patch x patch` square."""

    def __init__(self, vocab_size: int = 64, patch: int = 4, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        palette = torch.randint(0, 256, (vocab_size, 3), generator=g, dtype=torch.uint8)
        self.register_buffer("palette", palette)
        self.patch = patch

    @property
    def codebook(self) -> Tensor:
        """[V, 3] colours in [-1, 1]."""
        return self.palette.float() / 127.5 - 1

    def decode(self, tokens: Tensor) -> Tensor:
        """[B, h, w] int64 -> [B, 3, h*patch, w*patch] uint8."""
        img = self.palette[tokens.to(self.palette.device)].permute(0, 3, 1, 2)  # [B, 3, h, w]
        return img.repeat_interleave(self.patch, 2).repeat_interleave(self.patch, 3)

    def encode(self, images: Tensor) -> Tensor:
        """[B, 3, H, W] uint8 -> [B, H/patch, W/patch]: nearest palette colour of each patch mean."""
        x = images.float().to(self.palette.device)
        means = nn.functional.avg_pool2d(x, self.patch).permute(0, 2, 3, 1)  # [B, h, w, 3]
        d = torch.cdist(means.reshape(-1, 3), self.palette.float())
        return d.argmin(-1).reshape(means.shape[:3])
