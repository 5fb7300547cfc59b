"""`OfficialImageModel`: a `TokenImageModel` for GPTs loaded from official checkpoints. It casts
condition features to the GPT's dtype/device and passes a caption padding mask to the GPT, and
`PaddedCondition` is the condition that carries that mask (LlamaGen's `emb_masks`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.models.condition import TextCondition
from harness.models.image_model import TokenImageModel
from harness.models.wrapper import forwarded


@dataclass(frozen=True, slots=True)
class PaddedCondition:
    """Caption features `text` [B, P, D] plus `mask` [B, P] bool (True = real caption token).
    CFG rows (`with_null`) keep the same padding mask, as LlamaGen does."""

    text: TextCondition
    mask: Tensor

    @property
    def batch_size(self) -> int:
        return self.text.batch_size

    def with_null(self) -> "PaddedCondition":
        return PaddedCondition(self.text.with_null(), torch.cat([self.mask, self.mask]))

    def select(self, index: Tensor) -> "PaddedCondition":
        return PaddedCondition(self.text.select(index), self.mask[index.to(self.mask.device)])

    def to(self, device: torch.device | str) -> "PaddedCondition":
        return PaddedCondition(self.text.to(device), self.mask.to(device))


class OfficialImageModel(TokenImageModel):
    """ARImageModel over an official-layout GPT; accepts `TextCondition` or `PaddedCondition`."""

    dtype = forwarded("gpt.output.weight.dtype")

    @torch.inference_mode()
    def prefill(self, cond: TextCondition | PaddedCondition) -> Tensor:  # type: ignore[override]
        """Condition of batch B -> logits [B, V] for image position 0."""
        text, mask = (cond.text, cond.mask) if isinstance(cond, PaddedCondition) else (cond, None)
        text = text.to(self.device)
        if text.features is not None:
            text = TextCondition(null=text.null, features=text.features.to(self.dtype))
        return self.gpt.prefill(text, prefix_mask=None if mask is None else mask.to(self.device))
