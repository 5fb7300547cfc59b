"""`TokenImageModel`: a GPT plus an image tokenizer, exposed through the ARImageModel contract."""
from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from harness.models.condition import TextCondition
from harness.models.gpt import GPT


class ImageTokenizer(Protocol):
    """A vector-quantised image tokenizer (VQ-VAE / VQGAN)."""

    @property
    def codebook(self) -> Tensor: ...  # [V, D]

    def encode(self, images: Tensor) -> Tensor: ...  # uint8 [B, 3, H, W] -> int64 [B, h, w]

    def decode(self, tokens: Tensor) -> Tensor: ...  # int64 [B, h, w] -> uint8 [B, 3, H, W]


class TokenImageModel(nn.Module):
    """ARImageModel over `gpt.cfg.grid` tokens; images are produced by `tokenizer`.

    The KV cache lives in the GPT; `forward` is the cached forward of the contract."""

    def __init__(self, gpt: GPT, tokenizer: ImageTokenizer, image_size: int | None = None) -> None:
        super().__init__()
        self.gpt = gpt
        self.tokenizer = tokenizer
        self.grid = gpt.cfg.grid
        self.vocab_size = gpt.cfg.vocab_size
        self.image_size = image_size

    @property
    def device(self) -> torch.device:
        return self.gpt.output.weight.device

    @property
    def codebook(self) -> Tensor:
        return self.tokenizer.codebook

    @property
    def cache_len(self) -> int:
        return self.gpt.slots

    @property
    def prefix_len(self) -> int:
        return self.gpt.cfg.prefix_len

    @torch.inference_mode()
    def setup_cache(self, batch_size: int) -> None:
        self.gpt.setup_cache(batch_size)

    @torch.inference_mode()
    def prefill(self, cond: TextCondition) -> Tensor:
        return self.gpt.prefill(cond.to(self.device))

    @torch.inference_mode()
    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None) -> Tensor:  # type: ignore[override]
        return self.gpt.forward_cached(tokens.to(self.device), positions.to(self.device),
                                       None if mask is None else mask.to(self.device))

    @torch.inference_mode()
    def decode(self, tokens: Tensor) -> Tensor:
        rows, cols = self.grid
        return self.tokenizer.decode(tokens.reshape(tokens.shape[0], rows, cols))

    @torch.inference_mode()
    def encode(self, images: Tensor) -> Tensor:
        tokens = self.tokenizer.encode(images)
        if tuple(tokens.shape[1:]) != self.grid:
            raise ValueError(f"images of size {tuple(images.shape[2:])} give a {tuple(tokens.shape[1:])} "
                             f"token grid; this model needs {self.grid}")
        return tokens.flatten(1)
