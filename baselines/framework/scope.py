"""Rejection scopes: which drafts survive a verification, which position is sampled from the
verification's own distributions, and which further positions need fresh target forwards.

A scope turns accept [B, L] into a `Resolution` (all offsets relative to each row's frontier n_b):
    keep      [B, L] bool  drafts committed as proposed;
    rejected  [B, L] bool  rejections that count (the per-position rejection map);
    first     [B] int64    the offset sampled from this verification (0..L): the first rejection,
                           resampled from the rule's residual, or L (every draft accepted): the
                           bonus token from p at offset L; committed only if it is < advance;
    resample  [B, L] bool  further positions (never `first`) a `Resampler` must refill with new
                           target forwards;
    advance   [B] int64    how far the committed frontier moves;
    kv_valid  [B] int64    offsets whose target K/V is final after the step (< kv_valid), below
                           advance in a row that advances (the next verification re-feeds at
                           least the last committed token);
    verified  [B] int64    (scopes with rounds > 1, else None) how often each row's next block
                           has been verified already (0: a fresh block); the loop hands it to the
                           next `resolve`, so a scope keeps no state of its own.
`refeed` is the most committed-but-not-encoded tokens the next verification must feed before its
drafts (raster: 1, the last committed token); `least_advance(L)` the fewest positions a step
advances a row that has that many left (raster: 1), from which the loop knows, without reading the
device, when every row has finished. MuLo-SD's `local(l)` scope keeps accepted drafts after
the first rejection t0, marks the l-neighbourhoods of rejections at or after t0 for resampling,
advances over the whole block and sets kv_valid = t0 (later K/V are stale), with refeed = L; its
`serial` / island-`parallel` schedules are `Resampler`s.
"""
from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from baselines.framework.canvas import Canvas, Context, span


@dataclass(frozen=True)
class Resolution:
    """What a verification commits (see the module docstring for every field)."""

    keep: Tensor
    rejected: Tensor
    first: Tensor
    resample: Tensor
    advance: Tensor
    kv_valid: Tensor
    verified: Tensor | None = None


class RejectionScope(ABC):
    """A rejection scope: `resolve` (stateless: per-row state comes in and goes out through
    `verified`), and what the loop asks of it, with the raster scope's defaults: `refeed`,
    `needs_resampler` (whether it marks `resample` positions), `rounds` (verifications a drafted
    block may get), `bind(length)` (the scope for blocks of L drafts, once per generate call) and
    `least_advance(length)`."""

    name: str
    refeed: int = 1
    needs_resampler: bool = False
    rounds: int = 1

    def bind(self, length: int) -> "RejectionScope":
        return self

    def least_advance(self, length: int) -> int:
        """The fewest positions one step advances a row with at least that many left, for blocks
        of `length` drafts (the raster scope commits at least the token it samples: 1)."""
        return 1

    @abstractmethod
    def resolve(self, accept: Tensor, remaining: Tensor, grid: tuple[int, int],
                verified: Tensor | None = None) -> Resolution:
        """accept [B, L] bool, remaining [B] = N - n_b (positions left per row), grid (rows,
        cols) of the target (2-D scopes place offset o of row b at raster index N - remaining + o),
        verified [B] (the previous resolution's, None at the start) -> Resolution."""


class Resampler(Protocol):
    """Refills `resample` positions with target forwards (MuLo-SD's resampling schedules)."""

    name: str

    def fill(self, ctx: Context, canvas: Canvas, res: Resolution) -> tuple[Resolution, Tensor]:
        """Write new tokens at the resample positions of `canvas` (offsets from its frontier,
        which is not yet advanced); return the resolution with kv_valid updated and the target
        forwards [B] it took."""
        ...


class RasterScope(RejectionScope):
    """`raster`: accept the longest run of accepted drafts, resample the first rejection from the
    residual (or take the bonus token when all were accepted), discard everything after."""

    name = "raster"

    def resolve(self, accept: Tensor, remaining: Tensor, grid: tuple[int, int] | None = None,
                verified: Tensor | None = None) -> Resolution:
        offsets = span(accept.shape[1], accept.device)
        valid = offsets < remaining[:, None]
        keep = (accept & valid).cummin(-1).values  # the accepted run: the drafts before the first rejection
        lead = keep.sum(-1)  # its length [B]
        rejected = (offsets == lead[:, None]) & valid
        advance = torch.minimum(lead + 1, remaining)
        return Resolution(keep=keep, rejected=rejected, first=lead, advance=advance, kv_valid=lead,
                          resample=_unmarked(keep.shape, keep.device))


@functools.lru_cache(maxsize=64)
def _unmarked(shape: torch.Size, device: torch.device) -> Tensor:
    """All-False bool [shape] (a raster resolution's `resample`), made once per (shape, device) and
    shared: read it, never write it."""
    return torch.zeros(shape, dtype=torch.bool, device=device)
