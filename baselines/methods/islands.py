"""Rejection islands and resampling schedules (paper.md §7).

A resampling schedule assigns every position of a block's resample set R_X (block offsets) the
index of the target forward that redraws it. `serial`: raster order, one position per forward.
`parallel`: R_X (with t0, which the verification already redrew) is split into 8-connected
islands; all islands advance in the same forwards, and inside an island the rows are decoded
ZipAR-style: the k-th position (left to right) of the island's j-th row is drawn in forward
j * window + k, so row j + 1 starts once row j has `window` tokens. Forwards in which no position
is drawn are skipped (the step indices are made dense), so a schedule never idles.

Everything here is O(B * N) work with static shapes (N = rows * cols; no [B, L, L] pairwise
tensors). The labelling's convergence check is its only host read (harness/runtime/hostsync.py): after
every pass on the CPU, where it is free; elsewhere a caller may run a fixed number of passes and
read their "settled" flag together with its own values (IslandResampler.fill: one read per fill),
or check every CHUNK passes. A pass also hooks and jumps pointers, so few passes are needed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from baselines.methods.local import block_coordinates
from harness.runtime import hostsync

CHUNK = 8  # labelling passes between two convergence checks where host reads are not free (typical
           # rejection islands settle within one chunk: one read per labelling)


def _label_pass(labels: Tensor, marked: Tensor, grid: tuple[int, int]) -> Tensor:
    """One labelling pass over labels [B, N] float32 (N for unmarked cells; every other label is
    the raster index of a cell of the same component, and no larger than its own index)."""
    b, n = labels.shape
    spread = -F.max_pool2d(-labels.view(b, 1, *grid), 3, stride=1, padding=1).view(b, n)  # 3 x 3 min
    spread = torch.where(marked, spread, float(n))
    # hooking: the cell a label names takes the smallest label found next to any cell naming it,
    # so news also reaches the cell a component points to, not only the neighbours
    big = torch.full((b, 1), float(n), device=labels.device)  # column N: named by unmarked cells
    named = torch.cat([spread, big], 1).scatter_reduce(1, labels.long(), spread, "amin")
    # pointer jumping: a label l names a cell whose label is <= l; take it (N names column N)
    return named.gather(1, named[:, :n].long())


def label_islands(marked: Tensor, passes: int | None = None, unsettled: list[Tensor] | None = None) -> Tensor:
    """marked [B, R, C] bool -> labels [B, R, C] int64: the smallest raster index of each cell's
    8-connected component, -1 outside `marked`.

    Label propagation on float32 labels (exact below 2^24 cells; unmarked cells hold N = R * C),
    each pass a 3 x 3 minimum, hooking and pointer jumping (_label_pass): a long component takes
    a few passes, not one per cell of its length (a 64 x 64 serpentine: 12 passes, against 2017
    with the minimum alone). Labels only decrease, and each stays the index of a cell of its
    component, so a pass that changes nothing has reached the fixed point: then no neighbour of a
    cell has a smaller label, so a component holds one label, its smallest index.

    With `passes`, exactly that many passes run and nothing is read: whether the last one still
    changed a label goes into `unsettled` (a 0-d bool tensor) for the caller to read with its own
    values (IslandResampler.fill reads it with its plan, and labels again the rare time it is set)."""
    b, rows, cols = marked.shape
    n = rows * cols
    flat = marked.reshape(b, n)
    labels = torch.where(flat, torch.arange(n, device=marked.device, dtype=torch.float32), float(n))
    if passes is not None:
        before = labels
        for _ in range(passes):
            before, labels = labels, _label_pass(labels, flat, (rows, cols))
        if unsettled is not None:
            unsettled.append((before != labels).any())
        return torch.where(flat, labels.long(), -1).view(b, rows, cols)
    chunk = 1 if hostsync.reads_are_free(marked.device) else CHUNK
    while True:
        for _ in range(chunk):
            before, labels = labels, _label_pass(labels, flat, (rows, cols))
        if torch.equal(before, labels):  # the chunk's last pass changed nothing: the one read
            break
    return torch.where(flat, labels.long(), -1).view(b, rows, cols)


def block_islands(members: Tensor, start: Tensor, grid: tuple[int, int], passes: int | None = None,
                  unsettled: list[Tensor] | None = None) -> Tensor:
    """members [B, L] bool block offsets -> [B, L] int64 island label of each member, -1 for
    non-members (labels are raster indices, comparable within a row of the batch; an island's
    label is the raster index of its first member, so label - start is that member's offset)."""
    rows, cols = grid
    b, length = members.shape
    index = (start[:, None] + torch.arange(length, device=members.device)).clamp(max=rows * cols)
    board = torch.zeros(b, rows * cols + 1, dtype=torch.bool, device=members.device)
    board.scatter_(1, index, members)
    labels = label_islands(board[:, :-1].view(b, rows, cols), passes, unsettled).view(b, -1)
    labels = torch.cat([labels, torch.full((b, 1), -1, device=members.device, dtype=torch.long)], 1)
    return torch.where(members, labels.gather(1, index), -1)


def dense(steps: Tensor, bound: int | None = None) -> Tensor:
    """steps [B, L] int64 (-1 = none, all < bound; bound defaults to L) -> the same order with the
    empty step indices removed. Shapes depend on `bound` only, never on the values."""
    bound = steps.shape[1] if bound is None else bound
    used = torch.zeros(steps.shape[0], bound + 1, dtype=torch.long, device=steps.device)
    used.scatter_(1, (steps + 1).clamp_min(0), 1)  # column 0 collects the -1 entries
    used[:, 0] = 0
    rank = used.cumsum(1) - 1  # rank of step s is rank[s + 1]
    return torch.where(steps >= 0, rank.gather(1, steps + 1), -1)


def serial_steps(resample: Tensor) -> Tensor:
    """resample [B, L] bool -> steps [B, L]: the raster rank of each resampled offset, -1 elsewhere."""
    return torch.where(resample, resample.long().cumsum(1) - 1, -1)


def rank_in_group(key: Tensor, counted: Tensor) -> Tensor:
    """key [B, L] int64, counted [B, L] bool -> [B, L] int64: how many counted entries with the
    same key come before each entry (in offset order)."""
    order = key.argsort(dim=1, stable=True)  # groups contiguous, each in offset order
    grouped, flags = key.gather(1, order), counted.gather(1, order).long()
    before = flags.cumsum(1) - flags  # counted entries before, across groups
    opens = torch.ones_like(flags, dtype=torch.bool)
    opens[:, 1:] = grouped[:, 1:] != grouped[:, :-1]
    base = torch.where(opens, before, 0).cummax(1).values  # `before` at the group's first entry
    return torch.empty_like(before).scatter_(1, order, before - base)


def island_steps(resample: Tensor, first: Tensor, start: Tensor, grid: tuple[int, int],
                 window: int, passes: int | None = None,
                 unsettled: list[Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """The parallel schedule. resample [B, L] bool (R_X without t0), first [B] (t0; L = none),
    start [B] -> (steps [B, L] int64 dense, -1 elsewhere; island labels [B, L] of R_X with t0)."""
    rows, cols = grid
    length = resample.shape[1]
    offsets = torch.arange(length, device=resample.device)
    members = resample | (offsets[None] == first[:, None])
    labels = block_islands(members, start, grid, passes, unsettled)
    row, _ = block_coordinates(start, length, cols)
    top = labels.clamp_min(0) // cols  # an island's first row holds its label (smallest index)
    # k: rank within the island row among resampled positions, left to right (a block row's
    # offsets are in column order); the key (label, row) names the island row
    k = rank_in_group(torch.where(labels >= 0, labels * rows + row, -1), resample)
    # k < cols, so every window >= cols orders (j, k) lexicographically: the same dense steps as
    # w = min(window, cols). Then a raw step (row - top) * w + k, with top >= row(start) and
    # k <= col, is at most (row - row(start)) * cols + col = o + col(start) for offset o: below
    # L + cols, dense's static bound.
    steps = torch.where(resample, (row - top) * min(window, cols) + k, -1)
    return dense(steps, length + cols), labels
