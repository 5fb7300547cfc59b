"""GenEval's rule engine (djghosh13/geneval, evaluation/evaluate_images.py and summary_scores.py),
independent of the detector and the colour classifier that feed it.

Per image: detections are filtered by confidence (strictly above `threshold`, or
`counting_threshold` for every class when the tag is "counting"), sorted by score, capped to
`max_objects` per class, optionally de-duplicated (`max_overlap` < 1); then every `include` group
must be met (count reached; colour and position judged on the top-`count` objects only) and no
`exclude` group may reach its count. Scores: accuracy per tag over images, overall = the
unweighted mean of the tag accuracies.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from harness.api import metric_rows

log = logging.getLogger(__name__)

GENEVAL_COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
RELATIONS = ("left of", "right of", "above", "below")

Box = tuple[float, float, float, float]


@dataclass
class Detection:
    """One detected object. `box` = (x1, y1, x2, y2) in pixels; `mask` bool [H, W] or None;
    `color` one of GENEVAL_COLORS (filled by the detector or a colour classifier) or None."""

    cls: str
    box: Box
    score: float
    mask: np.ndarray | None = None
    color: str | None = None


def box_iou(a: Box, b: Box) -> float:
    """IoU of two pixel boxes with GenEval's inclusive (+1) convention."""
    def area(x1: float, y1: float, x2: float, y2: float) -> float:
        return max(x2 - x1 + 1, 0) * max(y2 - y1 + 1, 0)
    inter = area(max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))
    union = area(*a) + area(*b) - inter
    return inter / union if union else 0.0


@dataclass(frozen=True)
class GenEvalRules:
    """The official options (`--options key=value` of evaluate_images.py) and their defaults."""

    threshold: float = 0.3
    counting_threshold: float = 0.9
    max_objects: int = 16
    max_overlap: float = 1.0
    position_threshold: float = 0.1

    def select(self, detections: Iterable[Detection], tag: str) -> dict[str, list[Detection]]:
        """Detections -> per class, the kept ones sorted by descending score."""
        cutoff = self.counting_threshold if tag == "counting" else self.threshold
        by_class: dict[str, list[Detection]] = {}
        for det in detections:
            if det.score > cutoff:
                by_class.setdefault(det.cls, []).append(det)
        kept: dict[str, list[Detection]] = {}
        for cls, dets in by_class.items():
            queue = sorted(dets, key=lambda d: -d.score)[: self.max_objects]
            chosen: list[Detection] = []
            while queue:
                best = queue.pop(0)
                chosen.append(best)
                if self.max_overlap < 1:
                    queue = [d for d in queue if box_iou(best.box, d.box) < self.max_overlap]
            kept[cls] = chosen
        return kept

    def relative_position(self, a: Detection, b: Detection) -> set[str]:
        """Relations of A to B ("left of", "right of", "above", "below"; image y downwards).

        Centre offset per axis, shrunk towards 0 by position_threshold x (sum of the two box
        extents along that axis), normalised by the raw offset's length; a relation holds when its
        component passes 0.5. Both shrunk components < 1e-3 -> no relation (empty set).
        """
        boxes = np.asarray([a.box, b.box], dtype=np.float64).reshape(2, 2, 2)  # [obj, corner, xy]
        centre_a, centre_b = boxes.mean(axis=1)
        extent_a, extent_b = np.abs(boxes[:, 1] - boxes[:, 0])
        offset = centre_a - centre_b
        shrunk = np.maximum(np.abs(offset) - self.position_threshold * (extent_a + extent_b), 0)
        revised = shrunk * np.sign(offset)
        if np.all(np.abs(revised) < 1e-3):
            return set()
        dx, dy = revised / np.linalg.norm(offset)
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


def paired_difference(a: pd.DataFrame, b: pd.DataFrame, key: str = "sample_id") -> tuple[float, float]:
    """GenEval overall of `a` minus that of `b`, scored on the same samples, and its standard error
    with the pairing kept (two decoders on one prompt set fail on many of the same prompts, so the
    paired error is smaller than the two scores' errors combined).

    a, b: per-image frames with `key`, `tag` and `correct` (GenEvalEvaluator's per_sample), one row
    per sample, the same samples and tags in both.
    Per tag t with n_t images, d = correct_a - correct_b in {-1, 0, 1}; the overall difference is
    the unweighted mean over the T tags of mean(d) (as the overall score is), and its variance is
    sum_t var(d) / n_t / T^2 (var with n_t - 1; a tag of one image contributes none).
    """
    for name, frame in (("a", a), ("b", b)):
        missing = [c for c in (key, "tag", "correct") if c not in frame.columns]
        if missing:
            raise ValueError(f"paired_difference: frame {name} lacks columns {missing}")
        if frame[key].duplicated().any():
            raise ValueError(f"paired_difference: frame {name} has repeated {key} values")
        if frame.empty:
            raise ValueError(f"paired_difference: frame {name} has no samples")
    joined = a[[key, "tag", "correct"]].merge(b[[key, "tag", "correct"]], on=key, how="outer",
                                              suffixes=("_a", "_b"), indicator=True)
    unmatched = joined[joined["_merge"] != "both"]
    if len(unmatched):
        raise ValueError(f"paired_difference needs the same samples in both frames; {len(unmatched)} "
                         f"are in one only (e.g. {unmatched[key].iloc[0]!r}): score both decoders "
                         "on one prompt set")
    if (joined["tag_a"] != joined["tag_b"]).any():
        raise ValueError("paired_difference: a sample has different tags in the two frames")
    d = joined["correct_a"].astype(float) - joined["correct_b"].astype(float)
    means, variances = [], []
    for _, diffs in d.groupby(joined["tag_a"], sort=False):
        means.append(float(diffs.mean()))
        variances.append(float(diffs.var(ddof=1)) / len(diffs) if len(diffs) > 1 else 0.0)
    return float(np.mean(means)), math.sqrt(sum(variances)) / len(means)
