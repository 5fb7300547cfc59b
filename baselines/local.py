"""MuLo-SD's rejection scope `local(l)` (paper.md §6): local rejection with neighbourhood expansion.

For one verified block of L drafts at raster positions n_b .. n_b + L - 1 of a rows x cols grid:

    R_T = rejected positions,  t0 = min R_T (raster order)
    R_X = U_{t in R_T} { u in block : |row_u - row_t| <= l, |col_u - col_t| <= l, u >= t0 }

R_X is resampled by the target, every other draft is kept, also after t0; positions before t0 are
never touched. l = 0 is "naive local" (R_X = R_T). The loop samples t0 itself from the
verification's own p (its context, the drafts before it, is final); a `Resampler`
(baselines/resampling.py) refills R_X \\ {t0}. The frontier advances over the whole block.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from baselines.scope import RasterScope, Resolution


def block_coordinates(start: Tensor, length: int, cols: int) -> tuple[Tensor, Tensor]:
    """start [B] raster index of each block -> (row, col) [B, L] int64 of its L positions."""
    index = start[:, None] + torch.arange(length, device=start.device)
    return index // cols, index % cols


def dilate(marked: Tensor, start: Tensor, grid: tuple[int, int], radius: int) -> Tensor:
    """marked [B, L] bool block offsets -> [B, L] bool: offsets within Chebyshev distance `radius`
    of a marked offset on the 2-D grid (a square window of side 2 * radius + 1)."""
    rows, cols = grid
    b, length = marked.shape
    index = (start[:, None] + torch.arange(length, device=marked.device)).clamp(max=rows * cols)
    canvas = torch.zeros(b, rows * cols + 1, device=marked.device)  # last column: past the end
    canvas.scatter_(1, index, marked.float())
    image = canvas[:, :-1].view(b, 1, rows, cols)
    if radius > 0:
        image = F.max_pool2d(image, 2 * radius + 1, stride=1, padding=radius)
    flat = torch.cat([image.view(b, -1), torch.zeros(b, 1, device=marked.device)], 1)
    return flat.gather(1, index) > 0


class LocalScope:
    """`local(radius)`: resample the rejections and their square neighbourhood of `radius`, at or
    after the first rejection; keep every other draft.

    Resolution: keep = valid and not in R_X; rejected = R_T; first = t0 (L if nothing was
    rejected); resample = R_X without t0; advance = the whole block (clipped to the image);
    kv_valid = t0 (the K/V of every position after t0 saw rejected drafts; the resampler may
    lower or keep it, see baselines/resampling.py), at most advance - 1 so that the next
    verification re-feeds at least the last committed token.
    """

    needs_resampler = True

    def __init__(self, radius: int = 3, length: int | None = None) -> None:
        if int(radius) != radius or radius < 0:
            raise ValueError(f"decoder scope.radius (local) must be an integer >= 0, got {radius!r}")
        self.radius = int(radius)
        self.name = f"local({self.radius})"
        self.refeed = 0 if length is None else int(length)

    def bind(self, length: int) -> "LocalScope":
        """This scope for blocks of `length` drafts (refeed = L: after a block whose first
        rejection is at offset 0, the next verification re-encodes the whole block)."""
        return LocalScope(self.radius, length)

    def resolve(self, accept: Tensor, remaining: Tensor, grid: tuple[int, int]) -> Resolution:
        """accept [B, L] bool, remaining [B], grid (rows, cols) -> Resolution."""
        length = accept.shape[1]
        offsets = torch.arange(length, device=accept.device)
        valid = offsets < remaining[:, None]
        rejected = ~accept & valid
        first = torch.where(rejected, offsets, length).min(-1).values  # t0 [B] (L: none)
        start = grid[0] * grid[1] - remaining
        expanded = dilate(rejected, start, grid, self.radius) & valid & (offsets >= first[:, None])
        advance = torch.minimum(remaining, torch.full_like(remaining, length)).clamp_min(0)
        return Resolution(keep=valid & ~expanded, rejected=rejected, first=first,
                          resample=expanded & (offsets != first[:, None]), advance=advance,
                          kv_valid=torch.minimum(first, (advance - 1).clamp_min(0)))


SCOPE_KINDS = ("local", "raster")


def build_scope(kind: str = "local", radius: int = 3) -> "LocalScope | RasterScope":
    """The rejection scope named `kind` (config entry point, so that one node switches with
    `kind=...`): "local" (LocalScope(radius)) or "raster" (baselines/scope.py; radius unused)."""
    if kind == "local":
        return LocalScope(radius)
    if kind == "raster":
        return RasterScope()
    raise ValueError(f"decoder scope.kind must be one of {SCOPE_KINDS}, got {kind!r}")
