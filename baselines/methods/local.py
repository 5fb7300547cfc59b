"""MuLo-SD's rejection scope `local(l)` (paper.md §6): local rejection with neighbourhood expansion.

For one verified block of L drafts at raster positions n_b .. n_b + L - 1 of a rows x cols grid:

    R_T = rejected positions,  t0 = min R_T (raster order)
    R_X = U_{t in R_T} { u in block : |row_u - row_t| <= l, |col_u - col_t| <= l, u >= t0 }

R_X is resampled by the target, every other draft is kept, also after t0; positions before t0 are
never touched. l = 0 is "naive local" (R_X = R_T); l = "all" (an ablation, not in the paper) redraws
every position at or after t0 (R_X = {u >= t0}: a window larger than the grid), so only the drafts
before the first rejection survive. The loop samples t0 itself from the
verification's own p (its context, the drafts before it, is final); a `Resampler`
(baselines/methods/resampling.py) refills R_X \\ {t0}. The frontier advances over the whole block.

`rounds` (an extension, not in the paper; paper.md §6 open point (c)) lets a drafted image be
verified up to `rounds` times: while a verification rejects something and rounds are left, only
positions up to t0 are committed, and the next verification judges the rest of the image as it
then stands (kept drafts and redrawn tokens alike) in its new context. rounds = 1 is the paper.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from baselines.framework.canvas import span
from baselines.framework.scope import RasterScope, RejectionScope, Resolution


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


ALL = "all"  # scope.radius: redraw every position at or after t0 (a window covering the image)


class LocalScope(RejectionScope):
    """`local(radius)`: resample the rejections and their square neighbourhood of `radius`, at or
    after the first rejection; keep every other draft.

    Resolution: keep = valid and not in R_X; rejected = R_T; first = t0 (L if nothing was
    rejected); resample = R_X without t0; advance = the whole block (clipped to the image);
    kv_valid = t0 (the K/V of every position after t0 saw rejected drafts; the resampler may
    lower or keep it, see baselines/methods/resampling.py), at most advance - 1 so that the next
    verification re-feeds at least the last committed token.

    With rounds > 1, a row whose verification rejected something and that has verified its
    current block fewer than `rounds` times advances only to t0 + 1 (the redrawn and kept
    positions after t0 become the next verification's drafts); the count comes in and goes out as
    `verified` [B] (Resolution.verified), so the scope itself keeps no state.
    """

    needs_resampler = True

    def __init__(self, radius: int | str = 3, length: int | None = None, rounds: int = 1) -> None:
        if radius != ALL and (isinstance(radius, str) or int(radius) != radius or radius < 0):
            raise ValueError(f"decoder scope.radius (local) must be an integer >= 0 or {ALL!r} (every "
                             f"position after the first rejection), got {radius!r}")
        if int(rounds) != rounds or rounds < 1:
            raise ValueError(f"decoder scope.rounds (local) must be an integer >= 1 (1 = the paper: one "
                             f"verification per drafted block), got {rounds!r}")
        self.radius: int | str = ALL if radius == ALL else int(radius)
        self.rounds = int(rounds)
        self.name = f"local({self.radius})" if self.rounds == 1 else f"local({self.radius},x{self.rounds})"
        self.refeed = 0 if length is None else int(length)

    def bind(self, length: int) -> "LocalScope":
        """This scope for blocks of `length` drafts (refeed = L: after a block whose first
        rejection is at offset 0, the next verification re-encodes the whole block)."""
        return LocalScope(self.radius, length, self.rounds)

    def least_advance(self, length: int) -> int:
        """One verification commits the whole block (rounds = 1: advance = min(remaining, L));
        with rounds > 1 a row that verifies its block again advances at least to t0 + 1."""
        return length if self.rounds == 1 else 1

    def resolve(self, accept: Tensor, remaining: Tensor, grid: tuple[int, int],
                verified: Tensor | None = None) -> Resolution:
        """accept [B, L] bool, remaining [B], grid (rows, cols), verified [B] or None (the
        previous resolution's) -> Resolution."""
        length = accept.shape[1]
        offsets = span(length, accept.device)
        valid = offsets < remaining[:, None]
        rejected = ~accept & valid
        first = torch.where(rejected, offsets, length).min(-1).values  # t0 [B] (L: none)
        start = grid[0] * grid[1] - remaining
        after = valid & (offsets >= first[:, None])  # first = L where nothing was rejected: empty
        expanded = after if self.radius == ALL else dilate(rejected, start, grid, self.radius) & after
        advance = torch.minimum(remaining, torch.full_like(remaining, length)).clamp_min(0)
        advance, verified = self._count_round(rejected.any(-1), first, advance, verified)
        return Resolution(keep=valid & ~expanded, rejected=rejected, first=first,
                          resample=expanded & (offsets != first[:, None]), advance=advance,
                          kv_valid=torch.minimum(first, (advance - 1).clamp_min(0)), verified=verified)

    def _count_round(self, any_rejected: Tensor, first: Tensor, advance: Tensor,
                     verified: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """advance [B] over the whole block, verified [B] or None (0 each) -> (advance [B]: t0 + 1
        for rows that rejected something and may verify their block again, their verified + 1;
        0 for the others, whose next block is fresh). rounds = 1 keeps no count (None)."""
        if self.rounds == 1:
            return advance, None
        verified = torch.zeros_like(advance) if verified is None else verified
        again = any_rejected & (verified + 1 < self.rounds)
        advance = torch.where(again, torch.minimum(first + 1, advance), advance)
        return advance, torch.where(again, verified + 1, 0)


SCOPE_KINDS = ("local", "raster")


def build_scope(kind: str = "local", radius: int | str = 3, rounds: int = 1) -> "LocalScope | RasterScope":
    """The rejection scope named `kind` (config entry point, so that one node switches with
    `kind=...`): "local" (LocalScope(radius, rounds=rounds)) or "raster" (baselines/framework/scope.py;
    radius and rounds unused)."""
    if kind == "local":
        return LocalScope(radius, rounds=rounds)
    if kind == "raster":
        return RasterScope()
    raise ValueError(f"decoder scope.kind must be one of {SCOPE_KINDS}, got {kind!r}")
