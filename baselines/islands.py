"""Rejection islands and resampling schedules (paper.md §7).

A resampling schedule assigns every position of a block's resample set R_X (block offsets) the
index of the target forward that redraws it. `serial`: raster order, one position per forward.
`parallel`: R_X (with t0, which the verification already redrew) is split into 8-connected
islands; all islands advance in the same forwards, and inside an island the rows are decoded
ZipAR-style: the k-th position (left to right) of the island's j-th row is drawn in forward
j * window + k, so row j + 1 starts once row j has `window` tokens. Forwards in which no position
is drawn are skipped (the step indices are made dense), so a schedule never idles.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from baselines.local import block_coordinates


def label_islands(marked: Tensor) -> Tensor:
    """marked [B, R, C] bool -> labels [B, R, C] int64: the smallest raster index of each cell's
    8-connected component, -1 outside `marked` (label propagation with a 3 x 3 min filter)."""
    b, rows, cols = marked.shape
    big = float(rows * cols)
    index = torch.arange(rows * cols, device=marked.device, dtype=torch.float32).view(1, 1, rows, cols)
    labels = torch.where(marked[:, None], index, big)
    while True:
        spread = -F.max_pool2d(-labels, 3, stride=1, padding=1)  # 3 x 3 minimum
        spread = torch.where(marked[:, None], spread, big)
        if torch.equal(spread, labels):
            break
        labels = spread
    return torch.where(marked, labels[:, 0].long(), -1)


def block_islands(members: Tensor, start: Tensor, grid: tuple[int, int]) -> Tensor:
    """members [B, L] bool block offsets -> [B, L] int64 island label of each member, -1 for
    non-members (labels are raster indices, comparable within a row of the batch)."""
    rows, cols = grid
    b, length = members.shape
    index = (start[:, None] + torch.arange(length, device=members.device)).clamp(max=rows * cols)
    board = torch.zeros(b, rows * cols + 1, dtype=torch.bool, device=members.device)
    board.scatter_(1, index, members)
    labels = label_islands(board[:, :-1].view(b, rows, cols)).view(b, -1)
    labels = torch.cat([labels, torch.full((b, 1), -1, device=members.device, dtype=torch.long)], 1)
    return torch.where(members, labels.gather(1, index), -1)


def dense(steps: Tensor) -> Tensor:
    """steps [B, L] int64 (-1 = none) -> the same order with the empty step indices removed."""
    top = int(steps.max()) + 1 if steps.numel() else 0
    if top <= 0:
        return steps
    used = torch.zeros(steps.shape[0], top + 1, dtype=torch.long, device=steps.device)
    used.scatter_(1, (steps + 1).clamp_min(0), 1)  # column 0 collects the -1 entries
    used[:, 0] = 0
    rank = used.cumsum(1) - 1  # rank of step s is rank[s + 1]
    return torch.where(steps >= 0, rank.gather(1, steps + 1), -1)


def serial_steps(resample: Tensor) -> Tensor:
    """resample [B, L] bool -> steps [B, L]: the raster rank of each resampled offset, -1 elsewhere."""
    return torch.where(resample, resample.long().cumsum(1) - 1, -1)


def island_steps(resample: Tensor, first: Tensor, start: Tensor, grid: tuple[int, int],
                 window: int) -> tuple[Tensor, Tensor]:
    """The parallel schedule. resample [B, L] bool (R_X without t0), first [B] (t0; L = none),
    start [B] -> (steps [B, L] int64 dense, -1 elsewhere; island labels [B, L] of R_X with t0)."""
    length = resample.shape[1]
    offsets = torch.arange(length, device=resample.device)
    members = resample | (offsets[None] == first[:, None])
    labels = block_islands(members, start, grid)
    row, col = block_coordinates(start, length, grid[1])
    same_island = (labels[:, :, None] == labels[:, None, :]) & members[:, None, :]  # [B, L, L]
    big = torch.iinfo(torch.long).max
    top = torch.where(same_island, row[:, None, :], big).min(-1).values  # island's first row
    same_row = same_island & (row[:, :, None] == row[:, None, :]) & resample[:, None, :]
    k = (same_row & (col[:, None, :] < col[:, :, None])).sum(-1)  # rank within the island row
    steps = torch.where(resample, (row - top) * window + k, -1)
    return dense(steps), labels
