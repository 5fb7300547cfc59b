"""The GenEval evaluator end to end on SampleSets of shapes-world renders (64 px, CPU, no model)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import pytest

from evaluators.geneval import (PER_SAMPLE_COLUMNS, RESULT_FIELDS, RESULTS_FILE, GenEvalEvaluator,
                                ShapesBackend)
from evaluators.geneval_rules import Detection, GenEvalRules
from harness.api import METRIC_COLUMNS, Prompt
from harness.datasets.prompts import shapes
from harness.run import _build
from harness.store.samples import SampleSet, plan
from harness.shapes.scenes import render, scene_for_caption
from tests.conftest import compose_cfg

SIZE = 64
PROMPTS = shapes(24)
TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")


def classes(prompt: Prompt) -> set[str]:
    return {clause["class"] for clause in prompt.meta["include"]}


def write_set(root: Path, prompts: Sequence[Prompt], drawn: dict[int, int] | None = None) -> SampleSet:
    """One ground-truth render per prompt; prompt i shows the scene of prompt drawn[i] if given."""
    samples = SampleSet(root)
    drawn = drawn or {}
    for i, spec in enumerate(plan(prompts, images_per_prompt=1, global_seed=0)):
        source = prompts[drawn.get(i, i)]
        scene = scene_for_caption(source.meta, np.random.default_rng(spec.seed))
        samples.write(spec, render(scene, SIZE), {})
    return samples


def swap_pairs(prompts: Sequence[Prompt], pairs: int) -> dict[int, int]:
    """Greedy pairs of prompts with different tags and no class in common, swapped both ways.

    An image whose shapes share no class with its prompt meets none of its include clauses, so
    exactly the swapped images are wrong, whatever the detector and rules do with the others.
    """
    swap: dict[int, int] = {}
    for i, p in enumerate(prompts):
        if len(swap) == 2 * pairs:
            break
        if i in swap:
            continue
        for j in range(i + 1, len(prompts)):
            q = prompts[j]
            if j not in swap and p.meta["tag"] != q.meta["tag"] and not classes(p) & classes(q):
                swap[i], swap[j] = j, i
                break
    assert len(swap) == 2 * pairs, "not enough disjoint prompt pairs for the swap plan"
    return swap


def values(summary: pd.DataFrame, metric: str = "geneval") -> dict[str, float]:
    rows = summary[summary["metric"] == metric]
    return dict(zip(rows["subset"], rows["value"].astype(float)))


@pytest.fixture(scope="module")
def clean_set(tmp_path_factory: pytest.TempPathFactory) -> SampleSet:
    return write_set(tmp_path_factory.mktemp("clean"), PROMPTS)


@pytest.fixture
def evaluator() -> GenEvalEvaluator:
    return GenEvalEvaluator(ShapesBackend(), show_progress=False)


def test_ground_truth_renders_score_one(clean_set: SampleSet, evaluator: GenEvalEvaluator) -> None:
    result = evaluator.evaluate(clean_set)
    assert list(result.summary.columns) == list(METRIC_COLUMNS)
    scores = values(result.summary)
    assert scores == {**{tag: 1.0 for tag in TAGS}, "all": 1.0}
    assert values(result.summary, "geneval_images") == {"all": 1.0}
    per_sample = result.per_sample
    assert per_sample is not None and list(per_sample.columns) == list(PER_SAMPLE_COLUMNS)
    assert len(per_sample) == len(PROMPTS) and per_sample["correct"].all()
    assert (per_sample["reason"] == "").all()
    assert Counter(per_sample["tag"]) == Counter({tag: 4 for tag in TAGS})


def test_swapped_images_drop_to_the_expected_accuracy(tmp_path: Path,
                                                      evaluator: GenEvalEvaluator) -> None:
    swap = swap_pairs(PROMPTS, pairs=6)  # 12 of 24 images show another prompt's scene
    samples = write_set(tmp_path, PROMPTS, drawn=swap)
    result = evaluator.evaluate(samples)
    expected_correct = [i not in swap for i in range(len(PROMPTS))]
    assert result.per_sample is not None
    assert result.per_sample["correct"].tolist() == expected_correct
    expected = {tag: sum(ok for p, ok in zip(PROMPTS, expected_correct) if p.meta["tag"] == tag) / 4
                for tag in TAGS}
    assert len(set(expected.values())) > 1, "the swap plan should hit the tags unevenly"
    expected["all"] = sum(expected[tag] for tag in TAGS) / len(TAGS)
    scores = values(result.summary)
    assert scores.keys() == expected.keys()
    for key, value in expected.items():
        assert scores[key] == pytest.approx(value), key
    assert values(result.summary, "geneval_images")["all"] == pytest.approx(0.5)
    swapped_reasons = result.per_sample["reason"][~result.per_sample["correct"]]
    assert swapped_reasons.str.contains("expected").all()


def test_results_jsonl_has_the_official_fields(tmp_path: Path, evaluator: GenEvalEvaluator) -> None:
    swap = swap_pairs(PROMPTS, pairs=6)
    samples = write_set(tmp_path, PROMPTS, drawn=swap)
    result = evaluator.evaluate(samples)
    lines = (samples.root / RESULTS_FILE).read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(PROMPTS)
    rows = [json.loads(line) for line in lines]
    assert all(list(row) == list(RESULT_FIELDS) for row in rows)
    assert result.per_sample is not None
    assert [row["correct"] for row in rows] == result.per_sample["correct"].tolist()
    for prompt, row in zip(PROMPTS, rows):
        assert (samples.root / row["filename"]).is_file()
        assert row["tag"] == prompt.meta["tag"] and row["prompt"] == prompt.text
        metadata = json.loads(row["metadata"])
        assert metadata == prompt.meta
        assert list(metadata)[:2] == ["tag", "include"] and list(metadata)[-1] == "prompt"
        details = json.loads(row["details"])
        assert all(len(box) == 5 for boxes in details.values() for box in boxes)
        if row["correct"]:
            assert classes(prompt) <= set(details)
            assert all(0.3 < box[4] <= 1.0 for boxes in details.values() for box in boxes)
    # summary_scores.py's arithmetic on the file reproduces the evaluator's numbers
    frame = pd.read_json(samples.root / RESULTS_FILE, orient="records", lines=True)
    tasks = [group["correct"].mean() for _, group in frame.groupby("tag", sort=False)]
    assert float(np.mean(tasks)) == pytest.approx(values(result.summary)["all"])
    assert frame.groupby("metadata").ngroups == len({p.text for p in PROMPTS})
    assert not [p.name for p in samples.root.iterdir() if p.name.endswith(".tmp")]


def test_results_jsonl_can_be_switched_off(tmp_path: Path) -> None:
    samples = write_set(tmp_path, PROMPTS[:6])
    GenEvalEvaluator(ShapesBackend(), write_results_jsonl=False, show_progress=False).evaluate(samples)
    assert not (samples.root / RESULTS_FILE).exists()


def write_blank(root: Path, prompt: Prompt) -> str:
    """A one-sample set of `prompt` with a plain background image; returns its sample id."""
    spec = plan([prompt], images_per_prompt=1, global_seed=0)[0]
    SampleSet(root).write(spec, np.full((SIZE, SIZE, 3), 150, dtype=np.uint8), {})
    return spec.sample_id


def test_prompts_without_geneval_metadata_raise(tmp_path: Path, evaluator: GenEvalEvaluator) -> None:
    sample_id = write_blank(tmp_path, Prompt(id="plain/00000", text="a red circle"))
    with pytest.raises(ValueError, match="no GenEval metadata") as err:
        evaluator.evaluate(SampleSet(tmp_path))
    assert sample_id in str(err.value)
    assert "use dataset=shapes or dataset=geneval" in str(err.value)


def test_prompts_with_classes_the_detector_lacks_raise(tmp_path: Path,
                                                       evaluator: GenEvalEvaluator) -> None:
    meta = {"tag": "single_object", "include": [{"class": "dog", "count": 1}], "prompt": "a photo of a dog"}
    write_blank(tmp_path, Prompt(id="coco/00000", text="a photo of a dog", meta=meta))
    with pytest.raises(ValueError, match="'dog'"):
        evaluator.evaluate(SampleSet(tmp_path))


class CountingBackend:
    """ShapesBackend that records its batch sizes (and can drop the last image's detections)."""

    def __init__(self, drop_last: bool = False) -> None:
        self.inner = ShapesBackend()
        self.name, self.classes = self.inner.name, self.inner.classes
        self.batches: list[int] = []
        self.drop_last = drop_last

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        self.batches.append(len(images))
        out = self.inner.detect(images)
        return out[:-1] if self.drop_last else out


def test_batching_does_not_change_results(clean_set: SampleSet, evaluator: GenEvalEvaluator) -> None:
    backend = CountingBackend()
    batched = GenEvalEvaluator(backend, batch_size=5, show_progress=False).evaluate(clean_set)
    assert backend.batches == [5, 5, 5, 5, 4]
    reference = evaluator.evaluate(clean_set)
    assert batched.per_sample is not None and reference.per_sample is not None
    pd.testing.assert_frame_equal(batched.per_sample, reference.per_sample)


def test_backend_returning_too_few_lists_raises(clean_set: SampleSet) -> None:
    ev = GenEvalEvaluator(CountingBackend(drop_last=True), show_progress=False)
    with pytest.raises(ValueError, match="one list per image"):
        ev.evaluate(clean_set)


class AllWhite:
    """A colour classifier that calls everything white and records how many objects it saw."""

    name = "all-white"

    def __init__(self) -> None:
        self.seen = 0

    def classify(self, image: np.ndarray, detections: Sequence[Detection]) -> list[str]:
        assert image.shape == (SIZE, SIZE, 3)
        self.seen += len(detections)
        return ["white"] * len(detections)


def test_color_classifier_decides_the_colours(clean_set: SampleSet) -> None:
    classifier = AllWhite()
    ev = GenEvalEvaluator(ShapesBackend(), color_classifier=classifier, show_progress=False)
    result = ev.evaluate(clean_set)
    assert ev.version == "geneval-rules-2/shapes-detector-1/all-white"
    colour_clauses = [[c for c in p.meta["include"] if "color" in c] for p in PROMPTS]
    expected = [all(c["color"] == "white" for c in clauses) for clauses in colour_clauses]
    assert result.per_sample is not None
    assert result.per_sample["correct"].tolist() == expected
    assert classifier.seen == sum(c["count"] for clauses in colour_clauses for c in clauses)


def test_version_encodes_rules_options_and_backend() -> None:
    assert GenEvalEvaluator(ShapesBackend()).version == "geneval-rules-2/shapes-detector-1"
    strict = GenEvalEvaluator(ShapesBackend(min_area=0.01), threshold=0.5)
    assert strict.version == "geneval-rules-2(threshold=0.5)/shapes-detector-1(min_area=0.01)"
    with pytest.raises(ValueError, match="batch_size"):
        GenEvalEvaluator(ShapesBackend(), batch_size=0)


def test_config_composes_into_a_working_evaluator(tmp_path: Path) -> None:
    cfg = compose_cfg(["evaluator=[geneval_shapes]"])
    ev = _build(cfg.evaluator.geneval_shapes)
    assert isinstance(ev, GenEvalEvaluator) and isinstance(ev.detector, ShapesBackend)
    assert ev.name == "geneval" and ev.version == "geneval-rules-2/shapes-detector-1"
    ev.show_progress = False
    samples = write_set(tmp_path, PROMPTS[:6])
    result = ev.evaluate(samples)
    assert values(result.summary)["all"] == 1.0
    assert (samples.root / RESULTS_FILE).is_file()
    assert ev.rules == GenEvalRules() and ev.color_classifier is None  # the official options
