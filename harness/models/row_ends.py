"""Sequences with an end-of-row token: where each image grid token and each end-of-row token lives
among a model's cache slots (Lumina-mGPT's `<eol>`, Emu3's `<|extra_200|>`).

The harness addresses image tokens by raster position; these models' sequences close every row
with an end-of-row token, so raster position i lives at slot `prefix + i + i // cols` and the
end-of-row token of row r right after the row's last token. Only the end-of-row tokens between
rows are inputs of an image: after the last row the image is complete.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class SlotMap:
    """Where each grid token and each end-of-row token lives among the cache slots.

    `prefix` slots hold the left-padded prompt and the header; then row r occupies `cols + 1`
    slots: its tokens, then its end-of-row token (the last row's is never an input: the image
    ends). The harness sees `prefix + rows * cols` slots (image position i at slot prefix + i)."""

    prefix: int
    grid: tuple[int, int]

    @property
    def n_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def slots(self) -> int:
        """Cache slots of the sequence (one more, the trash slot, follows them)."""
        rows, cols = self.grid
        return self.prefix + rows * (cols + 1) - 1

    @property
    def trash(self) -> int:
        """A slot no real query sees: padding inputs of a forward write there."""
        return self.slots

    def token_slot(self, positions: Tensor) -> Tensor:
        """Image positions [...] -> their cache slots [...]."""
        return self.prefix + positions + positions // self.grid[1]

    def eol_slot(self, rows: Tensor) -> Tensor:
        """Row indices [...] -> the cache slot of that row's end-of-row token."""
        return self.prefix + rows * (self.grid[1] + 1) + self.grid[1]

    def row_ends(self, positions: Tensor) -> Tensor:
        """Image positions [...] -> bool: the last token of a row that another row follows (the
        next input in the sequence is that row's end-of-row token)."""
        cols = self.grid[1]
        return (positions >= 0) & (positions % cols == cols - 1) & (positions < self.n_tokens - 1)
