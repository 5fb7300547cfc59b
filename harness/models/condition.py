"""Text conditions: what a bundle's conditioner produces and every model of the bundle consumes."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class TextCondition:
    """A batch of captions, either as word ids [B, P] (models that own a word embedding, e.g. the
    shapes world) or as features [B, P, D] (e.g. FLAN-T5 features for LlamaGen). `null` [B] bool
    marks rows that use the unconditional embedding (classifier-free guidance)."""

    null: Tensor
    ids: Tensor | None = None
    features: Tensor | None = None

    def __post_init__(self) -> None:
        if (self.ids is None) == (self.features is None):
            raise ValueError("TextCondition needs exactly one of ids or features")

    @property
    def batch_size(self) -> int:
        return int(self.null.shape[0])

    def with_null(self) -> "TextCondition":
        """[B] -> [2B]: conditional rows, then the same rows marked unconditional."""
        return TextCondition(
            null=torch.cat([self.null, torch.ones_like(self.null)]),
            ids=None if self.ids is None else torch.cat([self.ids, self.ids]),
            features=None if self.features is None else torch.cat([self.features, self.features]),
        )

    def select(self, index: Tensor) -> "TextCondition":
        return TextCondition(
            null=self.null[index],
            ids=None if self.ids is None else self.ids[index],
            features=None if self.features is None else self.features[index],
        )

    def to(self, device: torch.device | str) -> "TextCondition":
        return TextCondition(
            null=self.null.to(device),
            ids=None if self.ids is None else self.ids.to(device),
            features=None if self.features is None else self.features.to(device),
        )
