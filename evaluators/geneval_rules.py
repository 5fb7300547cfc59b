"""GenEval's rule engine (djghosh13/geneval, evaluation/evaluate_images.py and summary_scores.py),
independent of the detector and the colour classifier that feed it.

Per image: detections are filtered by confidence (strictly above `threshold`, or
`counting_threshold` for every class when the tag is "counting"), sorted by score, capped to
`max_objects` per class, optionally de-duplicated (`max_overlap` < 1); then every `include` group
must be met (count reached; colour and position judged on the top-`count` objects only) and no
`exclude` group may reach its count. Scores: accuracy per tag over images, overall = the
unweighted mean of the tag accuracies.

Float32 parity: the official code works on mmdet's float32 result arrays under numpy 1.23.1 (its
environment.yml), so scores are compared with float32 thresholds, detections are ordered by numpy
1.23's own argsort of the float32 scores (`_numpy123_argsort`), and box arithmetic is float32 where
numpy 1.23 keeps it float32 (see `box_iou`, `GenEvalRules.relative_position`). Detections arriving as
Python floats are rounded to float32 at those points.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from harness.api import Box, Detection, metric_rows
from harness.store.summary import paired_difference  # noqa: F401  (GenEval's paired gap; re-exported)

log = logging.getLogger(__name__)

GENEVAL_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
RELATIONS = ("left of", "right of", "above", "below")


def box_iou(a: Box, b: Box) -> float:
    """IoU of two pixel boxes with GenEval's inclusive (+1) convention, as `compute_iou` computes it on
    mmdet's float32 rows under numpy 1.23: each side x2 - x1 is a float32 difference, while the + 1 and
    everything after it are float64 (numpy 1.x promotes float32 scalar + Python int to float64)."""
    a32, b32 = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)

    def area(x1: np.float32, y1: np.float32, x2: np.float32, y2: np.float32) -> float:
        return max(float(x2 - x1) + 1, 0) * max(float(y2 - y1) + 1, 0)
    inter = area(max(a32[0], b32[0]), max(a32[1], b32[1]), min(a32[2], b32[2]), min(a32[3], b32[3]))
    union = area(*a32[:4]) + area(*b32[:4]) - inter
    return inter / union if union else 0.0


# numpy 1.23's npysort quicksort.cpp: partitions of at most SMALL_QUICKSORT + 1 items are insertion-sorted
_SMALL_QUICKSORT = 15


def _less(x: float, y: float) -> bool:
    """numpy's sort order for floats: NaN after every number."""
    return x < y or (y != y and x == x)


def _heap_argsort(v: Sequence[float], idx: list[int], lo: int, n: int) -> None:
    """numpy's aheapsort_ on idx[lo:lo + n], in place (heap slots 1..n map to idx[lo - 1 + k])."""
    base = lo - 1

    def sift(i: int, item: int, size: int) -> None:
        j = 2 * i
        while j <= size:
            if j < size and _less(v[idx[base + j]], v[idx[base + j + 1]]):
                j += 1
            if not _less(v[item], v[idx[base + j]]):
                break
            idx[base + i] = idx[base + j]
            i, j = j, 2 * j
        idx[base + i] = item

    for top in range(n >> 1, 0, -1):
        sift(top, idx[base + top], n)
    while n > 1:
        item = idx[base + n]
        idx[base + n] = idx[base + 1]
        n -= 1
        sift(1, item, n)


def _insertion_argsort(v: Sequence[float], idx: list[int], pl: int, pr: int) -> None:
    """Stable insertion sort of idx[pl..pr] (numpy's small-partition sort)."""
    for pi in range(pl + 1, pr + 1):
        item = idx[pi]
        pj = pi
        while pj > pl and _less(v[item], v[idx[pj - 1]]):
            idx[pj] = idx[pj - 1]
            pj -= 1
        idx[pj] = item


def _partition(v: Sequence[float], idx: list[int], pl: int, pr: int) -> int:
    """numpy's median-of-3 quicksort partition of idx[pl..pr]; returns the pivot's final slot."""
    pm = pl + ((pr - pl) >> 1)
    if _less(v[idx[pm]], v[idx[pl]]):
        idx[pm], idx[pl] = idx[pl], idx[pm]
    if _less(v[idx[pr]], v[idx[pm]]):
        idx[pr], idx[pm] = idx[pm], idx[pr]
    if _less(v[idx[pm]], v[idx[pl]]):
        idx[pm], idx[pl] = idx[pl], idx[pm]
    pivot = v[idx[pm]]
    pi, pj = pl, pr - 1
    idx[pm], idx[pj] = idx[pj], idx[pm]
    while True:
        pi += 1
        while _less(v[idx[pi]], pivot):
            pi += 1
        pj -= 1
        while _less(pivot, v[idx[pj]]):
            pj -= 1
        if pi >= pj:
            break
        idx[pi], idx[pj] = idx[pj], idx[pi]
    idx[pi], idx[pr - 1] = idx[pr - 1], idx[pi]
    return pi


def _numpy123_argsort(values: Sequence[float]) -> list[int]:
    """`np.argsort(values)` (default kind "quicksort") exactly as numpy 1.23 orders it, ties included.

    numpy 1.23's argsort is an introsort (aquicksort_ in npysort/quicksort.cpp): median-of-3 partitions,
    the larger side pushed on a stack, insertion sort below 17 items, heapsort once the depth budget
    2 * floor(log2(n)) is spent. It is stable for up to 16 items only. numpy >= 1.25 dispatches argsort
    to SIMD code on some CPUs, whose tie order differs, so calling np.argsort here would not match.
    """
    idx = list(range(len(values)))
    stack: list[tuple[int, int, int]] = []
    pl, pr = 0, len(values) - 1
    depth = 2 * max(len(values).bit_length() - 1, 0)
    while True:
        if depth < 0:
            _heap_argsort(values, idx, pl, pr - pl + 1)
        else:
            while pr - pl > _SMALL_QUICKSORT:
                pi = _partition(values, idx, pl, pr)
                depth -= 1
                if pi - pl < pr - pi:  # keep the smaller side, stack the larger
                    stack.append((pi + 1, pr, depth))
                    pr = pi - 1
                else:
                    stack.append((pl, pi - 1, depth))
                    pl = pi + 1
            _insertion_argsort(values, idx, pl, pr)
        if not stack:
            return idx
        pl, pr, depth = stack.pop()


def _ranked(scores: np.ndarray) -> list[int]:
    """Official order of one class's detections: `np.argsort(scores)[::-1]` on the float32 scores, so
    of tied scores the later detection comes first (for up to 16 detections)."""
    return _numpy123_argsort([float(x) for x in scores])[::-1]


@dataclass(frozen=True)
class GenEvalRules:
    """The official options (`--options key=value` of evaluate_images.py) and their defaults."""

    threshold: float = 0.3
    counting_threshold: float = 0.9
    max_objects: int = 16
    max_overlap: float = 1.0
    position_threshold: float = 0.1

    def select(self, detections: Iterable[Detection], tag: str) -> dict[str, list[Detection]]:
        """Detections -> per class, the kept ones in the official order (descending float32 score).

        As evaluate_image: per class (detections in input order = mmdet's per-class rows), rank all of
        them by `np.argsort(scores)[::-1]`, keep those with float32 score > float32 threshold, cap to
        max_objects, then greedy suppression by IoU >= max_overlap unless max_overlap == 1.
        """
        # a float32 array compared with a Python float: numpy compares in float32
        cutoff = np.float32(self.counting_threshold if tag == "counting" else self.threshold)
        by_class: dict[str, list[Detection]] = {}
        for det in detections:
            by_class.setdefault(det.cls, []).append(det)
        kept: dict[str, list[Detection]] = {}
        for cls, dets in by_class.items():
            scores = np.asarray([d.score for d in dets], dtype=np.float32)
            queue = [i for i in _ranked(scores) if scores[i] > cutoff][: self.max_objects]
            chosen: list[Detection] = []
            while queue:
                best = dets[queue.pop(0)]
                chosen.append(best)
                queue = [i for i in queue
                         if self.max_overlap == 1 or box_iou(best.box, dets[i].box) < self.max_overlap]
            if chosen:
                kept[cls] = chosen
        return kept

    def relative_position(self, a: Detection, b: Detection) -> set[str]:
        """Relations of A to B ("left of", "right of", "above", "below"; image y downwards).

        Centre offset per axis, shrunk towards 0 by position_threshold x (sum of the two box
        extents along that axis), normalised by the raw offset's length; a relation holds when its
        component passes 0.5. Both shrunk components < 1e-3 -> no relation (empty set).
        All in float32, as the official code runs it on mmdet's float32 boxes.
        """
        boxes = np.asarray([a.box[:4], b.box[:4]], dtype=np.float32).reshape(2, 2, 2)  # [obj, corner, xy]
        centre_a, centre_b = boxes.mean(axis=-2)  # float32: (x1 + x2) rounded to float32, halved
        extent_a, extent_b = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
        offset = centre_a - centre_b
        # numpy casts the Python-float threshold to float32 against a float32 array
        shrink = np.float32(self.position_threshold) * (extent_a + extent_b)
        revised = np.maximum(np.abs(offset) - shrink, np.float32(0)) * np.sign(offset)
        if np.all(np.abs(revised) < np.float32(1e-3)):
            return set()
        dx, dy = revised / np.linalg.norm(offset)  # float32 norm and quotient
        found = {"left of": dx < -0.5, "right of": dx > 0.5, "above": dy < -0.5, "below": dy > 0.5}
        return {rel for rel, holds in found.items() if holds}

    def judge(self, objects: dict[str, list[Detection]], meta: dict[str, Any]) -> tuple[bool, str]:
        """Apply `meta`'s include/exclude clauses to selected objects (output of `select`).

        Returns (correct, reason); reason lists every failed clause, one per line ("" if correct).
        """
        correct = True
        reasons: list[str] = []
        groups: list[list[Detection] | None] = []
        for req in meta.get("include", []):
            ok, found, why = self._check_include(req, objects, groups)
            groups.append(found if ok else None)
            if not ok:
                correct = False
                reasons.append(why)
        for req in meta.get("exclude", []):
            n = len(objects.get(req["class"], []))
            if n >= req["count"]:
                correct = False
                reasons.append(f"expected {req['class']}<{req['count']}, found {n}")
        return correct, "\n".join(reasons)

    def _check_include(self, req: dict[str, Any], objects: dict[str, list[Detection]],
                       groups: list[list[Detection] | None]) -> tuple[bool, list[Detection], str]:
        cls, count = req["class"], req["count"]
        found = objects.get(cls, [])[:count]
        if len(found) < count:
            return False, found, f"expected {cls}>={count}, found {len(found)}"
        if "color" in req:
            colors = [_color_of(d) for d in found]
            hits = colors.count(req["color"])
            if hits < count:
                seen = ", ".join(f"{colors.count(c)} {c}" for c in GENEVAL_COLORS if c in colors)
                return False, found, f"expected {req['color']} {cls}>={count}, found {hits} {req['color']}; and {seen}"
        if "position" in req:
            relation, target_index = req["position"]
            if target_index >= len(groups):
                raise ValueError(f"include group {cls!r} refers to group {target_index}, which is not "
                                 f"an earlier include group; fix the prompt metadata")
            targets = groups[target_index]
            if targets is None:
                return False, found, f"no target for {cls} to be {relation}"
            for obj in found:
                for target in targets:
                    rels = self.relative_position(obj, target)
                    if relation not in rels:
                        return False, found, f"expected {cls} {relation} target, found {' and '.join(sorted(rels))} target"
        return True, found, ""

    def evaluate(self, detections: Iterable[Detection], meta: dict[str, Any]) -> tuple[bool, str]:
        """One image: raw detections + its GenEval metadata -> (correct, reason)."""
        return self.judge(self.select(detections, meta["tag"]), meta)


def _color_of(det: Detection) -> str:
    if det.color is None:
        raise ValueError(f"detection of {det.cls!r} at {det.box} has no colour but the prompt asks "
                         f"for one; run a colour classifier or use a detector that fills Detection.color")
    return det.color


def _stderr(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else float("nan")


def summarize(per_image: pd.DataFrame, metric: str = "geneval",
              prompt_column: str | None = "prompt_id") -> pd.DataFrame:
    """Per-image results (columns `tag`, `correct`, optional `prompt_column`) -> summary frame
    (harness.api.METRIC_COLUMNS).

    Rows: `metric` per tag (accuracy over that tag's images, tags in order of first appearance),
    `metric`/"all" = unweighted mean of the tag accuracies (GenEval's overall score),
    `<metric>_images`/"all" = fraction of correct images and, when `prompt_column` is present,
    `<metric>_prompts`/"all" = fraction of prompts with at least one correct image.
    """
    missing = [c for c in ("tag", "correct") if c not in per_image.columns]
    if missing:
        raise ValueError(f"GenEval summary needs per-image columns {missing}; pass the per-sample frame "
                         f"with one row per image")
    if per_image.empty:
        raise ValueError("GenEval summary got no images; check that samples were generated")
    correct = per_image["correct"].astype(bool)
    rows: list[dict[str, Any]] = []
    tag_acc: list[float] = []
    tag_se: list[float] = []
    for tag, hits in correct.groupby(per_image["tag"], sort=False):
        acc, n = float(hits.mean()), int(len(hits))
        tag_acc.append(acc)
        tag_se.append(_stderr(acc, n))
        rows.append({"metric": metric, "subset": str(tag), "value": acc, "stderr": tag_se[-1], "n": n})
    overall_se = math.sqrt(sum(s * s for s in tag_se)) / len(tag_se)
    rows.append({"metric": metric, "subset": "all", "value": float(np.mean(tag_acc)),
                 "stderr": overall_se, "n": int(len(per_image))})
    frac = float(correct.mean())
    rows.append({"metric": f"{metric}_images", "subset": "all", "value": frac,
                 "stderr": _stderr(frac, len(correct)), "n": int(len(correct))})
    if prompt_column is not None and prompt_column in per_image.columns:
        any_ok = correct.groupby(per_image[prompt_column], sort=False).any()
        frac = float(any_ok.mean())
        rows.append({"metric": f"{metric}_prompts", "subset": "all", "value": frac,
                     "stderr": _stderr(frac, len(any_ok)), "n": int(len(any_ok))})
    return metric_rows(rows)


def tag_accuracies(tags: Sequence[str], correct: Sequence[bool]) -> dict[str, float]:
    """Accuracy per tag (first-appearance order) plus "overall" = unweighted mean over tags."""
    frame = pd.DataFrame({"tag": list(tags), "correct": list(correct)})
    summary = summarize(frame, prompt_column=None)
    rows = summary[summary["metric"] == "geneval"]
    out = {("overall" if s == "all" else s): float(v) for s, v in zip(rows["subset"], rows["value"])}
    return out
