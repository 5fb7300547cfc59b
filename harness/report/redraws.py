"""MuLo-SD's redraw records read back from a SampleSet (baselines/framework/redraw.py writes them):
per image t0, the redraw region, the changed cells, the draft and the one-pass tau curve, and the
per-row region figures the report shows.

Region figures, per image and then averaged over the set:
    share_redrawn  redrawn cells / all cells;
    regions        8-connected components of the redraw region (what the parallel resampler
                   calls islands);
    seam_length    cell edges (4-neighbour pairs) between a redrawn cell and a kept one: where
                   content the target drew meets content it did not see (a drawn region's
                   boundary, in cell sides).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd
from scipy import ndimage

from harness.api import int_list
from harness.store.packed import unpack_tokens

_EIGHT = np.ones((3, 3), dtype=bool)
REDRAW_COLUMNS = ("first_rejection", "redraw_map", "draft_tokens")


class HasStats(Protocol):
    def stats(self) -> pd.DataFrame: ...


@dataclass(frozen=True)
class Redraw:
    """One image's record: maps [rows, cols] (bool), draft [rows, cols] int64, t0 (N: none)."""

    sample_id: str
    first_rejection: int
    rejected: np.ndarray
    redrawn: np.ndarray
    changed: np.ndarray | None
    draft: np.ndarray


def _grid(size: int, grid: tuple[int, int] | None) -> tuple[int, int]:
    if grid is not None:
        if grid[0] * grid[1] != size:
            raise ValueError(f"grid {grid} does not hold the {size} positions of the redraw maps")
        return grid
    side = math.isqrt(size)
    if side * side != size:
        raise ValueError(f"redraw maps have {size} positions, not a square; pass grid=(rows, cols)")
    return side, side


def _bool_map(value: Any, grid: tuple[int, int]) -> np.ndarray:
    return np.asarray(int_list(value), dtype=np.int64).reshape(grid) > 0


def redraws(samples: HasStats, grid: tuple[int, int] | None = None) -> list[Redraw]:
    """Every image's redraw record, in sample_id order; ValueError when the set has none (only
    MuLo-SD's local scope records them)."""
    stats = samples.stats()
    if any(c not in stats.columns for c in REDRAW_COLUMNS) or stats.empty:
        raise ValueError("no redraw records in the stats; only MuLo-SD (the local scope) records them")
    out = []
    for row in stats.to_dict("records"):
        if not isinstance(row.get("draft_tokens"), str):
            continue
        draft = unpack_tokens(row["draft_tokens"])
        shape = _grid(draft.size, grid)
        changed = row.get("changed_map")
        out.append(Redraw(sample_id=row["sample_id"], first_rejection=int(row["first_rejection"]),
                          rejected=_bool_map(row["rejection_map"], shape), redrawn=_bool_map(row["redraw_map"], shape),
                          changed=_bool_map(changed, shape) if isinstance(changed, str) else None,
                          draft=draft.reshape(shape)))
    if not out:
        raise ValueError("no redraw records in the stats; only MuLo-SD (the local scope) records them")
    return out


def seam_length(region: np.ndarray) -> int:
    """Cell edges between a cell of `region` [rows, cols] bool and a cell outside it."""
    return int((region[1:] != region[:-1]).sum() + (region[:, 1:] != region[:, :-1]).sum())


def region_figures(records: list[Redraw]) -> dict[str, float]:
    """Mean share_redrawn, regions and seam_length over the images (module docstring), and the
    mean share of cells changed where recorded."""
    shares = [r.redrawn.mean() for r in records]
    regions = [ndimage.label(r.redrawn, structure=_EIGHT)[1] for r in records]
    seams = [seam_length(r.redrawn) for r in records]
    out = {"images": float(len(records)), "share_redrawn": float(np.mean(shares)),
           "regions": float(np.mean(regions)), "seam_length": float(np.mean(seams))}
    changed = [r.changed.mean() for r in records if r.changed is not None]
    if changed:
        out["share_changed"] = float(np.mean(changed))
    return out


@dataclass(frozen=True)
class TauCurve:
    """Means over the images at each tau of the grid: rejected share, t0 / N, redrawn share and
    target forwards."""

    tau: np.ndarray
    rejected: np.ndarray
    first: np.ndarray
    redrawn: np.ndarray
    target_forwards: np.ndarray
    images: int


def tau_curve(samples: HasStats) -> TauCurve:
    """The one-pass tau curve of a SampleSet (baselines/framework/redraw.py); ValueError when it
    has none (only a whole-image MuLo-SD verification with the pooled-threshold rule records it)."""
    stats = samples.stats()
    if "tau_grid" not in stats.columns:
        raise ValueError("no tau curve in the stats; MuLo-SD records it with draft.rows=null, "
                         "scope.rounds=1 and accept.below=0")
    stats = stats[stats["tau_grid"].apply(lambda v: isinstance(v, str))]
    grids = {str(v) for v in stats["tau_grid"]}
    if len(grids) != 1:
        raise ValueError(f"the set's tau curves use {len(grids)} different grids")
    tau = np.array([float(t) for t in grids.pop().split()])
    cells = stats["tokens"].astype(float).to_numpy()[:, None]

    def mean(column: str, scale: np.ndarray | float = 1.0) -> np.ndarray:
        values = np.array([int_list(v) for v in stats[column]], dtype=np.float64)
        return (values / scale).mean(axis=0)

    return TauCurve(tau=tau, rejected=mean("tau_rejected", cells), first=mean("tau_first", cells),
                    redrawn=mean("tau_redrawn", cells), target_forwards=mean("tau_target_forwards"),
                    images=len(stats))


__all__ = ["Redraw", "TauCurve", "redraws", "region_figures", "seam_length", "tau_curve"]
