"""Where a verification rejects drafts, read against what the draft shows: background cells, object
cells, and the top edges of objects (an object cell whose cell above is background: where raster
order meets the object first). Untimed; reads SampleSets that exist.

    python benchmarks/rejection_sites.py --draft DIR ROW_DIR [ROW_DIR ...]

--draft is the SampleSet of the up-sampled draft alone (MuLo-SD with accept.tau=0: nothing is
rejected, so its images are the drafts every other row verified; same prompts, seed and drafter),
each ROW_DIR a SampleSet of a drafting decoder (its stats carry the rejection maps). A cell is an
object cell when more than a quarter of its pixels differ from the image's most common colour (the
plain background of the shapes worlds) by more than 60 (sum over RGB). For each row it prints the
rejected cells per image and the share of each kind of cell that was rejected.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.api import int_list  # noqa: E402
from harness.store.summary import _markdown  # noqa: E402
from harness.store.samples import SampleSet  # noqa: E402

log = logging.getLogger("benchmarks.rejection_sites")
OBJECT_DISTANCE = 60  # RGB L1 distance from the background colour of an object pixel
OBJECT_SHARE = 0.25  # share of object pixels that makes a cell an object cell


def object_cells(image: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """image [H, W, 3] uint8 -> [rows, cols] bool: the cells that show an object (module docstring)."""
    rows, cols = grid
    h, w = image.shape[0] // rows, image.shape[1] // cols
    pixels = image[: rows * h, : cols * w].reshape(-1, 3)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    background = colours[counts.argmax()].astype(int)
    far = np.abs(image[: rows * h, : cols * w].astype(int) - background).sum(-1) > OBJECT_DISTANCE
    return far.reshape(rows, h, cols, w).mean((1, 3)) > OBJECT_SHARE


def top_edges(objects: np.ndarray) -> np.ndarray:
    """objects [rows, cols] bool -> the object cells whose cell above is background (or the border)."""
    above = np.zeros_like(objects)
    above[1:] = objects[:-1]
    return objects & ~above


def sites(draft: SampleSet, row: SampleSet) -> dict[str, float]:
    """Rejections of `row` per image and the rejected share of top-edge, other object and background
    cells of the drafts (draft's images), over the samples both sets hold."""
    stats = row.stats().set_index("sample_id")
    kinds = {"top edge": 0, "other object": 0, "background": 0}
    rejected = dict(kinds)
    images = 0
    for sample_id in sorted(set(stats.index) & set(draft.stats()["sample_id"])):
        flat = np.array(int_list(stats.at[sample_id, "rejection_map"]), dtype=np.int64)
        side = int(np.sqrt(flat.size))
        if side * side != flat.size:
            raise ValueError(f"{row.root}: rejection map of {sample_id} is not square ({flat.size} cells)")
        hit = flat.reshape(side, side) > 0
        objects = object_cells(draft.load_image(sample_id), (side, side))
        edge = top_edges(objects)
        for kind, cells in (("top edge", edge), ("other object", objects & ~edge), ("background", ~objects)):
            kinds[kind] += int(cells.sum())
            rejected[kind] += int((hit & cells).sum())
        images += 1
    if not images:
        raise ValueError(f"{row.root} and {draft.root} hold no sample in common")
    out = {"images": float(images), "rejected / image": sum(rejected.values()) / images}
    for kind in kinds:
        out[f"cells: {kind}"] = kinds[kind] / (images * side * side)
        out[f"rejected: {kind}"] = rejected[kind] / max(kinds[kind], 1)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", type=Path, required=True, help="SampleSet of the draft alone (accept.tau=0)")
    ap.add_argument("rows", type=Path, nargs="+", help="SampleSets of drafting decoders")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for path in (a.draft, *a.rows):
        if not (path / "stats.csv").is_file():
            ap.error(f"{path} is not a consolidated SampleSet (no stats.csv); run its evaluation first")
    draft = SampleSet(a.draft)
    table = []
    for path in a.rows:
        s = sites(draft, SampleSet(path))
        table.append([path.name, f"{s['images']:.0f}", f"{s['rejected / image']:.1f}",
                      *(f"{s['rejected: ' + k]:.3f} ({s['cells: ' + k]:.3f})"
                        for k in ("top edge", "other object", "background"))])
    print(_markdown(["row", "images", "rejected cells / image", "top edges rejected (share of cells)",
                     "other object cells", "background cells"], table, 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
