"""Mask2Former instance post-processing (shared by the HF backend) on fabricated query outputs."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evaluators.geneval_detectors import mask2former_detections, object_names


def test_post_processing_scores_masks_and_boxes() -> None:
    classes = ["cat", "dog", "cup"]
    class_logits = torch.full((3, 4), -10.0)
    class_logits[0, 1] = 10.0   # query 0: a confident dog
    class_logits[1, 2] = 0.0    # query 1: cup vs no-object, prob ~0.5
    class_logits[1, 3] = 0.0
    masks = torch.full((3, 4, 4), -5.0)
    masks[0, 0:2, 0:2] = 5.0    # dog in the top-left quarter
    masks[1, 2:4, 1:4] = 5.0
    dets = mask2former_detections(class_logits, masks, (8, 8), classes, top_k=2)
    assert [d.cls for d in dets] == ["dog", "cup"]
    dog = dets[0]
    assert dog.mask.shape == (8, 8) and dog.mask[:4, :4].sum() >= 9 and not dog.mask[5:, 5:].any()
    assert dog.box[0] == 0 and dog.box[1] == 0 and 3 <= dog.box[2] <= 5
    assert 0.9 < dog.score <= 1.0
    assert dets[1].score == pytest.approx(0.5 * float(torch.sigmoid(torch.tensor(5.0))), rel=0.1)
    with pytest.raises(ValueError, match="class names"):
        mask2former_detections(class_logits, masks, (8, 8), classes[:2])


def test_object_names_from_shared_data(shared_data: Path) -> None:
    names = object_names(str(shared_data / "geneval" / "object_names.txt"))
    assert len(names) == 80 and "computer mouse" in names and names[0] == "person"
