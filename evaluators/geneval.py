"""GenEval over a SampleSet: a detector backend -> (optional colour classifier) -> GenEval's rules.

The pipeline per image mirrors djghosh13/geneval `evaluation/evaluate_images.py`: detections are
thresholded, sorted and capped per class (`GenEvalRules.select`), the top-`count` objects of every
include clause that names a colour get a colour (from the backend, or from a `ColorClassifier`),
and `GenEvalRules.judge` decides correct / reason. Scores follow `summary_scores.py` (accuracy per
tag, overall = unweighted mean of the tags; `geneval_rules.summarize`).

Backends are small objects behind the `DetectorBackend` protocol, chosen in config by `_target_`:
`ShapesBackend` (the shapes world's colour segmentation + template fitting, which also names each
object's colour) ships here; Mask2Former (mmdet) detectors with a CLIP `ColorClassifier` plug into
the same two protocols.

Besides the harness tables, `evaluate` writes `<SampleSet root>/results.jsonl` in the official
format (one JSON object per image: filename, tag, prompt, correct, reason, metadata, details), which
the official `summary_scores.py` reads unchanged.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
import pandas as pd

from evaluators.geneval_rules import GENEVAL_COLORS, Detection, GenEvalRules, summarize
from harness.api import EvalResult
from harness.progress import Meter
from harness.shapes.captions import quoted
from harness.store.samples import SampleSet, write_atomic
from harness.shapes.detector import ShapesDetector
from harness.shapes.scenes import SHAPES

log = logging.getLogger(__name__)

RULES_VERSION = "2"  # 2: float32 thresholds, position and IoU sides; numpy-1.23 tie order (official parity)
SHAPES_DETECTOR_VERSION = "1"
RESULTS_FILE = "results.jsonl"
RESULT_FIELDS = ("filename", "tag", "prompt", "correct", "reason", "metadata", "details")
PER_SAMPLE_COLUMNS = ("sample_id", "prompt_id", "tag", "correct", "reason")
NO_METADATA_HINT = "dataset has no GenEval metadata; use dataset=shapes or dataset=geneval"
# Key order of GenEval's evaluation_metadata.jsonl, so `metadata` strings read like the official ones.
_META_ORDER = ("tag", "include", "exclude", "prompt")
_CLAUSE_ORDER = ("class", "count", "color", "position")


class DetectorBackend(Protocol):
    """An object detector feeding GenEval's rules.

    name: identifies the detector and its settings in `evaluator_version` (e.g. "shapes-detector-1").
    classes: every class name it can report (GenEval: the 80 names of object_names.txt, by index).
    """

    name: str
    classes: Sequence[str]

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        """Batched detection: images, each uint8 [H, W, 3] RGB -> per image, every detection with
        a confidence score (no GenEval threshold applied), box in that image's pixels, mask bool
        [H, W] or None, and `color` set when the backend classifies colours itself (else None)."""
        ...


class ColorClassifier(Protocol):
    """Names the colour of detected objects, for backends that leave `Detection.color` empty.

    GenEval's official classifier (not implemented here): open_clip ViT-L-14 (OpenAI weights),
    zero-shot over GENEVAL_COLORS with the templates "a photo of a {c} {cls}", "a photo of a
    {c}-colored {cls}", "a photo of a {c} object"; each object's mask is composited on a #999 canvas
    and cropped to its box. The evaluator only asks for the top-`count` objects of include clauses
    that name a colour, as evaluate_images.py does.
    """

    name: str

    def classify(self, image: np.ndarray, detections: Sequence[Detection]) -> list[str]:
        """image uint8 [H, W, 3] and its detections -> one of GENEVAL_COLORS per detection."""
        ...


class ShapesBackend:
    """`harness.shapes.detector.ShapesDetector` as a DetectorBackend (fills Detection.color).

    Args: the ShapesDetector options (min_area: smallest blob as a fraction of the image area;
    iou_floor / iou_full: template IoU at which the score is 0 / reaches 1).
    """

    classes: Sequence[str] = SHAPES

    def __init__(self, min_area: float = 0.004, iou_floor: float = 0.45, iou_full: float = 0.8) -> None:
        self.detector = ShapesDetector(min_area=min_area, iou_floor=iou_floor, iou_full=iou_full)
        options = _changed_options(self.detector, ShapesDetector())
        self.name = f"shapes-detector-{SHAPES_DETECTOR_VERSION}{options}"

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        """images, each uint8 [H, W, 3] -> detections per image (one image at a time on the CPU)."""
        return [self.detector.detect(image) for image in images]


@dataclass(frozen=True)
class ImageVerdict:
    """GenEval's outcome for one image; `details` = class -> kept boxes [x1, y1, x2, y2, score]."""

    correct: bool
    reason: str
    details: dict[str, list[list[float]]]


class GenEvalEvaluator:
    """GenEval accuracy of a SampleSet whose prompts carry GenEval metadata.

    Args:
        detector: the DetectorBackend (shapes world: ShapesBackend).
        name: evaluator name (the `evaluator` column, per_sample/<decoder>/<name>.csv).
        threshold, counting_threshold, max_objects, max_overlap, position_threshold: GenEval's
            `--options`, official defaults (see GenEvalRules).
        color_classifier: names object colours when the detector does not (None: the detector must).
        write_results_jsonl: also write `<SampleSet root>/results.jsonl` in the official format.
        batch_size: images per `detector.detect` call.
        show_progress: progress (a bar on a terminal, a log line a minute otherwise; harness/progress.py).
    """

    def __init__(
        self,
        detector: DetectorBackend,
        name: str = "geneval",
        threshold: float = 0.3,
        counting_threshold: float = 0.9,
        max_objects: int = 16,
        max_overlap: float = 1.0,
        position_threshold: float = 0.1,
        color_classifier: ColorClassifier | None = None,
        write_results_jsonl: bool = True,
        batch_size: int = 32,
        show_progress: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"geneval batch_size must be >= 1, got {batch_size}")
        self.detector = detector
        self.name = name
        self.rules = GenEvalRules(threshold=threshold, counting_threshold=counting_threshold,
                                  max_objects=max_objects, max_overlap=max_overlap,
                                  position_threshold=position_threshold)
        self.color_classifier = color_classifier
        self.write_results_jsonl = write_results_jsonl
        self.batch_size = batch_size
        self.show_progress = show_progress

    def check(self) -> None:
        """Before generation (harness/run.py): what the detector and colour classifier import."""
        for part in (self.detector, self.color_classifier):
            if hasattr(part, "check"):
                part.check()

    def assets(self) -> list:
        """What scoring downloads (harness/assets): the detector's and the colour classifier's files."""
        parts = (self.detector, self.color_classifier)
        return [asset for part in parts if hasattr(part, "assets") for asset in part.assets()]

    @property
    def version(self) -> str:
        """Rules version and non-default options / detector name [+ colour classifier name],
        e.g. "geneval-rules-1/shapes-detector-1" or "geneval-rules-1(threshold=0.5)/...".
        """
        rules = f"geneval-rules-{RULES_VERSION}{_changed_options(self.rules, GenEvalRules())}"
        parts = [rules, self.detector.name]
        if self.color_classifier is not None:
            parts.append(self.color_classifier.name)
        return "/".join(parts)

    def evaluate(self, samples: SampleSet) -> EvalResult:
        """Score every complete sample of `samples`.

        Returns: summary rows `geneval` per tag and "all" (mean of tags), `geneval_images`,
        `geneval_prompts`; per_sample with PER_SAMPLE_COLUMNS, one row per image.
        """
        records = samples.records()
        if records.empty:
            raise ValueError(f"{samples} has no complete samples; run the generate stage first")
        metas = [geneval_metadata(row) for row in records.itertuples(index=False)]
        self._check_classes(metas)
        verdicts: list[ImageVerdict] = []
        ids = records["sample_id"].tolist()
        with Meter(len(ids), self.name, "images", enabled=self.show_progress) as bar:
            for start in range(0, len(ids), self.batch_size):
                stop = start + self.batch_size
                verdicts += self._judge_batch(samples, ids[start:stop], metas[start:stop])
                bar.update(len(ids[start:stop]))
        per_sample = pd.DataFrame({
            "sample_id": ids,
            "prompt_id": records["prompt_id"].tolist(),
            "tag": [meta["tag"] for meta in metas],
            "correct": [v.correct for v in verdicts],
            "reason": [v.reason for v in verdicts],
        }, columns=list(PER_SAMPLE_COLUMNS))
        summary = summarize(per_sample)
        if self.write_results_jsonl:
            write_results_jsonl(samples.root / RESULTS_FILE, records["path"].tolist(), metas, verdicts)
        overall = summary[(summary["metric"] == "geneval") & (summary["subset"] == "all")]["value"]
        log.info("%s: GenEval overall %.4f over %d images (%s)", samples, float(overall.iloc[0]),
                 len(ids), self.version)
        return EvalResult(summary=summary, per_sample=per_sample)

    def _check_classes(self, metas: Sequence[dict[str, Any]]) -> None:
        """Raise ValueError when prompts ask for classes the detector cannot report."""
        known = set(self.detector.classes)
        asked = {c["class"] for m in metas for c in [*m["include"], *m.get("exclude", [])]}
        unknown = sorted(asked - known)
        if unknown:
            raise ValueError(
                f"the prompts ask for classes {unknown[:10]} that detector {self.detector.name} "
                f"cannot detect (it knows {sorted(known)[:10]}...); pair dataset=shapes with "
                "evaluator=geneval_shapes, and real GenEval prompts with a COCO detector backend"
            )

    def _judge_batch(self, samples: SampleSet, ids: Sequence[str],
                     metas: Sequence[dict[str, Any]]) -> list[ImageVerdict]:
        """Load, detect and judge one batch of samples."""
        return self.judge_images([samples.load_image(sample_id) for sample_id in ids], metas, ids)

    def judge_images(self, images: Sequence[np.ndarray], metas: Sequence[dict[str, Any]],
                     names: Sequence[str] | None = None) -> list[ImageVerdict]:
        """Images in memory (uint8 [H, W, 3]) with their GenEval metadata -> one verdict each:
        detect, keep by the rules' thresholds, judge. `names` label errors (default: positions)."""
        batch = self.detector.detect(list(images))
        if len(batch) != len(images):
            raise ValueError(
                f"detector {self.detector.name} returned {len(batch)} detection lists for "
                f"{len(images)} images; detect() must return one list per image, in order"
            )
        labels = list(names) if names is not None else [str(i) for i in range(len(images))]
        verdicts = []
        for label, image, detections, meta in zip(labels, images, batch, metas, strict=True):
            try:
                verdicts.append(self._judge(image, detections, meta))
            except ValueError as exc:
                raise ValueError(f"sample {label}: {exc}") from exc
        return verdicts

    def _judge(self, image: np.ndarray, detections: list[Detection],
               meta: dict[str, Any]) -> ImageVerdict:
        """One image: image uint8 [H, W, 3] + raw detections + metadata -> verdict."""
        objects = self.rules.select(detections, meta["tag"])
        if self.color_classifier is not None:
            objects = self._with_colors(image, objects, meta)
        correct, reason = self.rules.judge(objects, meta)
        details = {cls: [[*map(float, d.box), float(d.score)] for d in dets]
                   for cls, dets in objects.items()}
        return ImageVerdict(correct=bool(correct), reason=reason, details=details)

    def _with_colors(self, image: np.ndarray, objects: dict[str, list[Detection]],
                     meta: dict[str, Any]) -> dict[str, list[Detection]]:
        """Copies of `objects` whose colour-checked ones (top-`count` of include clauses with a
        colour) carry the colour classifier's answer."""
        assert self.color_classifier is not None
        wanted = {id(d): d for c in meta["include"] if "color" in c
                  for d in objects.get(c["class"], [])[: c["count"]]}
        if not wanted:
            return objects
        targets = list(wanted.values())
        colors = list(self.color_classifier.classify(image, targets))
        bad = [c for c in colors if c not in GENEVAL_COLORS]
        if len(colors) != len(targets) or bad:
            raise ValueError(
                f"colour classifier {self.color_classifier.name} returned {colors} for "
                f"{len(targets)} objects; it must return one of {GENEVAL_COLORS} per detection"
            )
        named = dict(zip(wanted, colors, strict=True))
        return {cls: [dataclasses.replace(d, color=named[id(d)]) if id(d) in named else d for d in dets]
                for cls, dets in objects.items()}


def geneval_metadata(record: Any) -> dict[str, Any]:
    """A SampleSet records() row -> its GenEval metadata (official key order, `prompt` filled in).

    Raises:
        ValueError: naming the sample, when the prompt meta lacks `tag` / `include` or is malformed.
    """
    meta = json.loads(record.meta) if isinstance(record.meta, str) else dict(record.meta or {})
    where = f"sample {record.sample_id} (prompt {record.prompt_id!r}: {quoted(record.prompt)})"
    if not isinstance(meta.get("tag"), str) or "include" not in meta:
        raise ValueError(f"{where} has no GenEval metadata (its prompt meta needs 'tag' and "
                         f"'include', has {sorted(meta)}): {NO_METADATA_HINT}")
    clauses = [*_clauses(meta, "include", where), *_clauses(meta, "exclude", where)]
    for clause in clauses:
        if not (isinstance(clause, dict) and isinstance(clause.get("class"), str)
                and isinstance(clause.get("count"), int)):
            raise ValueError(f"{where} has malformed GenEval metadata: clause {clause!r} needs a "
                             "string 'class' and an integer 'count' (evaluation_metadata.jsonl format)")
    meta.setdefault("prompt", record.prompt)
    ordered = _ordered(meta, _META_ORDER)
    for key in ("include", "exclude"):
        if key in ordered:
            ordered[key] = [_ordered(clause, _CLAUSE_ORDER) for clause in ordered[key]]
    return ordered


def write_results_jsonl(path: Path, filenames: Sequence[str], metas: Sequence[dict[str, Any]],
                        verdicts: Sequence[ImageVerdict]) -> None:
    """Atomically write GenEval's results.jsonl: one object per image with RESULT_FIELDS
    (`metadata` and `details` are JSON strings, as evaluate_images.py writes them)."""
    lines = []
    for filename, meta, verdict in zip(filenames, metas, verdicts, strict=True):
        row = {"filename": filename, "tag": meta["tag"], "prompt": meta["prompt"],
               "correct": verdict.correct, "reason": verdict.reason,
               "metadata": json.dumps(meta), "details": json.dumps(verdict.details)}
        lines.append(json.dumps(row) + "\n")
    write_atomic(path, "".join(lines).encode("utf-8"))
    log.info("wrote %d GenEval results to %s (official format; summary_scores.py reads it)",
             len(lines), path)


def _clauses(meta: dict[str, Any], key: str, where: str) -> list[Any]:
    """meta[key] as a list of clauses, or ValueError (naming `where`) when it is not a list."""
    value = meta.get(key, [])
    if not isinstance(value, list):
        raise ValueError(f"{where} has malformed GenEval metadata: {key!r} must be a list of "
                         f"clauses, got {value!r}")
    return value


def _ordered(mapping: dict[str, Any], first: Sequence[str]) -> dict[str, Any]:
    """`mapping` with the keys `first` (those present) leading, the rest sorted after them."""
    keys = [k for k in first if k in mapping] + sorted(k for k in mapping if k not in first)
    return {k: mapping[k] for k in keys}


def _changed_options(options: Any, defaults: Any) -> str:
    """"(key=value,...)" for the dataclass fields of `options` that differ from `defaults`, or ""."""
    changed = [f"{f.name}={getattr(options, f.name)}" for f in dataclasses.fields(options)
               if getattr(options, f.name) != getattr(defaults, f.name)]
    return f"({','.join(changed)})" if changed else ""
