"""The Emu3 condition: each prompt's text ids (BOS + prompt), left-padded, the size headers of the
bundle's grids, and the negative prompt that transformers' Emu3 image generation guides against.

The image header names the token grid (`<|image start|>{rows}*{cols}<|image token|>`), so the target
and a drafter at another resolution read different prefixes: the condition holds the header of each
grid and each model appends its own (`rows`). A CFG unconditional row is the negative prompt: with
`negative_header` (BAAI's image_generation.py, `cfg_context: baai`) followed by the same header, as
BAAI's processor builds it; without (`cfg_context: transformers`) the negative prompt alone, as
transformers' documented `generate(..., negative_prompt_ids=...)` runs it
(`UnbatchedClassifierFreeGuidanceLogitsProcessor`: the negative prompt's ids, then the generated
tokens).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True, slots=True)
class Emu3Prompt:
    """ids [B, P] int64 left-padded with `pad_id`; keep [B, P] bool (True = a real token); null [B]
    bool (rows holding the negative prompt); negative [P], negative_keep [P]: the negative prompt
    left-padded; headers: (grid, header ids) of every grid of the bundle; negative_header: the
    negative rows end with the header too (BAAI's CFG context)."""

    ids: Tensor
    keep: Tensor
    null: Tensor
    negative: Tensor
    negative_keep: Tensor
    pad_id: int
    headers: tuple[tuple[tuple[int, int], tuple[int, ...]], ...]
    negative_header: bool = False

    @property
    def batch_size(self) -> int:
        return int(self.ids.shape[0])

    def with_null(self) -> "Emu3Prompt":
        """[B] -> [2B]: the prompts, then the negative prompt once per row."""
        b = self.batch_size
        return Emu3Prompt(torch.cat([self.ids, self.negative.expand(b, -1)]),
                          torch.cat([self.keep, self.negative_keep.expand(b, -1)]),
                          torch.cat([self.null, torch.ones_like(self.null)]), self.negative, self.negative_keep,
                          self.pad_id, self.headers, self.negative_header)

    def select(self, index: Tensor) -> "Emu3Prompt":
        index = index.to(self.ids.device)
        return Emu3Prompt(self.ids[index], self.keep[index], self.null[index], self.negative, self.negative_keep,
                          self.pad_id, self.headers, self.negative_header)

    def to(self, device: torch.device | str) -> "Emu3Prompt":
        return Emu3Prompt(self.ids.to(device), self.keep.to(device), self.null.to(device), self.negative.to(device),
                          self.negative_keep.to(device), self.pad_id, self.headers, self.negative_header)

    def header(self, grid: tuple[int, int]) -> tuple[int, ...]:
        """The header ids of a `grid` (rows, cols) image."""
        found = dict(self.headers).get(tuple(grid))
        if found is None:
            raise ValueError(f"the condition holds headers for grids {[g for g, _ in self.headers]}, not {tuple(grid)}")
        return found

    def rows(self, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """(ids [B, P + H], keep [B, P + H]) of a `grid` image's prefix: a prompt row gets the H
        header ids after its text; a negative row too with `negative_header`, else H more padding
        slots before it (still left-padded)."""
        head = torch.tensor(self.header(grid), dtype=self.ids.dtype, device=self.ids.device)
        b, h = self.batch_size, head.numel()
        pads = torch.full((b, h), self.pad_id, dtype=self.ids.dtype, device=self.ids.device)
        heads = head.expand(b, -1)
        null = self.null[:, None] & (not self.negative_header)
        ids = torch.where(null, torch.cat([pads, self.ids], 1), torch.cat([self.ids, heads], 1))
        on, off = torch.ones_like(pads, dtype=torch.bool), torch.zeros_like(pads, dtype=torch.bool)
        keep = torch.where(null, torch.cat([off, self.keep], 1), torch.cat([self.keep, on], 1))
        return ids, keep


def left_padded(rows: list[list[int]], slots: int, pad_id: int, key: str) -> tuple[Tensor, Tensor]:
    """Token id lists -> (ids [B, slots], keep [B, slots]), each row's tokens last.

    Raises:
        ValueError: a row longer than `slots`, naming the config `key` to raise.
    """
    longest = max((len(r) for r in rows), default=0)
    if longest > slots:
        raise ValueError(f"a prompt takes {longest} tokens, more than {key}={slots}; raise {key} "
                         "(costs cache slots only)")
    ids = torch.full((len(rows), slots), pad_id, dtype=torch.long)
    keep = torch.zeros(len(rows), slots, dtype=torch.bool)
    for i, row in enumerate(rows):
        if row:
            ids[i, slots - len(row):] = torch.tensor(row, dtype=torch.long)
            keep[i, slots - len(row):] = True
    return ids, keep
