"""Lumina-mGPT's sequence layout: the chat prompt, the image header, end-of-row tokens, and the map
from image grid positions to sequence (cache) slots.

The map from grid positions to slots is harness/models/row_ends.SlotMap.

Official layout (Lumina-mGPT commit 104abe4: `lumina_mgpt/inference_solver.py`,
`lumina_mgpt/data/item_processor.py`, `lumina_mgpt/data/convertsation.py`,
`lumina_mgpt/generate_examples/generate.py`):

    <bos> "Generate an image of {w}x{h} according to the following prompt:\\n{prompt}" <sep>
    <image-start> <height> <width>  t(0,0) ... t(0,c-1) <eol>  t(1,0) ... <eol> ... t(r-1,c-1) <eol> <image-end>

with <sep> = `<reserved08706>` (id 8710), <image-start> = `<racm3:break>` (8197), <image-end> =
`<eoss>` (8196), <eol> = `<reserved08799>` (8803), and the resolution tokens `<reserved{8800+n}>`
(id 8804 + n) for n = pixels / 32 (the token grid is 2n: the VQGAN downsamples by 16). Image
codes are the vocabulary ids 4..8195 (`IMGIMG*` tokens); the official sampler suppresses every
other id at an image position and forces <eol> after every row.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.api import ConfigValueError

TEMPLATE = "Generate an image of {w}x{h} according to the following prompt:\n{prompt}"
PATCH_PX = 32  # pixels per resolution-token unit (item_processor.patch_size)
HEADER = 3  # <image-start> <height> <width>


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecialTokens:
    """Vocabulary ids of the layout (defaults: Chameleon's 65536-token vocabulary)."""

    bos: int = 0
    sep: int = 8710  # <reserved08706>: end of a chat turn
    image_start: int = 8197  # <racm3:break>
    image_end: int = 8196  # <eoss>
    new_line: int = 8803  # <reserved08799>: end of an image row
    size_base: int = 8804  # <reserved08800>: resolution token n is size_base + n
    first_code: int = 4  # IMGIMG tokens: ids first_code .. first_code + codes - 1
    codes: int = 8192


def size_token(tokens: SpecialTokens, px: int) -> int:
    """The resolution token of a side of `px` pixels (n = px / 32 units)."""
    if px % PATCH_PX:
        raise ConfigValueError(f"Lumina-mGPT sizes are multiples of {PATCH_PX} px, got {px}")
    return tokens.size_base + px // PATCH_PX


def header(tokens: SpecialTokens, width: int, height: int) -> list[int]:
    """[<image-start>, <height>, <width>] of an image of width x height px (height first)."""
    return [tokens.image_start, size_token(tokens, height), size_token(tokens, width)]


def check_header(tokens: SpecialTokens, ids: list[int], grid: tuple[int, int]) -> None:
    """Refuse a header whose resolution tokens do not give the `grid` (rows, cols) of the model:
    the official decoder reads rows = 2 * (ids[1] - size_base), cols = 2 * (ids[2] - size_base)."""
    rows, cols = 2 * (ids[1] - tokens.size_base), 2 * (ids[2] - tokens.size_base)
    if ids[0] != tokens.image_start or (rows, cols) != tuple(grid):
        raise ValueError(f"image header {ids} gives a {rows}x{cols} token grid (start {ids[0]}); the model's "
                         f"grid is {tuple(grid)} with start token {tokens.image_start}")


def code_ids(tokens: SpecialTokens, order: list[int] | None = None) -> Tensor:
    """[codes] vocabulary id of each VQGAN code: `order` (from the checkpoint's vocabulary map) or
    first_code + code."""
    if order is None:
        return torch.arange(tokens.codes) + tokens.first_code
    if sorted(order) != sorted(set(order)) or len(order) != tokens.codes:
        raise ValueError(f"the vocabulary map gives {len(set(order))} distinct image ids, expected {tokens.codes}")
    return torch.tensor(order)
