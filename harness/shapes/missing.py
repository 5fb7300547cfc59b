"""Missing objects on the shapes worlds: of the objects a caption asks for (its GenEval `include`
clauses), the share the shapes detector does not find in an image. A detection counts when its
score is above GenEval's 0.3 confidence threshold and its class matches (its colour too, where the
clause names one); a clause asking for n objects that finds m < n misses n - m."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from harness.shapes.detector import ShapesDetector

THRESHOLD = 0.3  # GenEval's confidence threshold (evaluators/geneval_rules.py)


def missing_objects(image: np.ndarray, meta: dict[str, Any], detector: ShapesDetector | None = None) -> tuple[int, int]:
    """uint8 image [H, W, 3] and a prompt's GenEval meta -> (objects missing, objects asked for)."""
    found = [d for d in (detector or ShapesDetector()).detect(image) if d.score > THRESHOLD]
    missing = asked = 0
    for clause in meta.get("include", []):
        count = int(clause.get("count", 1))
        color = clause.get("color")
        hits = sum(d.cls == clause["class"] and (color is None or d.color == color) for d in found)
        asked += count
        missing += max(0, count - hits)
    return missing, asked


def missing_rate(images: Sequence[np.ndarray], metas: Sequence[dict[str, Any]]) -> float:
    """Objects missing / objects asked for over the images (nan when nothing is asked for)."""
    detector = ShapesDetector()
    totals = np.array([missing_objects(i, m, detector) for i, m in zip(images, metas)], dtype=np.float64)
    asked = totals[:, 1].sum() if len(totals) else 0.0
    return float(totals[:, 0].sum() / asked) if asked else float("nan")
