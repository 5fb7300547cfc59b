"""The Janus-Pro condition: the chat-formatted prompt as token ids, left-padded to the model's
prefix length, and its unconditional rows as transformers' Janus `generate(generation_mode="image")`
builds them: the same ids with every token but BOS and the image-start tag replaced by the pad token,
under the same attention mask."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class PromptIds:
    """ids [B, P] int64 (left-padded with `pad_id`), keep [B, P] bool (True = a prompt token, False =
    padding). `kept` are the token ids an unconditional row keeps (BOS and the image-start tag)."""

    ids: Tensor
    keep: Tensor
    pad_id: int
    kept: tuple[int, ...]

    @property
    def batch_size(self) -> int:
        return int(self.ids.shape[0])

    def blanked(self) -> Tensor:
        """ids [B, P] of the unconditional rows: every token not in `kept` becomes `pad_id`."""
        keep = torch.isin(self.ids, torch.tensor(self.kept, device=self.ids.device))
        return torch.where(keep, self.ids, torch.full_like(self.ids, self.pad_id))

    def with_null(self) -> "PromptIds":
        """[B] -> [2B]: the prompts, then the same rows blanked (the same padding mask)."""
        return PromptIds(torch.cat([self.ids, self.blanked()]), torch.cat([self.keep, self.keep]),
                         self.pad_id, self.kept)

    def select(self, index: Tensor) -> "PromptIds":
        index = index.to(self.ids.device)
        return PromptIds(self.ids[index], self.keep[index], self.pad_id, self.kept)

    def to(self, device: torch.device | str) -> "PromptIds":
        return PromptIds(self.ids.to(device), self.keep.to(device), self.pad_id, self.kept)


def left_padded(rows: list[list[int]], prefix_len: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """Token id lists -> (ids [B, prefix_len], keep [B, prefix_len]), each row's tokens last.

    Raises:
        ValueError: a prompt longer than `prefix_len` tokens, naming model.prefix_len.
    """
    longest = max((len(r) for r in rows), default=0)
    if longest > prefix_len:
        raise ValueError(f"a prompt takes {longest} tokens with the chat template, more than "
                         f"model.prefix_len={prefix_len}; raise model.prefix_len (costs cache slots only)")
    ids = torch.full((len(rows), prefix_len), pad_id, dtype=torch.long)
    keep = torch.zeros(len(rows), prefix_len, dtype=torch.bool)
    for i, row in enumerate(rows):
        if row:
            ids[i, prefix_len - len(row):] = torch.tensor(row, dtype=torch.long)
            keep[i, prefix_len - len(row):] = True
    return ids, keep
