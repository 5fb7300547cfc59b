"""Per-position rejection maps of drafting decoders: the stats column averaged into a [rows, cols]
heat map (the paper figures)."""
from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import pandas as pd

from harness.api import int_list


class HasStats(Protocol):
    def stats(self) -> pd.DataFrame: ...


def rejection_heatmap(samples: HasStats, grid: tuple[int, int] | None = None) -> np.ndarray:
    """Return the mean number of rejections per token position, [rows, cols] float64.

    Args:
        samples: a SampleSet whose stats carry `rejection_map` (space-separated ints, raster order).
        grid: (rows, cols) of the token grid; inferred when the map is square.
    """
    stats = samples.stats()
    maps = [int_list(v) for v in stats.get("rejection_map", pd.Series(dtype=object))]
    maps = [m for m in maps if m]
    if not maps:
        raise ValueError("no rejection maps in the stats; only drafting decoders record them")
    sizes = sorted({len(m) for m in maps})
    if len(sizes) > 1:
        raise ValueError(f"rejection maps have different sizes {sizes}; the set mixes token grids")
    size = sizes[0]
    if grid is None:
        side = math.isqrt(size)
        if side * side != size:
            raise ValueError(
                f"rejection maps have {size} positions, not a square; pass grid=(rows, cols)"
            )
        grid = (side, side)
    if grid[0] * grid[1] != size:
        raise ValueError(f"grid {grid} does not hold the {size} positions of the rejection maps")
    return np.asarray(maps, dtype=np.float64).mean(axis=0).reshape(grid)
