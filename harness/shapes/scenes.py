"""Scenes of the shapes world: flat-coloured shapes on a grey background, laid out to match a
GenEval-style caption, and their rendering at any resolution.

Coordinates are normalised to [0, 1] (x to the right, y downwards); a shape of `size` s occupies
the square box [cx - s/2, cx + s/2] x [cy - s/2, cy + s/2]. Rendering samples each pixel at its
centre (hard edges, no anti-aliasing), so one scene renders consistently at 32 and 64 pixels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.shapes.captions import COLOR_NAMES, SHAPES, TAGS, Meta, parse, prompt_set, sample_meta

__all__ = ["BACKGROUND", "COLORS", "SHAPES", "Scene", "Shape", "prompt_set", "render",
           "sample_scene", "scene_for_caption", "scene_for_text", "unit_mask"]

COLORS: dict[str, tuple[int, int, int]] = dict(zip(COLOR_NAMES, (
    (230, 25, 25),    # red
    (255, 140, 0),    # orange
    (250, 230, 20),   # yellow
    (30, 170, 50),    # green
    (30, 70, 230),    # blue
    (140, 40, 190),   # purple
    (255, 130, 200),  # pink
    (120, 70, 20),    # brown
    (10, 10, 10),     # black
    (250, 250, 250),  # white
), strict=True))
BACKGROUND = (150, 150, 150)

CROSS_ARM = 0.36      # arm width of a cross as a fraction of its size
MARGIN = 1.0 / 32     # free border inside the image (1 px at 32 px)
GAP = 0.07            # free space between the boxes of two shapes (>2 px at 32 px)
SIZE_RANGE = {1: (0.26, 0.40), 2: (0.24, 0.38), 3: (0.22, 0.32), 4: (0.22, 0.30)}
POSITION_CLEARANCE = 0.75  # GenEval's normalised revised offset must exceed this (rule: 0.5)
_TRIES = 50     # positions tried per shape
_RESTARTS = 100  # fresh layouts tried per scene


@dataclass(frozen=True)
class Shape:
    """One shape: `kind` in SHAPES, `color` in COLORS, centre (cx, cy) and size (side/diameter),
    all as fractions of the image width."""

    kind: str
    color: str
    cx: float
    cy: float
    size: float

    @property
    def box(self) -> tuple[float, float, float, float]:
        """Normalised (x1, y1, x2, y2)."""
        h = self.size / 2
        return (self.cx - h, self.cy - h, self.cx + h, self.cy + h)


@dataclass(frozen=True)
class Scene:
    """Shapes plus the caption they depict and its GenEval metadata (evaluation_metadata schema)."""

    shapes: tuple[Shape, ...]
    caption: str
    meta: dict[str, Any] = field(hash=False)


def unit_mask(kind: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Membership of points at offsets (u, v) from a shape's centre, in units of its size
    (the shape fills [-0.5, 0.5]^2; v grows downwards) -> bool array of the broadcast shape."""
    if kind == "circle":
        return u * u + v * v <= 0.25
    if kind == "square":
        return (np.abs(u) <= 0.5) & (np.abs(v) <= 0.5)
    if kind == "triangle":  # apex up, base at the bottom of the box
        return (v <= 0.5) & (np.abs(u) <= (v + 0.5) / 2)
    if kind == "cross":
        arm = CROSS_ARM / 2
        return (((np.abs(u) <= 0.5) & (np.abs(v) <= arm))
                | ((np.abs(v) <= 0.5) & (np.abs(u) <= arm)))
    raise ValueError(f"unknown shape kind {kind!r}; expected one of {SHAPES}")


def render(scene: Scene, size: int) -> np.ndarray:
    """Scene -> uint8 image [size, size, 3] with flat colours and hard edges."""
    if size < 8:
        raise ValueError(f"render size must be >= 8 pixels, got {size}")
    centres = (np.arange(size) + 0.5) / size
    u, v = centres[None, :], centres[:, None]
    image = np.empty((size, size, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    for shape in scene.shapes:
        if shape.color not in COLORS:
            raise ValueError(f"unknown colour {shape.color!r}; expected one of {COLOR_NAMES}")
        inside = unit_mask(shape.kind, (u - shape.cx) / shape.size, (v - shape.cy) / shape.size)
        image[inside] = COLORS[shape.color]
    return image


def _random_box(size: float, rng: np.random.Generator) -> tuple[float, float]:
    low, high = MARGIN + size / 2, 1 - MARGIN - size / 2
    return float(rng.uniform(low, high)), float(rng.uniform(low, high))


def _apart(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
    """Boxes (cx, cy, size) separated by at least GAP along x or along y."""
    reach = (a[2] + b[2]) / 2 + GAP
    return abs(a[0] - b[0]) >= reach or abs(a[1] - b[1]) >= reach


def _relation_clear(subject: tuple[float, float, float], target: tuple[float, float, float],
                    relation: str) -> bool:
    """GenEval's relative_position holds with a margin: normalised revised offset along the
    relation's axis beyond POSITION_CLEARANCE (rule: 0.5), the other axis below 0.4."""
    offset = np.array([subject[0] - target[0], subject[1] - target[1]])
    extent = subject[2] + target[2]
    revised = np.maximum(np.abs(offset) - 0.1 * extent, 0) * np.sign(offset)
    dx, dy = revised / max(float(np.linalg.norm(offset)), 1e-9)
    along, across = {"left of": (-dx, dy), "right of": (dx, dy),
                     "above": (-dy, dx), "below": (dy, dx)}[relation]
    return along > POSITION_CLEARANCE and abs(across) < 0.4


def _fits(box: tuple[float, float, float], placed: list[tuple[float, float, float]],
          relation: str | None) -> bool:
    if not all(_apart(box, other) for other in placed):
        return False
    # box 1 is the target of the relation of box 0
    return relation is None or len(placed) != 1 or _relation_clear(placed[0], box, relation)


def _layout(n: int, rng: np.random.Generator, relation: str | None) -> list[tuple[float, float, float]]:
    """n non-touching boxes (cx, cy, size), placed one by one (up to _TRIES positions each,
    restarting with new sizes when stuck); with `relation`, box 0 stands in it to box 1."""
    low, high = SIZE_RANGE[n]
    for _ in range(_RESTARTS):
        boxes: list[tuple[float, float, float]] = []
        for size in rng.uniform(low, high, size=n):
            for _ in range(_TRIES):
                box = (*_random_box(float(size), rng), float(size))
                if _fits(box, boxes, relation):
                    boxes.append(box)
                    break
            else:
                break
        if len(boxes) == n:
            return boxes
    raise RuntimeError(f"could not lay out {n} shapes (relation {relation!r}) in {_RESTARTS} "
                       f"restarts; reduce SIZE_RANGE or GAP")


def _colors_for(groups: list[dict[str, Any]], rng: np.random.Generator) -> list[str]:
    return [g.get("color") or COLOR_NAMES[int(rng.integers(len(COLOR_NAMES)))] for g in groups]


def _raster_first(box: tuple[float, float, float]) -> tuple[float, float]:
    """Sort key of a box (cx, cy, size): its top edge, then its left edge (raster reading order)."""
    return (box[1] - box[2] / 2, box[0] - box[2] / 2)


def scene_for_caption(meta: Meta, rng: np.random.Generator, named_order: bool = False) -> Scene:
    """Lay out a scene depicting GenEval metadata `meta` (as produced by `parse`/`sample_meta`):
    exactly the objects of its include groups, other attributes drawn from `rng`.

    `named_order`: the objects of two_object and color_attr captions appear in raster order (top
    edge first, then left edge) in the order the caption names them, so a raster model meets the
    first-named object first. Position captions keep their relation; the draws from `rng` are the
    same either way."""
    tag = meta["tag"]
    if tag not in TAGS:
        raise ValueError(f"unknown GenEval tag {tag!r} in metadata; expected one of {TAGS}")
    groups = [g for g in meta["include"] for _ in range(g["count"])]
    relation = None
    if tag == "position":
        target, subject = meta["include"]
        relation = subject["position"][0]
        groups = [subject, target]
    if len(groups) not in SIZE_RANGE:
        raise ValueError(f"metadata {meta['prompt']!r} asks for {len(groups)} shapes; the shapes "
                         f"world lays out {min(SIZE_RANGE)} to {max(SIZE_RANGE)}")
    colors = _colors_for(groups, rng)
    boxes = _layout(len(groups), rng, relation)
    if named_order and tag in ("two_object", "color_attr"):
        boxes = sorted(boxes, key=_raster_first)
    shapes = tuple(Shape(g["class"], c, cx, cy, s)
                   for g, c, (cx, cy, s) in zip(groups, colors, boxes, strict=True))
    return Scene(shapes=shapes, caption=meta["prompt"], meta=meta)


def sample_scene(rng: np.random.Generator, tags: tuple[str, ...] = TAGS, named_order: bool = False) -> Scene:
    """A random scene: tag uniform over `tags` (default GenEval's six), caption uniform in the
    grammar for that tag, then a layout consistent with it. Deterministic given the generator
    state."""
    unknown = set(tags) - set(TAGS)
    if not tags or unknown:
        raise ValueError(f"tags must be a non-empty subset of {TAGS}, got {tags}")
    tag = tags[int(rng.integers(len(tags)))]
    return scene_for_caption(sample_meta(tag, rng), rng, named_order)


def scene_for_text(caption: str, rng: np.random.Generator) -> Scene:
    """Lay out a scene for a caption string of the grammar (metadata from `parse`)."""
    return scene_for_caption(parse(caption), rng)
