"""Training masks that teach a raster GPT the contexts of spatially-local parallel decoding.

ZipAR, and MuLo-SD's island-parallel resampler, decode a region of the grid row by row with a
lag: the k-th region position of the region's j-th row is drawn at step j * window + k
(baselines/methods/islands.py). A query then sees every token outside the region and only the region
tokens of earlier steps; the region tokens of later steps (the right part of the rows above) are
hidden. A raster-trained GPT never saw such gaps (LPD, Zhang et al. 2025, trains on them). Here a
fraction of each batch is trained with the gaps of a random region and window, the rest with the
plain causal mask.

The step rule is ZipAR's (baselines/methods/zipar.py: on the whole grid the masks hide exactly what it has
not decoded). The resampler's schedule differs in one place: its island's first position t0 is
drawn by the verification, so the rest of the island's first row is ranked from 0 and runs one
step ahead; for the first `window` positions of the island's second row these masks hide one more
token of the first row than the resampler does (checked on a 3 x 4 island, window 2). The rule
is restated here rather than imported, since the harness does not depend on baselines/.

Index convention (ShapesGPT.forward_train, harness/shapes/gpt.py): the query predicting token i
sits on the slot of token i - 1, so `hidden[i, j]` hides token j from the prediction of token i. A
query always sees its own slot (token i - 1): the residual stream carries it whatever the mask says.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor


def region_steps(region: Tensor, window: int) -> Tensor:
    """region [R, C] bool -> steps [R * C] int64: (row - first region row) * window + rank of the
    position among its row's region positions; -1 outside the region."""
    rows = torch.arange(region.shape[0], device=region.device)[:, None].expand_as(region)
    top = int(rows[region].min()) if region.any() else 0
    rank = region.long().cumsum(1) - 1
    return torch.where(region, (rows - top) * window + rank, -1).flatten()


def zipar_hidden(region: Tensor, window: int) -> Tensor:
    """region [R, C] bool, window >= 1 -> hidden [N, N] bool (N = R * C): token j is hidden from
    the prediction of token i when both lie in the region, j precedes i in raster order, j is
    not i - 1, and j is drawn at the same step as i or later."""
    steps = region_steps(region, window)
    n = steps.numel()
    inside = steps >= 0
    index = torch.arange(n, device=region.device)
    later = steps[None, :] >= steps[:, None]  # [i, j]: j's step >= i's step
    before = index[None, :] < index[:, None] - 1
    return inside[:, None] & inside[None, :] & later & before


def random_region(rng: np.random.Generator, grid: tuple[int, int], whole: float) -> Tensor:
    """The whole grid with probability `whole`, else a random rectangle of at least 2 x 2."""
    rows, cols = grid
    region = torch.zeros(rows, cols, dtype=torch.bool)
    if rng.random() < whole:
        region[:] = True
        return region
    h, w = int(rng.integers(2, rows + 1)), int(rng.integers(2, cols + 1))
    r0, c0 = int(rng.integers(0, rows - h + 1)), int(rng.integers(0, cols - w + 1))
    region[r0:r0 + h, c0:c0 + w] = True
    return region


Gap = tuple[int, Tensor, int]  # (batch row, region [R, C] bool, window)


def sample_gaps(rng: np.random.Generator, batch: int, grid: tuple[int, int], fraction: float,
                windows: Sequence[int], whole: float = 0.5) -> list[Gap]:
    """The context gaps of one training batch, compactly: each row, with probability `fraction`,
    gets a random region (random_region) decoded with a window drawn from `windows`."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"parallel_fraction must lie in [0, 1], got {fraction!r}")
    if not windows or any(int(w) != w or w < 1 for w in windows):
        raise ValueError(f"parallel_windows must be integers >= 1, got {list(windows)!r}")
    gaps: list[Gap] = []
    if fraction == 0:
        return gaps
    for b in range(batch):
        if rng.random() < fraction:
            window = int(windows[int(rng.integers(len(windows)))])
            gaps.append((b, random_region(rng, grid, whole), window))
    return gaps


def hidden_of(gaps: list[Gap], batch: int, device: torch.device | str = "cpu") -> Tensor | None:
    """gaps -> hidden [B, N, N] bool on `device` (zipar_hidden per listed row; other rows hide
    nothing); None when no row hides anything."""
    if not gaps:
        return None
    n = gaps[0][1].numel()
    hidden = torch.zeros(batch, n, n, dtype=torch.bool, device=device)
    for b, region, window in gaps:
        hidden[b] = zipar_hidden(region.to(device), window)
    return hidden if hidden.any() else None


def sample_hidden(rng: np.random.Generator, batch: int, grid: tuple[int, int], fraction: float,
                  windows: Sequence[int], whole: float = 0.5) -> Tensor | None:
    """hidden [B, N, N] bool for one training batch: hidden_of(sample_gaps(...)) on the CPU. None
    when no row is masked."""
    return hidden_of(sample_gaps(rng, batch, grid, fraction, windows, whole), batch)
