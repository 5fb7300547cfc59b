"""A detector for the shapes world, standing in for GenEval's Mask2Former + CLIP colour classifier.

1. Colour segmentation: every pixel takes the nearest palette colour (the ten GenEval colours and
   the background grey), which tolerates the colour drift of VQ reconstructions and model samples.
2. Connected components per colour (8-connectivity); blobs below `min_area` are dropped.
3. Shape classification by template fitting: each unit shape (scenes.unit_mask) is stretched to the
   blob's bounding box, at a few sub-pixel shifts and sizes, and compared by soft IoU with the
   blob's colour coverage (blended edge pixels count in part); the best kind wins. score = how well the best template fits (1 for a clean render, falling to 0
   at `iou_floor`), scaled down when the runner-up fits nearly as well and when the blob's box is
   far from square (aspect ratio below 0.75).
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from harness.api import Detection
from harness.shapes.scenes import BACKGROUND, COLORS, SHAPES, unit_mask

log = logging.getLogger(__name__)

_PALETTE_NAMES = ("background", *COLORS)
_PALETTE = np.array([BACKGROUND, *COLORS.values()], dtype=np.float32)  # [11, 3]
_EIGHT = np.ones((3, 3), dtype=bool)
# Sub-pixel shifts of the template and changes of its width/height (pixels) tried per blob.
_SHIFTS = (-0.25, 0.0, 0.25)
_SCALES = (-0.5, 0.0, 0.5, 1.0)
PAD = 1  # pixels of context around a blob's box in which partial coverage counts


def palette_labels(image: np.ndarray) -> np.ndarray:
    """uint8 image [H, W, 3] -> palette index [H, W] (0 = background, i = i-th colour of COLORS)."""
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"detector expects an RGB image [H, W, 3], got shape {image.shape}")
    pixels = image.astype(np.float32)
    dist = ((pixels[:, :, None, :] - _PALETTE[None, None]) ** 2).sum(-1)  # [H, W, 11]
    return dist.argmin(-1)


def coverage(pixels: np.ndarray, color: np.ndarray) -> np.ndarray:
    """How much of `color` each pixel holds on the background: the pixel's position along the
    segment background -> colour, clipped to [0, 1], and 0 where the pixel lies far off that
    segment (another hue). pixels float [..., 3], color [3] -> float [...]."""
    axis = color - _PALETTE[0]
    rel = pixels - _PALETTE[0]
    t = (rel @ axis) / float(axis @ axis)
    off = np.linalg.norm(rel - t[..., None] * axis, axis=-1)
    return np.where(off < 0.5 * np.linalg.norm(axis), np.clip(t, 0.0, 1.0), 0.0)


def _offsets(n: int, pad: int) -> np.ndarray:
    """Pixel centres of a box of n pixels padded by `pad` on both sides, relative to the box's
    middle -> [n + 2 * pad]."""
    return np.arange(n + 2 * pad, dtype=np.float64) + 0.5 - pad - n / 2


# Every (x shift, y shift, x growth, y growth) combination tried: [K, 4].
_VARIANTS = np.array(list(itertools.product(_SHIFTS, _SHIFTS, _SCALES, _SCALES)), dtype=np.float64)


def template_iou(alpha: np.ndarray, height: int, width: int, kind: str) -> float:
    """Best soft IoU between a coverage map and shape `kind` fitted to a box.

    alpha: float [height + 2*PAD, width + 2*PAD], the blob's box of height x width pixels padded
    by PAD; the template is stretched to the box at the shifts and growths of _VARIANTS.
    """
    shift_x, shift_y, grow_x, grow_y = (_VARIANTS[:, i, None, None] for i in range(4))  # [K, 1, 1]
    u = (_offsets(width, PAD)[None, None, :] - shift_x) / (width + grow_x)  # [K, 1, W']
    v = (_offsets(height, PAD)[None, :, None] - shift_y) / (height + grow_y)  # [K, H', 1]
    templates = unit_mask(kind, u, v)  # [K, H', W']
    inter = (templates * alpha[None]).sum(axis=(1, 2))
    union = templates.sum(axis=(1, 2)) + alpha.sum() - inter
    return float((inter / union).max())


@dataclass
class ShapesDetector:
    """Colour segmentation + connected components + template fitting.

    min_area: fraction of the image area below which a blob is noise (0.004 = 4 px at 32 px).
    iou_floor: template IoU at which the score reaches 0; iou_full: IoU from which it is 1.
    """

    min_area: float = 0.004
    iou_floor: float = 0.45
    iou_full: float = 0.8

    def classify(self, alpha: np.ndarray, height: int, width: int) -> tuple[str, float]:
        """Padded coverage map of a blob (see template_iou) and its box size in pixels ->
        (shape kind, score in [0, 1])."""
        ious = sorted(((template_iou(alpha, height, width, kind), kind) for kind in SHAPES),
                      reverse=True)
        (best, kind), (second, _) = ious[0], ious[1]
        fit = np.clip((best - self.iou_floor) / (self.iou_full - self.iou_floor), 0.0, 1.0)
        # A runner-up within 0.05 IoU makes the call a coin flip: halve the score at a tie.
        margin = np.clip((best - second) / 0.05, 0.0, 1.0)
        # Shapes of the world have square boxes; a flattened blob (box aspect <= 0.4) is no shape.
        aspect = min(height, width) / max(height, width)
        squareness = np.clip((aspect - 0.4) / 0.35, 0.0, 1.0)
        return kind, float(fit * (0.5 + 0.5 * margin) * squareness)

    def detect(self, image: np.ndarray) -> list[Detection]:
        """uint8 image [H, W, 3] -> detections (box in pixel edges x1, y1, x2, y2; mask [H, W])."""
        labels = palette_labels(image)
        height, width = labels.shape
        padded = np.pad(image.astype(np.float32), ((PAD, PAD), (PAD, PAD), (0, 0)), mode="edge")
        min_pixels = max(3, int(round(self.min_area * height * width)))
        detections: list[Detection] = []
        for index in range(1, len(_PALETTE_NAMES)):
            components, count = ndimage.label(labels == index, structure=_EIGHT)
            if count == 0:
                continue
            comps = np.pad(components, PAD)
            for comp, (ys, xs) in enumerate(ndimage.find_objects(components), start=1):
                own = components[ys, xs] == comp
                if own.sum() < min_pixels:
                    continue
                # The box padded by PAD, in padded-image coordinates (= original + PAD - PAD).
                region = (slice(ys.start, ys.stop + 2 * PAD), slice(xs.start, xs.stop + 2 * PAD))
                alpha = coverage(padded[region], _PALETTE[index])
                ids = comps[region]
                alpha[ids == comp] = 1.0
                alpha[(ids != comp) & (ids != 0)] = 0.0  # another shape of the same colour
                kind, score = self.classify(alpha, ys.stop - ys.start, xs.stop - xs.start)
                mask = np.zeros((height, width), dtype=bool)
                mask[ys, xs] = own
                detections.append(Detection(
                    cls=kind, score=score, mask=mask, color=_PALETTE_NAMES[index],
                    box=(float(xs.start), float(ys.start), float(xs.stop), float(ys.stop))))
        log.debug("shapes detector: %d blobs in a %dx%d image", len(detections), height, width)
        return detections
